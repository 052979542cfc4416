package nvidia

// The real-host tests run on a machine with an NVIDIA GPU when
// TORPOR_GPU_REAL=1 (scripts/gpu-check.sh sets it). They need python3 and
// the driver's libcuda.so.1 (testdata/gpuproc.py allocates VRAM through
// the driver API with ctypes), NVML or nvidia-smi for the probe, and
// NVIDIA's cuda-checkpoint for the spill tests. A missing tool skips the
// tests that need it with a line starting "MISSING:".

import (
	"bufio"
	"context"
	_ "embed"
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

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/gpu"
)

//go:embed testdata/gpuproc.py
var gpuprocPy []byte

type realRig struct {
	t      *testing.T
	python string
	script string
	dir    string
}

func newRealRig(t *testing.T) *realRig {
	t.Helper()
	if os.Getenv("TORPOR_GPU_REAL") != "1" {
		t.Skip("real-host GPU test: set TORPOR_GPU_REAL=1 on a GPU machine (scripts/gpu-check.sh)")
	}
	python := os.Getenv("TORPOR_GPU_PYTHON")
	if python == "" {
		python = "python3"
	}
	if _, err := exec.LookPath(python); err != nil {
		t.Skipf("MISSING: %s (the test's CUDA processes are Python with ctypes): %v", python, err)
	}
	dir := t.TempDir()
	script := filepath.Join(dir, "gpuproc.py")
	if err := os.WriteFile(script, gpuprocPy, 0o755); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(python, script, "probe").CombinedOutput(); err != nil {
		t.Skipf("MISSING: a usable CUDA driver (libcuda.so.1): %s", strings.TrimSpace(string(out)))
	}
	return &realRig{t: t, python: python, script: script, dir: dir}
}

func (r *realRig) host(hardCap bool) *Host {
	r.t.Helper()
	h, err := New(Config{HardCap: hardCap})
	if err != nil {
		r.t.Fatal(err)
	}
	r.t.Cleanup(func() { _ = h.Close() })
	if _, err := h.Usage(context.Background()); err != nil {
		r.t.Skipf("MISSING: a VRAM probe (NVML or nvidia-smi): %v", err)
	}
	return h
}

func (r *realRig) needCheckpoint(h *Host) {
	r.t.Helper()
	if _, err := h.hasActions(context.Background()); err != nil {
		r.t.Skipf("MISSING: %v", err)
	}
}

type gpuProc struct {
	pid     int
	control string
	done    chan struct{}
}

// start runs gpuproc.py; pgid 0 starts a new process group.
func (r *realRig) start(pgid int, args ...string) *gpuProc {
	r.t.Helper()
	cmd := exec.Command(r.python, append([]string{r.script}, args...)...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pgid: pgid}
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		r.t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	p := &gpuProc{pid: cmd.Process.Pid, done: make(chan struct{})}
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case lines <- sc.Text():
			default:
			}
		}
	}()
	go func() { _ = cmd.Wait(); close(p.done) }()
	r.t.Cleanup(func() {
		_ = syscall.Kill(p.pid, syscall.SIGCONT)
		_ = syscall.Kill(p.pid, syscall.SIGKILL)
		<-p.done
	})
	select {
	case l := <-lines:
		if !strings.HasPrefix(l, "ready") {
			r.t.Fatalf("gpuproc %v: %q", args, l)
		}
	case <-p.done:
		r.t.Fatalf("gpuproc %v exited before it was ready", args)
	case <-time.After(2 * time.Minute):
		r.t.Fatalf("gpuproc %v not ready after 2 minutes", args)
	}
	return p
}

func (r *realRig) worker(dataMiB int) *gpuProc {
	control := filepath.Join(r.dir, "control-"+strconv.Itoa(dataMiB)+"-"+strconv.FormatInt(time.Now().UnixNano(), 36))
	p := r.start(0, "worker", "--control", control, "--data-mib", strconv.Itoa(dataMiB))
	p.control = control
	return p
}

// verify asks a worker to check its data.
func (p *gpuProc) verify(t *testing.T) {
	t.Helper()
	seq := strconv.FormatInt(time.Now().UnixNano(), 10)
	if err := os.WriteFile(filepath.Join(p.control, "verify"), []byte(seq+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		b, _ := os.ReadFile(filepath.Join(p.control, "verified"))
		if f := strings.Fields(string(b)); len(f) >= 2 && f[0] == seq {
			if f[1] != "ok" {
				t.Fatalf("the worker's data is corrupt after the restore: %s", b)
			}
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("the worker did not answer the verify")
}

func usageOf(t *testing.T, h *Host, pid int) int64 {
	t.Helper()
	u, err := h.Usage(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	return u.ByPID[pid]
}

// report prints a result line the script collects.
func report(format string, args ...any) {
	fmt.Printf("RESULT "+format+"\n", args...)
}

// TestRealProbe: the probe sees a CUDA process's VRAM.
func TestRealProbe(t *testing.T) {
	r := newRealRig(t)
	h := r.host(true)
	w := r.worker(1024)
	u, err := h.Usage(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if u.ByPID[w.pid] < 1024 {
		t.Fatalf("probe (%s) sees %d MiB for the worker, want at least 1024: %+v", h.ProbeSource(), u.ByPID[w.pid], u)
	}
	report("probe source=%s worker_mib=%d devices=%+v nvml=%v", h.ProbeSource(), u.ByPID[w.pid], u.Devices, h.NVMLError())
	if h.nvml != nil {
		su, err := h.smiUsage(context.Background())
		if err != nil {
			report("probe nvidia-smi fallback: %v", err)
		} else {
			report("probe nvidia-smi fallback worker_mib=%d", su.ByPID[w.pid])
		}
	}
}

// TestRealSpillRestorePerGiB times cuda-checkpoint's spill and restore
// of a worker holding N GiB (TORPOR_GPU_SPILL_GIB, default 1,4,16), and
// checks its data survives.
func TestRealSpillRestorePerGiB(t *testing.T) {
	r := newRealRig(t)
	h := r.host(false)
	r.needCheckpoint(h)
	sizes := os.Getenv("TORPOR_GPU_SPILL_GIB")
	if sizes == "" {
		sizes = "1,4,16"
	}
	ctx := context.Background()
	for _, s := range strings.Split(sizes, ",") {
		gib, err := strconv.Atoi(strings.TrimSpace(s))
		if err != nil || gib <= 0 {
			t.Fatalf("TORPOR_GPU_SPILL_GIB: %q", s)
		}
		w := r.worker(gib * 1024)
		before := usageOf(t, h, w.pid)
		start := time.Now()
		if err := h.Checkpoint(ctx, w.pid); err != nil {
			t.Fatalf("checkpoint of %d GiB: %v", gib, err)
		}
		spill := time.Since(start)
		after := usageOf(t, h, w.pid)
		start = time.Now()
		if err := h.Restore(ctx, w.pid); err != nil {
			t.Fatalf("restore of %d GiB: %v", gib, err)
		}
		restore := time.Since(start)
		w.verify(t)
		if after > before/10 {
			t.Errorf("%d GiB: the worker still holds %d MiB after the checkpoint (%d before)", gib, after, before)
		}
		report("spill gib=%d vram_before_mib=%d vram_after_mib=%d checkpoint_s=%.3f checkpoint_s_per_gib=%.3f restore_s=%.3f restore_s_per_gib=%.3f",
			gib, before, after, spill.Seconds(), spill.Seconds()/float64(gib), restore.Seconds(), restore.Seconds()/float64(gib))
		_ = syscall.Kill(w.pid, syscall.SIGKILL)
		<-w.done
	}
}

type realFlags struct {
	mu    sync.Mutex
	flags []gpu.Flag
}

func (f *realFlags) FlagKey(ctx context.Context, fl gpu.Flag) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.flags = append(f.flags, fl)
	return nil
}

func (r *realRig) manager(h *Host, flags gpu.Flagger) *gpu.Manager {
	r.t.Helper()
	cfg := gpu.DefaultConfig()
	m, err := gpu.NewManager(gpu.Options{Host: h, Clock: torpor.SystemClock{}, Config: cfg,
		Worker: FileWorker{Dir: r.dir, Timeout: time.Minute}, Flagger: flags})
	if err != nil {
		r.t.Fatal(err)
	}
	return m
}

// lease registers a worker as a lease; its control directory is the
// FileWorker's <dir>/<lease id>.
func (r *realRig) lease(m *gpu.Manager, id string, mode gpu.SuspendMode, sliceMiB, dataMiB int) *gpuProc {
	return r.leaseWithLimit(m, id, mode, sliceMiB, dataMiB, 0)
}

// contextMiB measures what a CUDA context alone holds on this card: the
// real leases' watchdog limit leaves room for it, since the test worker's
// reservation counts its data and pool but not its context.
func (r *realRig) contextMiB(h *Host) int64 {
	r.t.Helper()
	w := r.worker(0)
	ctxMiB := usageOf(r.t, h, w.pid)
	_ = syscall.Kill(w.pid, syscall.SIGKILL)
	<-w.done
	return ctxMiB
}

func (r *realRig) leaseWithLimit(m *gpu.Manager, id string, mode gpu.SuspendMode, sliceMiB, dataMiB int, limitMiB int64) *gpuProc {
	r.t.Helper()
	control := filepath.Join(r.dir, id)
	w := r.start(0, "worker", "--control", control, "--data-mib", strconv.Itoa(dataMiB))
	w.control = control
	_, err := m.Create(context.Background(), gpu.Spec{ID: id, Tenant: "gpu-check", KeyID: "key_" + id,
		Group: "pgid:" + strconv.Itoa(w.pid), WorkerPID: w.pid,
		Accel: gpu.Accel{GPUs: 1, VRAMMiB: int64(sliceMiB), SuspendMode: mode}, LimitMiB: limitMiB})
	if err != nil {
		r.t.Fatal(err)
	}
	return w
}

// TestRealSpillAndResumeThroughTheManager: a transparent lease on a host
// without a hard cap spills (its VRAM leaves the card, its processes
// stop), resumes with its data intact and re-reserves its slice.
func TestRealSpillAndResumeThroughTheManager(t *testing.T) {
	r := newRealRig(t)
	h := r.host(false)
	r.needCheckpoint(h)
	m := r.manager(h, nil)
	ctx := context.Background()
	w := r.lease(m, "spill", gpu.SuspendTransparent, 4096, 2048)
	held := usageOf(t, h, w.pid)
	start := time.Now()
	st, err := m.Pause(ctx, "spill")
	if err != nil {
		t.Fatal(err)
	}
	pause := time.Since(start)
	if !st.Spilled || !stopped(h.cfg.ProcRoot, w.pid) {
		t.Fatalf("pause = %+v, worker stopped=%v", st, stopped(h.cfg.ProcRoot, w.pid))
	}
	spilled := usageOf(t, h, w.pid)
	start = time.Now()
	if st, err = m.Resume(ctx, "spill"); err != nil {
		t.Fatal(err)
	}
	resume := time.Since(start)
	w.verify(t)
	back := usageOf(t, h, w.pid)
	report("manager spill slice_mib=4096 data_mib=2048 held_mib=%d spilled_mib=%d back_mib=%d pause_s=%.3f resume_s=%.3f",
		held, spilled, back, pause.Seconds(), resume.Seconds())
	if spilled > held/10 || back < 2048 {
		t.Errorf("VRAM held %d, spilled %d, back %d", held, spilled, back)
	}
	if _, err := m.Destroy(ctx, "spill"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-w.done:
	case <-time.After(30 * time.Second):
		t.Fatal("the worker survived the destroy")
	}
}

// TestRealFreezeOnlyKeepsVRAMAndStopsEverything: on a hard-cap host a
// transparent lease whose job left a child holding VRAM is freeze-only:
// every process stops, VRAM stays, the seat is kept; a resume thaws it.
func TestRealFreezeOnlyKeepsVRAMAndStopsEverything(t *testing.T) {
	r := newRealRig(t)
	h := r.host(true)
	m := r.manager(h, nil)
	ctx := context.Background()
	w := r.lease(m, "freeze", gpu.SuspendTransparent, 2048, 512)
	job, err := m.BeginJob(ctx, "freeze")
	if err != nil {
		t.Fatal(err)
	}
	child := r.start(w.pid, "child", "--mib", "512")
	if err := job.End(ctx); err != nil {
		t.Fatal(err)
	}
	before := usageOf(t, h, w.pid) + usageOf(t, h, child.pid)
	start := time.Now()
	st, err := m.Pause(ctx, "freeze")
	if err != nil {
		t.Fatal(err)
	}
	freeze := time.Since(start)
	if !st.Frozen || !st.FreezeOnly || st.FreezeReason != gpu.FreezeReasonNonWorkerVRAM || !st.HoldsSeat {
		t.Fatalf("pause = %+v", st)
	}
	for _, pid := range []int{w.pid, child.pid} {
		if !stopped(h.cfg.ProcRoot, pid) {
			t.Fatalf("process %d runs while the lease is frozen", pid)
		}
	}
	during := usageOf(t, h, w.pid) + usageOf(t, h, child.pid)
	start = time.Now()
	if _, err := m.Resume(ctx, "freeze"); err != nil {
		t.Fatal(err)
	}
	thaw := time.Since(start)
	for _, pid := range []int{w.pid, child.pid} {
		if stopped(h.cfg.ProcRoot, pid) {
			t.Fatalf("process %d still stopped after the thaw", pid)
		}
	}
	w.verify(t)
	report("freeze-only vram_before_mib=%d vram_frozen_mib=%d freeze_s=%.4f thaw_s=%.4f", before, during, freeze.Seconds(), thaw.Seconds())
	if during < before-64 {
		t.Errorf("a freeze moved VRAM: %d MiB before, %d frozen", before, during)
	}
	if _, err := m.Pause(ctx, "freeze"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Destroy(ctx, "freeze"); err != nil {
		t.Fatal(err)
	}
	for _, p := range []*gpuProc{w, child} {
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			t.Fatalf("process %d survived the destroy of the frozen lease", p.pid)
		}
	}
}

// TestRealWatchdogKillsARunawayChild: on a hard-cap host a lease whose
// child takes more than the slice is killed and its key flagged.
func TestRealWatchdogKillsARunawayChild(t *testing.T) {
	r := newRealRig(t)
	h := r.host(true)
	flags := &realFlags{}
	m := r.manager(h, flags)
	ctx := context.Background()
	ctxMiB := r.contextMiB(h)
	limit := 1024 + ctxMiB + 128
	w := r.leaseWithLimit(m, "runaway", gpu.SuspendTransparent, 1024, 256, limit)
	if rep := m.Tick(ctx); len(rep.Killed) != 0 {
		t.Fatalf("killed %v within the slice", rep.Killed)
	}
	job, err := m.BeginJob(ctx, "runaway")
	if err != nil {
		t.Fatal(err)
	}
	child := r.start(w.pid, "child", "--mib", "2048")
	rep := m.Tick(ctx)
	if len(rep.Killed) != 1 {
		t.Fatalf("tick = %+v, want the runaway killed", rep)
	}
	_ = job.End(ctx)
	flags.mu.Lock()
	f := flags.flags
	flags.mu.Unlock()
	if len(f) != 1 || f[0].KeyID != "key_runaway" {
		t.Fatalf("flags = %+v", f)
	}
	report("watchdog killed=%v used_mib=%d limit_mib=%d cuda_context_mib=%d", rep.Killed, f[0].UsedMiB, f[0].LimitMiB, ctxMiB)
	for _, p := range []*gpuProc{w, child} {
		select {
		case <-p.done:
		case <-time.After(30 * time.Second):
			t.Fatalf("process %d survived the watchdog", p.pid)
		}
	}
}
