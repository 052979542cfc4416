package vm

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

// safety bounds every step so that a hung VM fails the test; it is no
// performance assertion.
const safety = 90 * time.Second

func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), safety)
	t.Cleanup(cancel)
	return ctx
}

// sh runs a script in the sandbox and returns its stdout, failing the
// test unless it exits 0.
func sh(t *testing.T, r torpor.Runtime, ref torpor.InstanceRef, script string) string {
	t.Helper()
	var out, errb bytes.Buffer
	res, err := r.Exec(testCtx(t), ref, torpor.ExecRequest{Cmd: []string{"/bin/sh", "-c", script}, Stdout: &out, Stderr: &errb})
	if err != nil {
		t.Fatalf("sh -c %q: %v", script, err)
	}
	if res.ExitCode != 0 {
		t.Fatalf("sh -c %q: exit %d, stderr %q", script, res.ExitCode, errb.String())
	}
	return out.String()
}

func counter(t *testing.T, r torpor.Runtime, ref torpor.InstanceRef) int {
	t.Helper()
	n, err := strconv.Atoi(strings.TrimSpace(sh(t, r, ref, "cat /tmp/counter")))
	if err != nil {
		t.Fatalf("counter: %v", err)
	}
	return n
}

// qemuHolds reports whether any process has one of the sandbox's files
// open (its disk, its memory file): a QEMU still running for it.
func qemuHolds(dir string) []string {
	var pids []string
	procs, _ := os.ReadDir("/proc")
	for _, p := range procs {
		if _, err := strconv.Atoi(p.Name()); err != nil {
			continue
		}
		fds, _ := os.ReadDir(filepath.Join("/proc", p.Name(), "fd"))
		for _, fd := range fds {
			if l, err := os.Readlink(filepath.Join("/proc", p.Name(), "fd", fd.Name())); err == nil && strings.HasPrefix(l, dir+"/") {
				pids = append(pids, p.Name()+":"+l)
				break
			}
		}
	}
	return pids
}

// TestSnapshot takes one VM per memory mode through the snapshot life:
// a counting process and a checksum of data held only in guest memory
// survive snapshot and restore (by a new Runtime, as after a daemon
// restart) and a second cycle; while snapshotted no process holds the
// VM's files and Inspect says missing with a disk; hibernating a
// snapshotted sandbox keeps its files; a corrupt or missing snapshot is
// FailureSnapshot with the disk kept; Destroy removes disk and snapshot.
func TestSnapshot(t *testing.T) {
	needHost(t)
	tmpl := baseTemplate(t)
	for _, lazy := range []bool{false, true} {
		name := "Eager"
		if lazy {
			name = "Lazy"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			cfg := testConfig(t)
			cfg.LazyMemory = lazy
			testSnapshotLife(t, cfg, tmpl)
		})
	}
}

func testSnapshotLife(t *testing.T, cfg Config, tmpl torpor.Template) {
	rt := newRuntime(t, cfg)
	ctx := testCtx(t)
	spec := torpor.BootSpec{SandboxID: torpor.NewID("rt_", 12), Template: tmpl,
		Resources: torpor.Resources{VCPUs: 1, MemoryMiB: 256}, Hostname: "snap"}
	h, err := rt.Boot(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	ref := torpor.InstanceRef{SandboxID: spec.SandboxID, Handle: h}
	dir := rt.sandboxDir(ref.SandboxID)

	// 32 MiB of random bytes in tmpfs live only in the guest's memory.
	pid := strings.TrimSpace(sh(t, rt, ref, `
		dd if=/dev/urandom of=/dev/shm/blob bs=1M count=32 2>/dev/null
		i=0
		while :; do i=$((i+1)); echo $i > /tmp/counter.new; mv /tmp/counter.new /tmp/counter; sleep 0.02; done </dev/null >/dev/null 2>&1 &
		echo $!`))
	sum := sh(t, rt, ref, "md5sum /dev/shm/blob")
	// An interpreter of the code server keeps its state across snapshots.
	if _, err := rt.RunCode(ctx, ref, torpor.CodeRequest{Language: torpor.LanguageShell, Code: "x=41"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the counter to start", func() bool {
		return sh(t, rt, ref, "test -s /tmp/counter && echo y || echo n") == "y\n"
	})

	for cycle := 1; cycle <= 2; cycle++ {
		c1 := counter(t, rt, ref)
		in, _ := rt.loadInstance(ref.SandboxID)
		info, err := rt.Snapshot(ctx, ref)
		if err != nil {
			t.Fatalf("cycle %d: snapshot: %v", cycle, err)
		}
		if info.Path == "" || info.SizeBytes <= 0 {
			t.Errorf("cycle %d: snapshot info %+v", cycle, info)
		}
		if !cfg.LazyMemory && info.SizeBytes < 32<<20 {
			t.Errorf("cycle %d: an eager snapshot of 32 MiB of random data takes %d bytes", cycle, info.SizeBytes)
		}
		st, err := rt.Inspect(ctx, ref)
		if err != nil || st.State != torpor.InstanceMissing || !st.DiskExists {
			t.Fatalf("cycle %d: after snapshot: %+v, %v; want missing with a disk", cycle, st, err)
		}
		if in == nil || in.Alive() {
			t.Errorf("cycle %d: QEMU %+v still runs while snapshotted", cycle, in)
		}
		if held := qemuHolds(dir); len(held) > 0 {
			t.Errorf("cycle %d: processes hold the sandbox's files while snapshotted: %v", cycle, held)
		}
		_, err = rt.Exec(ctx, ref, torpor.ExecRequest{Cmd: []string{"true"}})
		if !torpor.IsCode(err, torpor.ENotFound) {
			t.Errorf("cycle %d: exec while snapshotted: %v, want not_found", cycle, err)
		}
		// Again: the snapshot is kept, not redone.
		if again, err := rt.Snapshot(ctx, ref); err != nil || again.Path != info.Path {
			t.Errorf("cycle %d: snapshot of a snapshotted sandbox: %+v, %v", cycle, again, err)
		}

		if cycle == 1 {
			time.Sleep(3 * time.Second) // long enough for a stale clock to show
		}
		// A new Runtime over the same directory, as after a restart.
		rt = newRuntime(t, cfg)
		if ref.Handle, err = rt.Restore(ctx, ref); err != nil {
			t.Fatalf("cycle %d: restore: %v", cycle, err)
		}
		if st, err := rt.Inspect(ctx, ref); err != nil || st.State != torpor.InstanceRunning {
			t.Fatalf("cycle %d: after restore: %+v, %v", cycle, st, err)
		}
		c2 := counter(t, rt, ref)
		if c2 < c1 {
			t.Errorf("cycle %d: counter went back from %d to %d: the loop restarted", cycle, c1, c2)
		}
		waitFor(t, "the counter to advance", func() bool { return counter(t, rt, ref) > c2 })
		sh(t, rt, ref, "kill -0 "+pid)
		if guest, err := strconv.ParseInt(strings.TrimSpace(sh(t, rt, ref, "date +%s")), 10, 64); err != nil || abs(guest-time.Now().Unix()) > 2 {
			t.Errorf("cycle %d: the guest's clock says %d (%v), the host's %d", cycle, guest, err, time.Now().Unix())
		}
		if got := sh(t, rt, ref, "md5sum /dev/shm/blob"); got != sum {
			t.Errorf("cycle %d: memory checksum %q, want %q", cycle, got, sum)
		}
		if res, err := rt.RunCode(ctx, ref, torpor.CodeRequest{Language: torpor.LanguageShell, Code: "echo $((x+1))"}); err != nil || res.Stdout != "42\n" {
			t.Errorf("cycle %d: the interpreter after restore: %+v, %v", cycle, res, err)
		}
	}

	// Hibernate from a snapshot: files written before it are kept.
	sh(t, rt, ref, "echo kept > /root/data")
	if _, err := rt.Snapshot(ctx, ref); err != nil {
		t.Fatal(err)
	}
	if err := rt.Stop(ctx, ref); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(rt.snapshotDir(ref.SandboxID)); err == nil {
		t.Error("Stop kept the snapshot")
	}
	if ref.Handle, err = rt.Boot(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if got := sh(t, rt, ref, "cat /root/data"); got != "kept\n" {
		t.Errorf("file after snapshot, stop and boot: %q", got)
	}

	// A corrupt snapshot cannot be restored; the disk stays and boots.
	if _, err := rt.Snapshot(ctx, ref); err != nil {
		t.Fatal(err)
	}
	state := filepath.Join(rt.snapshotDir(ref.SandboxID), stateFile)
	if err := os.WriteFile(state, bytes.Repeat([]byte("garbage!"), 512), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err = rt.Restore(ctx, ref)
	var te *torpor.Error
	if !errors.As(err, &te) || te.Reason != torpor.FailureSnapshot {
		t.Fatalf("restore of a corrupt snapshot: %v, want reason %s", err, torpor.FailureSnapshot)
	}
	if st, err := rt.Inspect(ctx, ref); err != nil || st.State != torpor.InstanceMissing || !st.DiskExists {
		t.Errorf("after a failed restore: %+v, %v; want missing with a disk", st, err)
	}
	if held := qemuHolds(dir); len(held) > 0 {
		t.Errorf("a failed restore left processes: %v", held)
	}
	if ref.Handle, err = rt.Boot(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if got := sh(t, rt, ref, "cat /root/data"); got != "kept\n" {
		t.Errorf("file after a failed restore and boot: %q", got)
	}
	// No snapshot at all: the same reason.
	if err := rt.Stop(ctx, ref); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Restore(ctx, ref); !errors.As(err, &te) || te.Reason != torpor.FailureSnapshot {
		t.Errorf("restore without a snapshot: %v", err)
	}

	// Destroy of a snapshotted sandbox removes disk and snapshot.
	if ref.Handle, err = rt.Boot(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if _, err := rt.Snapshot(ctx, ref); err != nil {
		t.Fatal(err)
	}
	if err := rt.Destroy(ctx, ref); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("Destroy left %s: %v", dir, err)
	}
	if st, err := rt.Inspect(ctx, ref); err != nil || st.State != torpor.InstanceMissing || st.DiskExists {
		t.Errorf("after destroy: %+v, %v", st, err)
	}
}

// waitFor polls cond until it holds or the safety bound passes.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(safety)
	for delay := time.Millisecond; !cond(); delay = min(2*delay, 100*time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(delay)
	}
}

func abs(n int64) int64 {
	if n < 0 {
		return -n
	}
	return n
}
