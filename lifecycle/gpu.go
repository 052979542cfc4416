package lifecycle

import (
	"context"
	"fmt"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/gpu"
)

// GPULeases is what the engine asks of a node's GPU lease manager
// (gpu.Manager): a GPU sandbox holds one lease, under its own id, from
// each boot to the end of that boot. The engine attaches itself as the
// manager's sink when it is given the manager (see gpuSink).
type GPULeases interface {
	Attach(s gpu.Sink)
	Create(ctx context.Context, spec gpu.Spec) (gpu.Status, error)
	Pause(ctx context.Context, id string) (gpu.Status, error)
	Resume(ctx context.Context, id string) (gpu.Status, error)
	BeginJob(ctx context.Context, id string) (*gpu.Job, error)
	Destroy(ctx context.Context, id string) (gpu.Status, error)
	Purge(id string) error
	Status(id string) (gpu.Status, error)
	Adopt(ctx context.Context, rec gpu.Record) (gpu.Status, error)
	Tick(ctx context.Context) gpu.TickReport
	// Capacity describes the host's GPUs and HeldVRAMMiB what the leases
	// that hold a seat take of their VRAM (a fleet node reports both, for
	// placement: fleet.go).
	Capacity(ctx context.Context) (gpu.Capacity, error)
	HeldVRAMMiB() int64
}

// GPUAttacher places a booted GPU sandbox's lease on the host: the group
// of its processes there, its worker's pid and its devices.
type GPUAttacher func(ctx context.Context, sb *torpor.Sandbox) (group string, workerPID int, devices []int, err error)

// leaseStore is what the engine needs of the store for GPU leases (the
// sqlite store has it).
type leaseStore interface {
	ListLeases(ctx context.Context) ([]gpu.Record, error)
	DeleteLease(ctx context.Context, id string) error
}

// gpuTick is how often the lease manager's reaper runs: heartbeat,
// watchdog, idle sweep, usage rows.
const gpuTick = time.Second

// FailureGPU: the sandbox's GPU lease died (its worker exited, the
// watchdog killed it for using more VRAM than its limit, it could not be
// restored).
const FailureGPU = "gpu_lease_dead"

// gpuAccel validates a create request's accel for its caller's tier.
func (e *Engine) gpuAccel(req torpor.CreateRequest) (*torpor.Accel, error) {
	if req.Accel == nil {
		return nil, nil
	}
	if e.gpu == nil {
		return nil, torpor.Invalid("accel", "this node has no GPU host (torpor serve --gpu-sim runs a simulated one)")
	}
	r := req.Accel
	tier := gpu.TierStandard
	if req.Caller.Tier == torpor.TierFree {
		tier = gpu.TierFree
	}
	a, err := gpu.AccelRequest{GPUs: r.GPUs, VRAMMiB: r.VRAMMiB, SuspendMode: gpu.SuspendMode(r.SuspendMode), IdleTimeoutS: r.IdleTimeoutS}.Validate(tier)
	if err != nil {
		return nil, err
	}
	return &torpor.Accel{GPUs: a.GPUs, VRAMMiB: a.VRAMMiB, SuspendMode: string(a.SuspendMode), IdleTimeoutS: a.IdleTimeoutS}, nil
}

// gpuAttach takes the lease of a GPU sandbox that just booted.
func (e *Engine) gpuAttach(ctx context.Context, sb *torpor.Sandbox) error {
	if sb.Accel == nil || e.gpu == nil {
		return nil
	}
	group, worker, devices, err := e.gpuAttacher(ctx, sb)
	if err != nil {
		return fmt.Errorf("GPU lease: %w", err)
	}
	a := sb.Accel
	_, err = e.gpu.Create(ctx, gpu.Spec{ID: sb.ID, Tenant: sb.Tenant, KeyID: sb.KeyID, Group: group, WorkerPID: worker, Devices: devices,
		Accel: gpu.Accel{GPUs: a.GPUs, VRAMMiB: a.VRAMMiB, SuspendMode: gpu.SuspendMode(a.SuspendMode), IdleTimeoutS: a.IdleTimeoutS}})
	if err != nil {
		return fmt.Errorf("GPU lease: %w", err)
	}
	return nil
}

// gpuRelease ends the lease of a GPU sandbox whose processes end: its
// intervals are billed up to now, then its record is forgotten (its usage
// rows stay).
func (e *Engine) gpuRelease(ctx context.Context, sb *torpor.Sandbox) {
	if sb.Accel == nil || e.gpu == nil {
		return
	}
	if _, err := e.gpu.Status(sb.ID); err != nil {
		return // no lease: never attached, or released already
	}
	if _, err := e.gpu.Destroy(ctx, sb.ID); err != nil && !torpor.IsCode(err, torpor.EGone) {
		e.log.Error("ending a GPU lease", "sandbox", sb.ID, "err", err)
	}
	if err := e.gpu.Purge(sb.ID); err != nil {
		e.log.Error("forgetting a GPU lease", "sandbox", sb.ID, "err", err)
	}
	if ls, ok := e.store.(leaseStore); ok {
		if err := ls.DeleteLease(ctx, sb.ID); err != nil {
			e.log.Error("forgetting a GPU lease", "sandbox", sb.ID, "err", err)
		}
	}
}

// gpuPause suspends a GPU sandbox's lease before its instance is frozen:
// a spill must checkpoint before anything is frozen. A busy lease refuses.
func (e *Engine) gpuPause(ctx context.Context, sb *torpor.Sandbox) error {
	if sb.Accel == nil || e.gpu == nil {
		return nil
	}
	_, err := e.gpu.Pause(ctx, sb.ID)
	return err
}

// gpuResume brings a GPU sandbox's lease back (thaw, restore, re-reserve).
func (e *Engine) gpuResume(ctx context.Context, sb *torpor.Sandbox) error {
	if sb.Accel == nil || e.gpu == nil {
		return nil
	}
	_, err := e.gpu.Resume(ctx, sb.ID)
	return err
}

// gpuJob runs fn as a job of a GPU sandbox's lease: the lease is thawed or
// resumed first, and a pause is refused while it runs.
func (e *Engine) gpuJob(ctx context.Context, sb *torpor.Sandbox, fn func() error) error {
	if sb.Accel == nil || e.gpu == nil {
		return fn()
	}
	job, err := e.gpu.BeginJob(ctx, sb.ID)
	if err != nil {
		return err
	}
	ferr := fn()
	if err := job.End(context.WithoutCancel(ctx)); err != nil {
		e.log.Error("ending a GPU job", "sandbox", sb.ID, "err", err)
	}
	return ferr
}

// gpuView adds the lease's status to a sandbox shown to a caller.
func (e *Engine) gpuView(c *torpor.Sandbox) {
	if c.Accel == nil || e.gpu == nil {
		return
	}
	if st, err := e.gpu.Status(c.ID); err == nil {
		c.GPU = st
	}
}

// gpuAdopt re-seeds the stored leases after a restart. A lease whose
// processes are gone restores dead (billed up to its last sign of life);
// its sandbox fails.
func (e *Engine) gpuAdopt(ctx context.Context) error {
	ls, ok := e.store.(leaseStore)
	if e.gpu == nil || !ok {
		return nil
	}
	recs, err := ls.ListLeases(ctx)
	if err != nil {
		return err
	}
	for _, rec := range recs {
		sb, err := e.store.GetSandbox(ctx, rec.Spec.ID)
		if e.fleet != nil && (err != nil || !e.mine(sb)) {
			continue // another node's lease (or a sandbox no node holds)
		}
		if err == nil && sb.Usage.SeenAt.After(rec.LastSeen) {
			rec.LastSeen = sb.Usage.SeenAt
		}
		if _, err := e.gpu.Adopt(ctx, rec); err != nil {
			e.log.Error("adopting a GPU lease", "sandbox", rec.Spec.ID, "err", err)
		}
	}
	return nil
}

// gpuSink is the engine as its lease manager's sink: the manager's idle
// sweep pauses through it and its events reach the engine, while the
// engine alone knows the manager.
type gpuSink struct{ e *Engine }

func (s gpuSink) PauseIdle(ctx context.Context, id string) error {
	return s.e.pauseForGPUSweep(ctx, id)
}

func (s gpuSink) LeaseEvent(ev gpu.Event) { s.e.onGPUEvent(ev) }

// onGPUEvent acts on what the lease manager did on its own: a lease that
// died (watchdog kill, worker gone, restored dead) fails its sandbox.
func (e *Engine) onGPUEvent(ev gpu.Event) {
	switch ev.Kind {
	case gpu.EventDead, gpu.EventWatchdogKill:
	case gpu.EventWatchdogBlind:
		e.log.Warn("the GPU watchdog cannot read VRAM usage", "reason", ev.Reason)
		return
	default:
		return
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		ctx := e.bg
		unlock := e.locks.Lock(ev.LeaseID)
		defer unlock()
		sb, err := e.store.GetSandbox(ctx, ev.LeaseID)
		if err != nil || sb.State == torpor.StateTerminated || sb.State == torpor.StateFailed {
			return
		}
		if rt, err := e.runtime(sb.Runtime.Kind); err == nil {
			e.unwatch(sb.ID)
			if err := e.stopRuntime(ctx, rt, sb); err != nil {
				e.log.Error("stopping the sandbox of a dead GPU lease", "sandbox", sb.ID, "err", err)
			}
		}
		msg := fmt.Sprintf("its GPU lease died: %s", ev.Reason)
		if ev.Kind == gpu.EventWatchdogKill {
			msg = fmt.Sprintf("the GPU watchdog killed it: %s", ev.Reason)
		}
		if err := e.recordFailure(ctx, sb, &torpor.Failure{Code: FailureGPU, Message: msg}); err != nil {
			e.log.Error("recording a dead GPU lease", "sandbox", sb.ID, "err", err)
		}
	}()
}

// pauseForGPUSweep is the lease manager's idle sweep's way to pause a
// sandbox: the same path as POST /pause, with the sweep's context.
func (e *Engine) pauseForGPUSweep(ctx context.Context, id string) error {
	unlock := e.locks.Lock(id)
	defer unlock()
	sb, err := e.store.GetSandbox(ctx, id)
	if err != nil {
		return err
	}
	if e.act.busy(id) {
		return torpor.Errorf(torpor.EConflict, "sandbox %s is busy", id)
	}
	return e.pause(ctx, sb, torpor.PauseFreeze, CauseIdle)
}

// runGPUTicks runs the lease manager's reaper every gpuTick on the
// engine's clock until ctx ends.
func (e *Engine) runGPUTicks(ctx context.Context) {
	if e.gpu == nil {
		return
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		for {
			ch := make(chan struct{})
			t := e.clock.AfterFunc(gpuTick, func() { close(ch) })
			select {
			case <-ctx.Done():
				t.Stop()
				return
			case <-ch:
				if r := e.gpu.Tick(ctx); r.Err != nil {
					e.log.Warn("GPU reaper", "err", r.Err)
				}
			}
		}
	}()
}
