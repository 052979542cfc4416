package lifecycle

import (
	"context"
	"time"

	"github.com/torpor-dev/torpor"
)

// idlePauseMode is how the idle engine pauses sb: as its policy says, else
// the runtime's default.
func idlePauseMode(sb *torpor.Sandbox) torpor.PauseMode {
	if sb.Lifecycle != nil {
		return sb.Lifecycle.PauseMode
	}
	return ""
}

// sweep acts on a sandbox whose idle deadline passed. It re-reads the
// sandbox under its lock first, so an operation that got there first wins:
// the sweep then only reschedules.
func (e *Engine) sweep(ctx context.Context, id string) {
	unlock := e.locks.Lock(id)
	defer unlock()
	sb, err := e.store.GetSandbox(ctx, id)
	if err != nil {
		return
	}
	if e.finishCutShort(ctx, sb) {
		return
	}
	evs := plan(sb, e.maxPaused)
	if len(evs) == 0 {
		e.sched.remove(id)
		return
	}
	ev, now := evs[0], e.now()
	if ev.At.After(now) {
		e.sched.set(id, ev.At)
		return
	}
	e.obs.SweepLag(now.Sub(ev.At))
	if ev.Cause != CauseEnd && ev.Cause != CauseWakeup && e.deferIdle(ctx, sb, now) {
		return
	}
	switch ev.Action {
	case torpor.ActionPause:
		err = e.pause(ctx, sb, idlePauseMode(sb), ev.Cause)
	case torpor.ActionHibernate:
		err = e.hibernate(ctx, sb, ev.Cause)
	case torpor.ActionKill:
		err = e.terminate(ctx, sb, ev.Cause)
	case torpor.ActionArchive:
		err = e.archive(ctx, sb, ev.Cause)
	case torpor.ActionWake:
		err = e.wakeUp(ctx, sb, ev.Wakeup)
	}
	if err != nil {
		e.log.Error("idle action failed; retrying", "sandbox", id, "action", ev.Action, "err", err)
		e.sched.set(id, now.Add(sweepRetry))
	}
}

// deferIdle reports whether an idle action on sb must wait because the
// sandbox turns out to be active (pending traffic, an operation or a
// proxied request under way, CPU use), having rescheduled it. An end time
// never waits for activity.
func (e *Engine) deferIdle(ctx context.Context, sb *torpor.Sandbox, now time.Time) bool {
	id := sb.ID
	if t, ok := e.act.pendingTraffic(id); ok && sb.State == torpor.StateRunning && t.After(sb.LastActivityAt) {
		// Proxied traffic not yet flushed: it is activity.
		sb.LastActivityAt = t
		if err := e.save(ctx, sb); err != nil {
			e.sched.set(id, now.Add(sweepRetry))
		}
		return true
	}
	if sb.State == torpor.StateRunning && (e.act.busy(id) || e.act.requestsUnderWay(id)) {
		// An operation, or a proxied request waiting for its answer, is
		// in flight: it is activity. Look again later.
		e.sched.set(id, now.Add(sb.Policy().IdleAfter))
		return true
	}
	if sb.State == torpor.StateRunning && e.act.watchesCPU() {
		if busy, recheck := e.busyComputing(ctx, sb, now); busy {
			sb.LastActivityAt = now
			if err := e.save(ctx, sb, e.event(sb, "sandbox.activity", "source", "cpu")); err != nil {
				e.sched.set(id, now.Add(sweepRetry))
			}
			return true
		} else if recheck > 0 {
			e.sched.set(id, now.Add(recheck))
			return true
		}
	}
	return false
}

// busyComputing reads the sandbox's CPU use now and compares it with the
// last sample (see activity.computing). A runtime that cannot report CPU
// use never makes a sandbox busy.
func (e *Engine) busyComputing(ctx context.Context, sb *torpor.Sandbox, now time.Time) (busy bool, recheck time.Duration) {
	rt, err := e.runtime(sb.Runtime.Kind)
	if err != nil {
		return false, 0
	}
	cr, ok := rt.(torpor.CPUReporter)
	if !ok {
		return false, 0
	}
	used, err := cr.CPUUsage(ctx, ref(sb))
	if err != nil {
		return false, 0
	}
	return e.act.computing(sb.ID, used, now, sb.Policy().IdleAfter)
}

// sweepRetry is how long a failed idle action waits before its next try.
const sweepRetry = 30 * time.Second
