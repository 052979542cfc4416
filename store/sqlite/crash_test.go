//go:build unix

package sqlite_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/store/sqlite"
)

// crashEnv names the database the crash helper writes to.
const crashEnv = "TORPOR_SQLITE_CRASH_DB"

// What was committed survives the process being killed without Close:
// the reopened store recovers it from the WAL.
func TestCommittedSurvivesKill(t *testing.T) {
	path := filepath.Join(t.TempDir(), "torpor.db")
	cmd := exec.CommandContext(t.Context(), os.Args[0])
	cmd.Env = append(os.Environ(), crashEnv+"="+path)
	out, err := cmd.CombinedOutput()
	if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); !ok || !ws.Signaled() || ws.Signal() != syscall.SIGKILL {
		t.Fatalf("helper did not die by SIGKILL: %v\n%s", err, out)
	}

	s := open(t, path)
	defer s.Close()
	sb, err := s.GetSandbox(t.Context(), "sb_crash")
	if err != nil {
		t.Fatalf("GetSandbox after the crash: %v", err)
	}
	if sb.Version != 11 || sb.Boots != 10 {
		t.Errorf("after the crash: version %d, boots %d; want 11 and 10", sb.Version, sb.Boots)
	}
	evs, err := s.ListEvents(t.Context(), torpor.EventFilter{})
	if err != nil || len(evs) != 11 {
		t.Errorf("after the crash: %d events (%v), want 11", len(evs), err)
	}
}

// TestMain turns the test binary into the crash helper when
// TestCommittedSurvivesKill runs it as a child.
func TestMain(m *testing.M) {
	if path := os.Getenv(crashEnv); path != "" {
		commitThenDie(path)
	}
	os.Exit(m.Run())
}

// commitThenDie commits a create and ten updates, then kills the process
// before the store is closed.
func commitThenDie(path string) {
	ctx := context.Background()
	s, err := sqlite.Open(ctx, path)
	if err != nil {
		panic(err)
	}
	sb := &torpor.Sandbox{ID: "sb_crash", Tenant: "acme", State: torpor.StateRunning}
	ev := torpor.Event{Type: torpor.EventStateChange, SandboxID: sb.ID, Tenant: sb.Tenant}
	if err := s.CreateSandbox(ctx, sb, ev); err != nil {
		panic(err)
	}
	for range 10 {
		sb.Boots++
		if err := s.UpdateSandbox(ctx, sb, ev); err != nil {
			panic(err)
		}
	}
	syscall.Kill(os.Getpid(), syscall.SIGKILL)
	select {}
}
