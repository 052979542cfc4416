// Package sim is a simulated GPU host that behaves as spec 004's
// measurements say real hosts do:
//
//   - a checkpoint acts on the worker pid only: the lease's other
//     processes keep running and keep their VRAM;
//   - checkpointing a child kills it (cuda-checkpoint rc=1, child dead);
//   - checkpoint and restore refuse a stopped process;
//   - a restore fails with out-of-memory when the card has no room;
//   - stopping a process can fail (EPERM) for a chosen pid;
//   - the VRAM probe can be made unreadable;
//   - a hard-cap host reads VRAM per pid; a host without one has no
//     reading at all.
//
// It also plays the lease's worker (gpu.Worker): Reserve sets the
// worker's reservation. Tests drive it with StartWorker, StartChild,
// Alloc, Exit and the Fail* knobs, and read it back with Proc and Log.
package sim

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/torpor-dev/torpor/gpu"
)

// Options shape a simulated host.
type Options struct {
	// HardCap: the host enforces a per-lease cap and reads VRAM per pid.
	HardCap bool
	// DeviceMiB is each device's memory; default one 24 GiB device.
	DeviceMiB []int64
	// Model is every device's model (default SimModel).
	Model string
}

// SimModel is a simulated device's model unless Options says another.
const SimModel = "torpor simulated GPU"

// ErrChildKilled is what checkpointing a non-worker process returns: the
// process died (as cuda-checkpoint's rc=1 on a job child did).
var ErrChildKilled = errors.New("cuda-checkpoint rc=1: the process died")

// Host is a simulated GPU host. The zero value is not usable; call New.
type Host struct {
	mu         sync.Mutex
	hardCap    bool
	model      string
	devices    []int64
	procs      map[int]*proc
	nextPID    int
	probeErr   error
	stopErr    map[int]error
	restoreErr map[int]error
	ckptErr    map[int]error
	reserveErr error
	log        []string
	// onCheckpoint runs (without the lock) after a worker checkpoint.
	onCheckpoint func(pid int)
}

type proc struct {
	pid    int
	group  string
	worker bool
	device int
	// vram is what the process holds now; for a worker, base + pool.
	vram, base, pool int64
	spilled          int64
	stopped          bool
	checkpointed     bool
	dead             bool
	signals          []string
}

// New returns a simulated host.
func New(o Options) *Host {
	devs := o.DeviceMiB
	if len(devs) == 0 {
		devs = []int64{24576}
	}
	model := o.Model
	if model == "" {
		model = SimModel
	}
	return &Host{hardCap: o.HardCap, model: model, devices: append([]int64(nil), devs...), procs: map[int]*proc{}, nextPID: 1000,
		stopErr: map[int]error{}, restoreErr: map[int]error{}, ckptErr: map[int]error{}}
}

func (h *Host) logf(format string, args ...any) {
	h.log = append(h.log, fmt.Sprintf(format, args...))
}

// Devices lists the simulated devices (gpu.Inventory).
func (h *Host) Devices(context.Context) ([]gpu.Device, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := make([]gpu.Device, len(h.devices))
	for i, total := range h.devices {
		out[i] = gpu.Device{Index: i, Model: h.model, TotalMiB: total}
	}
	return out, nil
}

// StartWorker starts a lease's worker in group on device, holding baseMiB
// of VRAM (its CUDA context) and no reservation yet.
func (h *Host) StartWorker(group string, device int, baseMiB int64) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.nextPID++
	p := &proc{pid: h.nextPID, group: group, worker: true, device: device, base: baseMiB, vram: baseMiB}
	h.procs[p.pid] = p
	return p.pid
}

// StartChild starts a non-worker process (a job or its child) in group,
// holding mib of VRAM on device.
func (h *Host) StartChild(group string, device int, mib int64) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.nextPID++
	p := &proc{pid: h.nextPID, group: group, device: device, vram: mib}
	h.procs[p.pid] = p
	return p.pid
}

// Alloc makes a running process take mib more VRAM. A stopped process
// cannot; a full card is ErrOutOfMemory.
func (h *Host) Alloc(pid int, mib int64) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	p := h.procs[pid]
	switch {
	case p == nil || p.dead:
		return gpu.ErrNoProcess
	case p.stopped:
		return gpu.ErrStopped
	case p.checkpointed:
		return gpu.ErrCheckpointed
	case h.freeLocked(p.device) < mib:
		return gpu.ErrOutOfMemory
	}
	p.vram += mib
	return nil
}

// Exit ends a process; its VRAM is freed.
func (h *Host) Exit(pid int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if p := h.procs[pid]; p != nil {
		p.dead, p.vram, p.spilled = true, 0, 0
	}
}

// FailProbe makes Usage fail with err (nil: readable again).
func (h *Host) FailProbe(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.probeErr = err
}

// FailStop makes stopping pid fail with err (syscall.EPERM, say); nil
// clears it.
func (h *Host) FailStop(pid int, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.setErr(h.stopErr, pid, err)
}

// FailRestore makes restoring pid fail with err; nil clears it.
func (h *Host) FailRestore(pid int, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.setErr(h.restoreErr, pid, err)
}

// FailCheckpoint makes checkpointing pid fail with err; nil clears it.
func (h *Host) FailCheckpoint(pid int, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.setErr(h.ckptErr, pid, err)
}

// FailReserve makes every worker reserve fail with err; nil clears it.
func (h *Host) FailReserve(err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.reserveErr = err
}

// OnCheckpoint runs f after each worker checkpoint (to race a child's
// allocation with a pause).
func (h *Host) OnCheckpoint(f func(pid int)) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.onCheckpoint = f
}

func (h *Host) setErr(m map[int]error, pid int, err error) {
	if err == nil {
		delete(m, pid)
	} else {
		m[pid] = err
	}
}

// ProcInfo is what a test reads of a simulated process.
type ProcInfo struct {
	PID          int
	Worker       bool
	Alive        bool
	Stopped      bool
	Checkpointed bool
	VRAMMiB      int64
	// PoolMiB is a worker's reservation above its base.
	PoolMiB int64
	// Signals lists what the process received, in order: STOP, CONT,
	// TERM, KILL.
	Signals []string
}

// Proc returns pid's state.
func (h *Host) Proc(pid int) ProcInfo {
	h.mu.Lock()
	defer h.mu.Unlock()
	p := h.procs[pid]
	if p == nil {
		return ProcInfo{PID: pid}
	}
	return ProcInfo{PID: pid, Worker: p.worker, Alive: !p.dead, Stopped: p.stopped, Checkpointed: p.checkpointed,
		VRAMMiB: p.vram, PoolMiB: p.pool, Signals: append([]string(nil), p.signals...)}
}

// Log returns the host operations so far: "checkpoint PID", "restore
// PID", "reserve PID MIB", "freeze GROUP", "thaw GROUP", "kill GROUP".
func (h *Host) Log() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.log...)
}

// Count returns how many log entries start with prefix.
func (h *Host) Count(prefix string) int {
	n := 0
	for _, e := range h.Log() {
		if strings.HasPrefix(e, prefix) {
			n++
		}
	}
	return n
}

// GroupVRAM returns the VRAM the live processes of group hold.
func (h *Host) GroupVRAM(group string) int64 {
	h.mu.Lock()
	defer h.mu.Unlock()
	var n int64
	for _, p := range h.procs {
		if p.group == group && !p.dead {
			n += p.vram
		}
	}
	return n
}

func (h *Host) freeLocked(device int) int64 {
	if device < 0 || device >= len(h.devices) {
		return 0
	}
	used := int64(0)
	for _, p := range h.procs {
		if !p.dead && p.device == device {
			used += p.vram
		}
	}
	return h.devices[device] - used
}

// HardCap implements gpu.Prober.
func (h *Host) HardCap() bool { return h.hardCap }

// Usage implements gpu.Prober. A host without a hard cap has no reading.
func (h *Host) Usage(ctx context.Context) (gpu.Usage, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if !h.hardCap {
		return gpu.Usage{}, fmt.Errorf("%w: the host enforces no hard cap and reads no VRAM per process", gpu.ErrProbeUnavailable)
	}
	if h.probeErr != nil {
		return gpu.Usage{}, fmt.Errorf("%w: %v", gpu.ErrProbeUnavailable, h.probeErr)
	}
	u := gpu.Usage{ByPID: map[int]int64{}}
	used := make([]int64, len(h.devices))
	for _, p := range h.procs {
		if p.dead || p.vram == 0 {
			continue
		}
		u.ByPID[p.pid] += p.vram
		if p.device >= 0 && p.device < len(used) {
			used[p.device] += p.vram
		}
	}
	for i, total := range h.devices {
		u.Devices = append(u.Devices, gpu.DeviceUsage{Index: i, UsedMiB: used[i], TotalMiB: total})
	}
	return u, nil
}

// Checkpoint implements gpu.Checkpointer: the worker's VRAM moves to host
// memory; a child dies; a stopped process is refused.
func (h *Host) Checkpoint(ctx context.Context, pid int) error {
	h.mu.Lock()
	h.logf("checkpoint %d", pid)
	p := h.procs[pid]
	switch {
	case p == nil || p.dead:
		h.mu.Unlock()
		return gpu.ErrNoProcess
	case p.stopped:
		h.mu.Unlock()
		return fmt.Errorf("checkpoint %d: %w", pid, gpu.ErrStopped)
	case h.ckptErr[pid] != nil:
		err := h.ckptErr[pid]
		h.mu.Unlock()
		return err
	case !p.worker:
		p.dead, p.vram = true, 0
		h.mu.Unlock()
		return fmt.Errorf("checkpoint %d: %w", pid, ErrChildKilled)
	case p.checkpointed:
		h.mu.Unlock()
		return fmt.Errorf("checkpoint %d: %w", pid, gpu.ErrCheckpointed)
	}
	p.spilled, p.vram, p.checkpointed = p.vram, 0, true
	f := h.onCheckpoint
	h.mu.Unlock()
	if f != nil {
		f(pid)
	}
	return nil
}

// Restore implements gpu.Checkpointer.
func (h *Host) Restore(ctx context.Context, pid int) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.logf("restore %d", pid)
	p := h.procs[pid]
	switch {
	case p == nil || p.dead:
		return gpu.ErrNoProcess
	case p.stopped:
		return fmt.Errorf("restore %d: %w", pid, gpu.ErrStopped)
	case !p.checkpointed:
		return fmt.Errorf("restore %d: %w", pid, gpu.ErrNotCheckpointed)
	case h.restoreErr[pid] != nil:
		return h.restoreErr[pid]
	case h.freeLocked(p.device) < p.spilled:
		return fmt.Errorf("restore %d: %w", pid, gpu.ErrOutOfMemory)
	}
	p.vram, p.spilled, p.checkpointed = p.spilled, 0, false
	return nil
}

// Reserve implements gpu.Worker: the worker comes to hold mib in all (at
// least its base context).
func (h *Host) Reserve(ctx context.Context, t gpu.Target, mib int64) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.logf("reserve %d %d", t.WorkerPID, mib)
	p := h.procs[t.WorkerPID]
	switch {
	case p == nil || p.dead:
		return gpu.ErrNoProcess
	case p.stopped:
		return gpu.ErrStopped
	case p.checkpointed:
		return gpu.ErrCheckpointed
	case h.reserveErr != nil:
		return h.reserveErr
	}
	pool := max(0, mib-p.base)
	if pool-p.pool > h.freeLocked(p.device) {
		return gpu.ErrOutOfMemory
	}
	p.pool = pool
	p.vram = p.base + p.pool
	return nil
}

func (h *Host) groupLocked(group string) []*proc {
	var out []*proc
	for _, p := range h.procs {
		if p.group == group && !p.dead {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].pid < out[j].pid })
	return out
}

// Processes implements gpu.Group.
func (h *Host) Processes(ctx context.Context, group string) ([]int, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	var pids []int
	for _, p := range h.groupLocked(group) {
		pids = append(pids, p.pid)
	}
	return pids, nil
}

// signaler stops and continues simulated processes; h.mu is held.
type signaler struct{ h *Host }

func (s signaler) Stop(pid int) error {
	p := s.h.procs[pid]
	if p == nil || p.dead {
		return gpu.ErrNoProcess
	}
	if err := s.h.stopErr[pid]; err != nil {
		return err
	}
	p.stopped = true
	p.signals = append(p.signals, "STOP")
	return nil
}

func (s signaler) Continue(pid int) error {
	p := s.h.procs[pid]
	if p == nil || p.dead {
		return gpu.ErrNoProcess
	}
	p.stopped = false
	p.signals = append(p.signals, "CONT")
	return nil
}

// Freeze implements gpu.Group: every process is stopped, or none is.
func (h *Host) Freeze(ctx context.Context, group string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.logf("freeze %s", group)
	var pids []int
	for _, p := range h.groupLocked(group) {
		if !p.stopped {
			pids = append(pids, p.pid)
		}
	}
	return gpu.FreezeAll(pids, signaler{h})
}

// Thaw implements gpu.Group.
func (h *Host) Thaw(ctx context.Context, group string) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.logf("thaw %s", group)
	for _, p := range h.groupLocked(group) {
		if p.stopped {
			_ = signaler{h}.Continue(p.pid)
		}
	}
	return nil
}

// Kill implements gpu.Group: stopped processes get CONT, then each gets
// TERM and dies (the simulated processes all honour TERM).
func (h *Host) Kill(ctx context.Context, group string, grace time.Duration) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.logf("kill %s", group)
	for _, p := range h.groupLocked(group) {
		if p.stopped {
			_ = signaler{h}.Continue(p.pid)
		}
		p.signals = append(p.signals, "TERM")
		p.dead, p.vram, p.spilled = true, 0, 0
	}
	return nil
}
