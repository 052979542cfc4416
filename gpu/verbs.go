package gpu

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/torpor-dev/torpor"
)

type autoPauseKey struct{}

// WithAutoPause marks ctx as the idle sweep's: a pause made with it counts
// in the lease's auto_paused meter. The sweep sets it; a daemon whose
// pause path the sweep calls passes the context on to Manager.Pause.
func WithAutoPause(ctx context.Context) context.Context {
	return context.WithValue(ctx, autoPauseKey{}, true)
}

func isAutoPause(ctx context.Context) bool {
	v, _ := ctx.Value(autoPauseKey{}).(bool)
	return v
}

// Pause suspends the lease (POST /pause):
//   - suspend_mode none: the whole lease is frozen; its VRAM stays on the
//     card (frozen=true, wire phase suspended), billed in full;
//   - transparent on a host without a hard cap: the worker's GPU state is
//     spilled and the lease frozen; the seat is free and nothing is billed;
//   - transparent on a hard-cap host: a spill when the probe reads the
//     lease's VRAM and no non-worker VRAM is resident; otherwise
//     freeze-only: the lease is frozen, keeps its seat, freeze_reason says
//     why, and its frozen time is billed in full.
//
// Pausing a paused lease succeeds. A lease with a job in flight is
// refused (conflict, reason busy). A freeze that cannot stop every
// process continues what it stopped and is refused (conflict, reason
// freeze_failed): nothing keeps running while a lease reads paused, and
// nothing stays stopped while it reads running.
func (m *Manager) Pause(ctx context.Context, id string) (Status, error) {
	m.mu.Lock()
	l, err := m.acquire(ctx, id)
	if err != nil {
		m.mu.Unlock()
		return Status{}, err
	}
	switch {
	case l.phase == PhaseDead:
		m.mu.Unlock()
		return Status{}, deadErr(l)
	case l.job:
		m.mu.Unlock()
		return Status{}, busyErr(id, "pause")
	case l.frozen:
		st := l.status(m.clock.Now(), m.cfg.ResumeGrace)
		m.mu.Unlock()
		return st, nil
	}
	c := l.claim(opPausing)
	spec, target := l.spec, l.target()
	m.mu.Unlock()
	if err := m.save(ctx, l); err != nil {
		m.abort(l, c)
		return Status{}, err
	}

	out, err := m.suspend(ctx, spec, target)

	m.mu.Lock()
	l.release(c)
	if l.phase == PhaseDestroyed {
		m.mu.Unlock()
		return Status{}, gone(id, opPausing)
	}
	if err != nil {
		m.mu.Unlock()
		return Status{}, errors.Join(err, m.save(ctx, l))
	}
	now := m.clock.Now()
	if out.spilled {
		l.switchSeg(now, segSuspended, false)
		l.phase = PhaseSuspended
		l.meters.Spills++
	} else {
		freezeOnly := spec.Accel.SuspendMode == SuspendTransparent
		l.switchSeg(now, segFrozen, freezeOnly)
		l.freezeOnly, l.freezeReason = freezeOnly, out.reason
		l.meters.Freezes++
	}
	l.frozen = true
	auto := isAutoPause(ctx)
	if auto {
		l.meters.AutoPaused++
	}
	st := l.status(now, m.cfg.ResumeGrace)
	m.mu.Unlock()
	if auto {
		m.event(Event{LeaseID: id, Kind: EventAutoPaused, At: now})
	}
	return st, m.save(ctx, l)
}

// abort gives up a claimed transition before it touched the host.
func (m *Manager) abort(l *lease, c *claim) {
	m.mu.Lock()
	l.release(c)
	m.mu.Unlock()
}

type suspendOutcome struct {
	spilled bool
	// reason is the freeze-only reason of a transparent freeze.
	reason string
}

func (m *Manager) suspend(ctx context.Context, spec Spec, target int64) (suspendOutcome, error) {
	if spec.Accel.SuspendMode == SuspendNone {
		return suspendOutcome{}, m.freeze(ctx, spec)
	}
	if !m.host.HardCap() {
		// No VRAM reading: a transparent suspend always spills.
		return m.spill(ctx, spec, target)
	}
	if reason := m.freezeOnlyReason(ctx, spec); reason != "" {
		return suspendOutcome{reason: reason}, m.freeze(ctx, spec)
	}
	return m.spill(ctx, spec, target)
}

// freezeOnlyReason says why a transparent suspend on a hard-cap host may
// not spill: the probe cannot read the lease's VRAM, or its non-worker
// processes hold VRAM (freeing the seat would let the next lease take a
// slice those frozen processes still hold). Empty: it may spill.
func (m *Manager) freezeOnlyReason(ctx context.Context, spec Spec) string {
	u, err := m.host.Usage(ctx)
	if err != nil {
		return FreezeReasonProbeUnavailable
	}
	pids, err := m.host.Processes(ctx, spec.Group)
	if err != nil {
		return FreezeReasonProbeUnavailable
	}
	if _, others := u.Split(pids, spec.WorkerPID); others > 0 {
		return FreezeReasonNonWorkerVRAM
	}
	return ""
}

// freeze stops the whole lease or refuses with nothing left stopped.
func (m *Manager) freeze(ctx context.Context, spec Spec) error {
	err := m.host.Freeze(ctx, spec.Group)
	if err == nil {
		return nil
	}
	var fe *FreezeError
	if !errors.As(err, &fe) || fe.ContinueErr != nil {
		// Not sure what is left stopped: continue the whole group.
		if terr := m.host.Thaw(ctx, spec.Group); terr != nil {
			err = errors.Join(err, fmt.Errorf("thaw after the failed freeze: %w", terr))
		}
	}
	return &torpor.Error{Code: torpor.EConflict, Reason: "freeze_failed",
		Message: fmt.Sprintf("cannot pause GPU lease %q: %v; the lease keeps running", spec.ID, err)}
}

// spill releases the worker's reservation, checkpoints the worker (never
// a child: checkpointing a child kills it) and then freezes the lease
// (checkpoint before freeze). Any failure puts the worker back and
// refuses the pause.
func (m *Manager) spill(ctx context.Context, spec Spec, target int64) (suspendOutcome, error) {
	t := targetOf(spec)
	if err := m.worker.Reserve(ctx, t, 0); err != nil {
		m.rereserve(ctx, spec, target)
		return suspendOutcome{}, fmt.Errorf("gpu: pause %s: release the reservation: %w", spec.ID, err)
	}
	if err := m.host.Checkpoint(ctx, spec.WorkerPID); err != nil {
		m.rereserve(ctx, spec, target)
		return suspendOutcome{}, &torpor.Error{Code: torpor.EConflict, Reason: "checkpoint_failed",
			Message: fmt.Sprintf("cannot pause GPU lease %q: checkpoint of its worker failed: %v; the lease keeps running", spec.ID, err)}
	}
	if err := m.freeze(ctx, spec); err != nil {
		if rerr := m.host.Restore(ctx, spec.WorkerPID); rerr != nil {
			return suspendOutcome{}, errors.Join(err, fmt.Errorf("gpu: restore of the worker after the failed freeze: %w", rerr))
		}
		m.rereserve(ctx, spec, target)
		return suspendOutcome{}, err
	}
	if m.host.HardCap() && m.freezeOnlyReason(ctx, spec) == FreezeReasonNonWorkerVRAM {
		// A non-worker took VRAM between the probe and the freeze: the
		// spill is not safe any more. Put the worker back and keep the
		// seat, frozen.
		return m.unspill(ctx, spec, target)
	}
	return suspendOutcome{spilled: true}, nil
}

// unspill turns a spill into a freeze-only suspend: thaw (before
// restore), restore, reserve, freeze.
func (m *Manager) unspill(ctx context.Context, spec Spec, target int64) (suspendOutcome, error) {
	if err := m.host.Thaw(ctx, spec.Group); err != nil {
		return suspendOutcome{}, fmt.Errorf("gpu: pause %s: thaw to undo the spill: %w", spec.ID, err)
	}
	if err := m.host.Restore(ctx, spec.WorkerPID); err != nil {
		return suspendOutcome{}, fmt.Errorf("gpu: pause %s: restore to undo the spill: %w", spec.ID, err)
	}
	m.rereserve(ctx, spec, target)
	if err := m.freeze(ctx, spec); err != nil {
		return suspendOutcome{}, err
	}
	return suspendOutcome{reason: FreezeReasonNonWorkerVRAM}, nil
}

func (m *Manager) rereserve(ctx context.Context, spec Spec, target int64) {
	if err := m.worker.Reserve(ctx, targetOf(spec), target); err != nil {
		m.log.Warn("gpu: reserve", "lease", spec.ID, "mib", target, "err", err)
	}
}

// Resume wakes a paused lease (POST /start, /connect): a frozen lease is
// thawed; a spilled one is thawed, its worker restored and its
// reservation re-reserved. Resuming a running lease succeeds. One thaw at
// a time: a resume that finds one in flight waits for its commit and
// looks again; a lease destroyed meanwhile is gone, never committed as
// thawed.
func (m *Manager) Resume(ctx context.Context, id string) (Status, error) {
	_, st, err := m.wake(ctx, id, false)
	return st, err
}

// Job is a job in flight on a lease; End it when the job ends.
type Job struct {
	m    *Manager
	l    *lease
	once sync.Once
	err  error
}

// BeginJob starts a job (an exec) on the lease: a frozen lease is thawed
// first and a spilled one resumed, then the job holds the lease until
// End, and the worker releases its reservation so the job's processes
// can use the slice. A lease holds one job at a time: a second is
// refused (conflict, reason busy), also when it waited for the thaw the
// first one made.
func (m *Manager) BeginJob(ctx context.Context, id string) (*Job, error) {
	l, _, err := m.wake(ctx, id, true)
	if err != nil {
		if l != nil {
			// Committed but not saved: the job must not hold the lease.
			_ = (&Job{m: m, l: l}).End(ctx)
		}
		return nil, err
	}
	// The worker hands its reservation over to the job: the job's
	// processes allocate inside the slice, and the top-up at the job's end
	// takes back what they left.
	m.mu.Lock()
	spec := l.spec
	m.mu.Unlock()
	if rerr := m.worker.Reserve(ctx, targetOf(spec), 0); rerr != nil {
		m.log.Warn("gpu: release the reservation for a job", "lease", id, "err", rerr)
	}
	return &Job{m: m, l: l}, nil
}

// End ends the job: the worker tops its reservation up to its target (the
// sticky cap of the last resume still applies; see topUp), and the
// lease's idle clock restarts. Ending twice is harmless.
func (j *Job) End(ctx context.Context) error {
	j.once.Do(func() { j.err = j.m.endJob(ctx, j.l) })
	return j.err
}

// Exec runs fn as a job of the lease.
func (m *Manager) Exec(ctx context.Context, id string, fn func(ctx context.Context) error) error {
	job, err := m.BeginJob(ctx, id)
	if err != nil {
		return err
	}
	ferr := fn(ctx)
	return errors.Join(ferr, job.End(context.WithoutCancel(ctx)))
}

func (m *Manager) endJob(ctx context.Context, l *lease) error {
	m.mu.Lock()
	if !l.job || l.phase != PhaseResident {
		l.job = false
		m.mu.Unlock()
		return nil
	}
	spec, target := l.spec, l.target()
	m.mu.Unlock()
	// The top-up is part of the job, so no pause slips in between.
	rerr := m.worker.Reserve(ctx, targetOf(spec), m.topUp(ctx, spec, target))
	m.mu.Lock()
	l.job = false
	now := m.clock.Now()
	if l.phase == PhaseResident && !l.frozen {
		l.switchSeg(now, segIdle, false)
		l.lastActivity = now
	}
	l.reserveErr = ""
	if rerr != nil {
		l.reserveErr = rerr.Error()
	}
	m.mu.Unlock()
	return m.save(ctx, l)
}

// topUp is what the worker reserves after a job: its target (the sticky
// cap of the last resume applies), and on a hard-cap host no more than
// the slice leaves beside what the job's lingering processes still hold,
// so the top-up itself never pushes the lease over its slice. This bound
// is measured each time and is not sticky; an unreadable probe leaves the
// target as it is.
func (m *Manager) topUp(ctx context.Context, spec Spec, target int64) int64 {
	if !m.host.HardCap() {
		return target
	}
	u, err := m.host.Usage(ctx)
	if err != nil {
		return target
	}
	pids, err := m.host.Processes(ctx, spec.Group)
	if err != nil {
		return target
	}
	_, others := u.Split(pids, spec.WorkerPID)
	return min(target, max(0, spec.Accel.VRAMMiB-others))
}

type resumeResult struct {
	cap        *int64
	reserveErr string
	dead       bool
}

func (m *Manager) wake(ctx context.Context, id string, forJob bool) (*lease, Status, error) {
	m.mu.Lock()
	l, err := m.acquire(ctx, id)
	if err != nil {
		m.mu.Unlock()
		return nil, Status{}, err
	}
	now := m.clock.Now()
	switch {
	case l.phase == PhaseDead:
		m.mu.Unlock()
		return nil, Status{}, deadErr(l)
	case forJob && l.job:
		m.mu.Unlock()
		return nil, Status{}, busyErr(id, "exec on")
	case l.phase == PhaseResident && !l.frozen:
		if forJob {
			l.switchSeg(now, segBusy, false)
			l.job = true
			l.meters.Jobs++
		}
		st := l.status(now, m.cfg.ResumeGrace)
		m.mu.Unlock()
		return l, st, nil
	}
	spilled := l.phase == PhaseSuspended
	op := opThawing
	if spilled {
		op = opResuming
		l.switchSeg(now, segResume, false)
	}
	c := l.claim(op)
	spec := l.spec
	m.mu.Unlock()
	if err := m.save(ctx, l); err != nil {
		m.mu.Lock()
		if spilled {
			l.switchSeg(m.clock.Now(), segSuspended, false)
		}
		l.release(c)
		m.mu.Unlock()
		return nil, Status{}, err
	}

	var res resumeResult
	if spilled {
		res, err = m.restore(ctx, spec, forJob)
	} else if err = m.host.Thaw(ctx, spec.Group); err != nil {
		err = fmt.Errorf("gpu: thaw %s: %w", id, err)
	}

	m.mu.Lock()
	l.release(c)
	if l.phase == PhaseDestroyed {
		m.mu.Unlock()
		return nil, Status{}, gone(id, op)
	}
	now = m.clock.Now()
	if err != nil {
		if spilled && res.dead {
			l.closeSeg(now)
			l.phase, l.frozen, l.deadReason = PhaseDead, false, DeadRestoreFailed
		} else if spilled {
			l.switchSeg(now, segSuspended, false)
		}
		m.mu.Unlock()
		if res.dead {
			m.event(Event{LeaseID: id, Kind: EventDead, Reason: DeadRestoreFailed, At: now})
		}
		return nil, Status{}, errors.Join(err, m.save(ctx, l))
	}
	next := segIdle
	if forJob {
		next = segBusy
	}
	// Closing the frozen interval settles it by its own freeze-only mark;
	// the flag then clears, so the rest of the residency bills as usual.
	l.switchSeg(now, next, false)
	l.frozen, l.freezeOnly, l.freezeReason = false, false, ""
	if spilled {
		l.phase = PhaseResident
		l.capMiB = res.cap
		l.reserveErr = res.reserveErr
		l.resumedAt = now
		l.meters.Resumes++
	}
	l.lastActivity = now
	if forJob {
		l.job = true
		l.meters.Jobs++
	}
	st := l.status(now, m.cfg.ResumeGrace)
	m.mu.Unlock()
	return l, st, m.save(ctx, l)
}

// restore brings a spilled lease back: thaw (before restore), restore the
// worker, and re-reserve its slice minus what its other processes hold
// (for a job, at the job's end).
// A restore that fails leaves the lease spilled and frozen again.
func (m *Manager) restore(ctx context.Context, spec Spec, forJob bool) (resumeResult, error) {
	var res resumeResult
	if err := m.host.Thaw(ctx, spec.Group); err != nil {
		return res, fmt.Errorf("gpu: resume %s: thaw: %w", spec.ID, err)
	}
	if err := m.host.Restore(ctx, spec.WorkerPID); err != nil && !errors.Is(err, ErrNotCheckpointed) {
		if errors.Is(err, ErrNoProcess) {
			res.dead = true
			_ = m.kill(ctx, spec, false)
			return res, &torpor.Error{Code: torpor.EConflict, Reason: "dead",
				Message: fmt.Sprintf("cannot resume GPU lease %q: its worker is gone", spec.ID)}
		}
		// Still spilled: nothing may run while the lease reads suspended.
		if ferr := m.host.Freeze(ctx, spec.Group); ferr != nil {
			m.log.Error("gpu: refreeze after a failed restore", "lease", spec.ID, "err", ferr)
		}
		if errors.Is(err, ErrOutOfMemory) {
			return res, &torpor.Error{Code: torpor.EConflict, Reason: "capacity", RetryAfter: 2 * time.Second,
				Message: fmt.Sprintf("cannot resume GPU lease %q: the card has no room for it now: %v", spec.ID, err)}
		}
		return res, fmt.Errorf("gpu: resume %s: restore: %w", spec.ID, err)
	}
	var target int64
	res.cap, target = m.resumeCap(ctx, spec)
	if forJob {
		// The job would release the reservation at once; its end tops the
		// worker up to this target.
		return res, nil
	}
	if err := m.worker.Reserve(ctx, targetOf(spec), target); err != nil {
		res.reserveErr = err.Error()
		m.log.Warn("gpu: re-reserve after resume", "lease", spec.ID, "mib", target, "err", err)
	}
	return res, nil
}

// resumeCap computes the re-reserve of a resume. On a hard-cap host the
// worker re-reserves its slice minus the VRAM the lease's other processes
// still hold: cap = max(0, slice − non-worker VRAM), target = min(slice,
// cap), against the original slice target, so the lease settles at about
// its slice. Unreadable usage caps at 0: holding too little beats an
// overshoot that gets an innocent tenant killed. A host without a hard
// cap reserves without a cap: the full target.
func (m *Manager) resumeCap(ctx context.Context, spec Spec) (*int64, int64) {
	slice := spec.Accel.VRAMMiB
	if !m.host.HardCap() {
		return nil, slice
	}
	var c int64
	if u, err := m.host.Usage(ctx); err == nil {
		if pids, err := m.host.Processes(ctx, spec.Group); err == nil {
			_, others := u.Split(pids, spec.WorkerPID)
			c = max(0, slice-others)
		}
	}
	return &c, min(slice, c)
}
