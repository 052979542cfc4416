package instances

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// startSleep starts a process that runs until it is killed, and returns
// it identified as the runtimes identify theirs.
func startSleep(t *testing.T) (Proc, *exec.Cmd) {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Skipf("no sleep binary: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	start, state, err := Stat(cmd.Process.Pid)
	if err != nil || state == 'Z' {
		t.Fatalf("Stat of a running process: %d %c %v", start, state, err)
	}
	return Proc{PID: cmd.Process.Pid, Start: start}, cmd
}

func TestProcWaitsForItsExit(t *testing.T) {
	p, cmd := startSleep(t)
	if !p.Alive() {
		t.Fatal("a running process is not alive")
	}
	if other := (Proc{PID: p.PID, Start: p.Start + 1}); other.Alive() {
		t.Error("a process with another start time is taken for the running one")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := p.Wait(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Wait on a running process = %v, want the context's deadline", err)
	}
	// The process is this test's child: reap it, so that it is gone
	// rather than a zombie, as the runtimes' processes are (someone else
	// reaps those).
	go func() { _ = cmd.Wait() }()
	if err := p.Kill(context.Background()); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	if p.Alive() {
		t.Error("a killed process is alive")
	}
	if err := p.Signal(syscall.SIGTERM); !errors.Is(err, ErrGone) {
		t.Errorf("Signal to an exited process = %v, want ErrGone", err)
	}
	if err := p.Wait(context.Background()); err != nil {
		t.Errorf("Wait on an exited process = %v", err)
	}
	if err := p.Kill(context.Background()); err != nil {
		t.Errorf("Kill of an exited process = %v", err)
	}
}

func TestStatOfNoProcess(t *testing.T) {
	if _, _, err := Stat(0); err == nil {
		t.Error("Stat(0) succeeded")
	}
	if (Proc{}).Alive() {
		t.Error("the zero Proc is alive")
	}
}

func TestReadPidFile(t *testing.T) {
	dir := t.TempDir()
	name := filepath.Join(dir, "pid")
	if _, err := ReadPidFile(name); err == nil || !strings.Contains(err.Error(), "no pid file") {
		t.Errorf("missing pid file: %v", err)
	}
	for text, want := range map[string]int{"42\n": 42, "0": 0, "x": 0, "-3": 0} {
		if err := os.WriteFile(name, []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
		pid, err := ReadPidFile(name)
		if pid != want || (want == 0) != (err != nil) {
			t.Errorf("pid file %q: %d, %v; want %d", text, pid, err, want)
		}
	}
}

func TestReadTailAndWriteFileAtomic(t *testing.T) {
	name := filepath.Join(t.TempDir(), "sub", "log")
	if got := ReadTail(name, 8); got != "" {
		t.Errorf("tail of a missing file = %q", got)
	}
	// The tail is valid UTF-8 even where it starts inside a character.
	if err := WriteFileAtomic(name, []byte("héllo wörld \xff\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, want := ReadTail(name, 7), "\uFFFDrld \uFFFD"; got != want {
		t.Errorf("ReadTail = %q, want %q", got, want)
	}
	if entries, _ := os.ReadDir(filepath.Dir(name)); len(entries) != 1 {
		t.Errorf("WriteFileAtomic left %d files, want 1", len(entries))
	}
}
