package nvidia

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/gpu"
)

// processGroup starts a shell with two children in a new process group.
func processGroup(t *testing.T) (pgid int, done <-chan struct{}) {
	t.Helper()
	cmd := exec.Command("sh", "-c", "sleep 60 & sleep 60 & wait")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ch := make(chan struct{})
	go func() { _ = cmd.Wait(); close(ch) }()
	t.Cleanup(func() { _ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL); <-ch })
	return cmd.Process.Pid, ch
}

// TestSignalFreezeOfAProcessGroup: a "pgid:N" group is listed, frozen
// (every process stopped), thawed and killed.
func TestSignalFreezeOfAProcessGroup(t *testing.T) {
	h, err := New(Config{NoNVML: true})
	if err != nil {
		t.Fatal(err)
	}
	pgid, done := processGroup(t)
	group := "pgid:" + strconv.Itoa(pgid)
	ctx := context.Background()
	var pids []int
	waitFor(t, func() bool { pids, _ = h.Processes(ctx, group); return len(pids) == 3 })
	if err := h.Freeze(ctx, group); err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		if !stopped("/proc", pid) {
			t.Fatalf("process %d runs after the freeze", pid)
		}
	}
	if err := h.Thaw(ctx, group); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		for _, pid := range pids {
			if stopped("/proc", pid) {
				return false
			}
		}
		return true
	})
	if err := h.Freeze(ctx, group); err != nil {
		t.Fatal(err)
	}
	if err := h.Kill(ctx, group, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("the frozen group survived the kill")
	}
}

// TestKillContinuesAStoppedProcessBeforeSIGTERM: a stopped process gets
// SIGCONT before SIGTERM, so its TERM handler runs (the graceful path
// lands) instead of waiting for SIGKILL.
func TestKillContinuesAStoppedProcessBeforeSIGTERM(t *testing.T) {
	dir := t.TempDir()
	mark, ready := filepath.Join(dir, "term"), filepath.Join(dir, "ready")
	cmd := exec.Command("sh", "-c", fmt.Sprintf(`trap 'echo graceful > %s; exit 0' TERM; touch %s; while :; do sleep 0.05; done`, mark, ready))
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	defer func() { _ = cmd.Process.Kill(); <-done }()
	pid := cmd.Process.Pid
	waitFor(t, func() bool { _, err := os.Stat(ready); return err == nil }) // the trap is set
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return stopped("/proc", pid) })
	if err := killPIDs(context.Background(), "/proc", func() []int { return []int{pid} }, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	<-done
	b, err := os.ReadFile(mark)
	if err != nil || strings.TrimSpace(string(b)) != "graceful" {
		t.Fatalf("the TERM handler did not run: %q, %v", b, err)
	}
}

// TestCgroupFreezer freezes a real cgroup (v1 freezer or v2) when the
// test may create one; a process in a frozen cgroup is never
// checkpointed.
func TestCgroupFreezer(t *testing.T) {
	h, err := New(Config{NoNVML: true})
	if err != nil {
		t.Fatal(err)
	}
	h.run = (&fakeTool{state: cudaRunning, help: help570}).run
	group := fmt.Sprintf("torpor-gputest-%d", os.Getpid())
	dir, err := h.cgroupDir(group)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Skipf("cannot create a cgroup here: %v", err)
	}
	defer func() { _ = syscall.Rmdir(dir) }()
	cmd := sleeper(t)
	if err := os.WriteFile(filepath.Join(dir, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
		t.Skipf("cannot move a process into the cgroup: %v", err)
	}
	ctx := context.Background()
	if pids, err := h.Processes(ctx, group); err != nil || len(pids) != 1 || pids[0] != cmd.Process.Pid {
		t.Fatalf("processes = %v, %v", pids, err)
	}
	if err := h.Freeze(ctx, group); err != nil {
		t.Fatal(err)
	}
	if !h.inFrozenCgroup(cmd.Process.Pid) {
		t.Fatal("the process's cgroup does not read frozen")
	}
	if err := h.Checkpoint(ctx, cmd.Process.Pid); err == nil || !strings.Contains(err.Error(), "frozen") {
		t.Fatalf("checkpoint in a frozen cgroup = %v", err)
	}
	if err := h.Thaw(ctx, group); err != nil {
		t.Fatal(err)
	}
	if h.inFrozenCgroup(cmd.Process.Pid) {
		t.Fatal("still frozen after the thaw")
	}
	if err := h.Freeze(ctx, group); err != nil {
		t.Fatal(err)
	}
	if err := h.Kill(ctx, group, 5*time.Second); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { pids, _ := h.Processes(ctx, group); return len(pids) == 0 })
	if pids, _ := h.Processes(ctx, "torpor-gputest-gone"); len(pids) != 0 {
		t.Fatalf("a gone group lists %v", pids)
	}
	if err := h.Thaw(ctx, "torpor-gputest-gone"); err != nil {
		t.Fatalf("thaw of a gone group = %v", err)
	}
}

// TestFileWorkerProtocol: a reserve is written for the worker, and its
// answer for that request (not an older one) completes it.
func TestFileWorkerProtocol(t *testing.T) {
	dir := t.TempDir()
	w := FileWorker{Dir: dir, Timeout: 10 * time.Second}
	answer := func(verdict string) {
		for {
			b, err := os.ReadFile(filepath.Join(dir, "a", "reserve"))
			if err == nil {
				f := strings.Fields(string(b))
				_ = os.WriteFile(filepath.Join(dir, "a", "reserved"), []byte("1 ok\n"), 0o644) // stale
				_ = os.WriteFile(filepath.Join(dir, "a", "reserved"), []byte(f[0]+" "+verdict+"\n"), 0o644)
				_ = os.Remove(filepath.Join(dir, "a", "reserve"))
				return
			}
			time.Sleep(time.Millisecond)
		}
	}
	go answer("ok 512")
	if err := w.Reserve(context.Background(), gpu.Target{LeaseID: "a"}, 512); err != nil {
		t.Fatal(err)
	}
	go answer("oom cuMemAlloc")
	if err := w.Reserve(context.Background(), gpu.Target{LeaseID: "a"}, 1<<20); err == nil || !strings.Contains(err.Error(), "out of GPU memory") {
		t.Fatalf("reserve = %v, want out of memory", err)
	}
	if err := w.Reserve(context.Background(), gpu.Target{LeaseID: "../x"}, 1); err == nil {
		t.Fatal("accepted a lease id with a slash")
	}
}
