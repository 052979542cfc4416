package nvidia

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/gpu"
)

// TestHostBuildsAndStartsWithoutAGPU: without the NVIDIA library the
// host still constructs; NVML says why it is off, and the probe fails
// with an error naming what each source said.
func TestHostBuildsAndStartsWithoutAGPU(t *testing.T) {
	if _, err := os.Stat("/dev/nvidiactl"); err == nil {
		t.Skip("this machine has an NVIDIA driver")
	}
	h, err := New(Config{SMIBin: "nvidia-smi-not-here"})
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if !errors.Is(h.NVMLError(), ErrNoNVML) {
		t.Fatalf("NVMLError = %v", h.NVMLError())
	}
	if msg := h.NVMLError().Error(); !strings.Contains(msg, "libnvidia-ml.so.1") && !strings.Contains(msg, "cgo") {
		t.Fatalf("NVMLError %q does not say what is missing", msg)
	}
	_, err = h.Usage(context.Background())
	if !errors.Is(err, gpu.ErrProbeUnavailable) || !strings.Contains(err.Error(), "nvidia-smi-not-here") {
		t.Fatalf("Usage = %v", err)
	}
	if h.ProbeSource() != "nvidia-smi" {
		t.Fatalf("probe source = %s", h.ProbeSource())
	}
}

func TestNewRefusesAnUnknownFreezer(t *testing.T) {
	if _, err := New(Config{Freezer: "docker"}); err == nil {
		t.Fatal("accepted")
	}
}

// fakeTool records cuda-checkpoint calls and answers from a script.
type fakeTool struct {
	mu     sync.Mutex
	calls  []string
	state  string
	help   string
	failOn map[string]string // action -> output of a failure
}

func (f *fakeTool) run(ctx context.Context, name string, args ...string) ([]byte, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	call := strings.Join(args, " ")
	if args[0] == "--help" {
		return []byte(f.help), nil
	}
	if args[0] == "--get-state" {
		return []byte(f.state + "\n"), nil
	}
	f.calls = append(f.calls, call)
	action := args[0]
	if action == "--action" {
		action = args[1]
	}
	if out, ok := f.failOn[action]; ok {
		return []byte(out), fmt.Errorf("cuda-checkpoint %s: exit status 1: %s", call, out)
	}
	switch action {
	case "--toggle":
		if f.state == cudaRunning {
			f.state = cudaCheckpointed
		} else {
			f.state = cudaRunning
		}
	case "lock":
		f.state = cudaLocked
	case "checkpoint":
		f.state = cudaCheckpointed
	case "restore":
		f.state = cudaLocked
	case "unlock":
		f.state = cudaRunning
	}
	return nil, nil
}

const help570 = "Operations:\n--get-state --pid <pid>\n--action lock | checkpoint | restore | unlock --pid <pid> [--timeout <ms>]\n--toggle --pid <pid>\n"
const help550 = "Operations:\n--toggle --pid <pid>\n--get-restore-tid --pid <pid>\n"

// sleeper starts a process to stand in for a CUDA worker.
func sleeper(t *testing.T) *exec.Cmd {
	t.Helper()
	cmd := exec.Command("sleep", "60")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	t.Cleanup(func() { _ = cmd.Process.Kill(); <-done })
	return cmd
}

func testHost(t *testing.T, tool *fakeTool) *Host {
	h, err := New(Config{NoNVML: true})
	if err != nil {
		t.Fatal(err)
	}
	h.run = tool.run
	return h
}

// TestCheckpointUsesCudaCheckpointOnThePidOnly: with driver 570's
// actions, a checkpoint locks (with a timeout) then checkpoints, and a
// restore restores then unlocks; with 550 both toggle. Each acts on the
// given pid only.
func TestCheckpointUsesCudaCheckpointOnThePidOnly(t *testing.T) {
	cases := []struct {
		name        string
		help        string
		wantCkpt    []string
		wantRestore []string
	}{
		{"actions (570+)", help570,
			[]string{"--action lock --pid P --timeout 10000", "--action checkpoint --pid P"},
			[]string{"--action restore --pid P", "--action unlock --pid P"}},
		{"toggle (550)", help550, []string{"--toggle --pid P"}, []string{"--toggle --pid P"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := sleeper(t).Process.Pid
			tool := &fakeTool{state: cudaRunning, help: c.help}
			h := testHost(t, tool)
			ctx := context.Background()
			if err := h.Checkpoint(ctx, p); err != nil {
				t.Fatal(err)
			}
			if err := h.Checkpoint(ctx, p); err != nil { // idempotent
				t.Fatal(err)
			}
			if err := h.Restore(ctx, p); err != nil {
				t.Fatal(err)
			}
			want := append(append([]string{}, c.wantCkpt...), c.wantRestore...)
			for i := range want {
				want[i] = strings.ReplaceAll(want[i], "P", strconv.Itoa(p))
			}
			if fmt.Sprint(tool.calls) != fmt.Sprint(want) {
				t.Fatalf("calls:\n got %q\nwant %q", tool.calls, want)
			}
			if err := h.Restore(ctx, p); !errors.Is(err, gpu.ErrNotCheckpointed) {
				t.Fatalf("restore of a running process = %v", err)
			}
		})
	}
}

// TestFailedCheckpointUnlocksAndRestoreOOMIsOutOfMemory.
func TestFailedCheckpointUnlocksAndRestoreOOMIsOutOfMemory(t *testing.T) {
	p := sleeper(t).Process.Pid
	tool := &fakeTool{state: cudaRunning, help: help570, failOn: map[string]string{"checkpoint": "UVM is not supported"}}
	h := testHost(t, tool)
	ctx := context.Background()
	if err := h.Checkpoint(ctx, p); err == nil {
		t.Fatal("checkpoint succeeded")
	}
	if last := tool.calls[len(tool.calls)-1]; last != "--action unlock --pid "+strconv.Itoa(p) {
		t.Fatalf("calls = %q, want an unlock after the failure", tool.calls)
	}
	tool.failOn = map[string]string{"restore": "CUDA_ERROR_OUT_OF_MEMORY: out of memory"}
	tool.state = cudaCheckpointed
	if err := h.Restore(ctx, p); !errors.Is(err, gpu.ErrOutOfMemory) {
		t.Fatalf("restore = %v, want out of memory", err)
	}
}

// TestCheckpointRefusesThreadsStoppedAndGoneProcesses: the pid must be a
// process (Tgid == Pid), not stopped (never checkpoint a frozen process)
// and alive; cuda-checkpoint is not even called otherwise.
func TestCheckpointRefusesThreadsStoppedAndGoneProcesses(t *testing.T) {
	tool := &fakeTool{state: cudaRunning, help: help570}
	h := testHost(t, tool)
	ctx := context.Background()

	tid := otherThread(t)
	if err := h.Checkpoint(ctx, tid); !errors.Is(err, ErrThread) {
		t.Fatalf("checkpoint of thread %d = %v", tid, err)
	}

	cmd := sleeper(t)
	if err := syscall.Kill(cmd.Process.Pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool { return stopped("/proc", cmd.Process.Pid) })
	if err := h.Checkpoint(ctx, cmd.Process.Pid); !errors.Is(err, gpu.ErrStopped) {
		t.Fatalf("checkpoint of a stopped process = %v", err)
	}
	if err := h.Restore(ctx, cmd.Process.Pid); !errors.Is(err, gpu.ErrStopped) {
		t.Fatalf("restore of a stopped process = %v", err)
	}
	if err := h.Checkpoint(ctx, 1<<30); !errors.Is(err, gpu.ErrNoProcess) {
		t.Fatalf("checkpoint of no process = %v", err)
	}
	if len(tool.calls) != 0 {
		t.Fatalf("cuda-checkpoint was called: %q", tool.calls)
	}
}

// TestMissingCudaCheckpointIsAClearError.
func TestMissingCudaCheckpointIsAClearError(t *testing.T) {
	h, err := New(Config{NoNVML: true, CheckpointBin: "cuda-checkpoint-not-here"})
	if err != nil {
		t.Fatal(err)
	}
	p := sleeper(t).Process.Pid
	if err := h.Checkpoint(context.Background(), p); !errors.Is(err, ErrNoCheckpointTool) {
		t.Fatalf("checkpoint = %v", err)
	}
}

// otherThread returns the id of a thread of this process that is not its
// main thread.
func otherThread(t *testing.T) int {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join("/proc", strconv.Itoa(os.Getpid()), "task"))
	if err != nil {
		t.Skip(err)
	}
	for _, e := range entries {
		if n, err := strconv.Atoi(e.Name()); err == nil && n != os.Getpid() {
			return n
		}
	}
	t.Skip("no second thread")
	return 0
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	for i := 0; i < 2000; i++ {
		if cond() {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Fatal("condition never held")
}
