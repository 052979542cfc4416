package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/torpor-dev/torpor"
)

// Deadlines bound the runtime calls a transition makes while it holds its
// sandbox's lock. A call that does not come back within its bound fails
// its transition (see docs/lifecycle.md), so that no request, and no verb
// queued behind it on the sandbox, waits for a runtime that stopped
// answering. They are wall-clock bounds on work outside the engine, not
// policy: they do not follow the engine's injected clock.
type Deadlines struct {
	// Freeze bounds a freeze or a thaw.
	Freeze time.Duration
	// Stop bounds a stop (hibernate) or a destroy (delete).
	Stop time.Duration
	// Snapshot bounds writing a snapshot (pause by snapshot) or restoring
	// one (resume).
	Snapshot time.Duration
	// Boot bounds a boot, its setup commands included.
	Boot time.Duration
}

// DefaultDeadlines are the bounds a zero field of Config.Deadlines takes.
var DefaultDeadlines = Deadlines{
	Freeze:   10 * time.Second,
	Stop:     2 * time.Minute,
	Snapshot: 15 * time.Minute,
	Boot:     15 * time.Minute,
}

// orDefault fills d's zero fields from DefaultDeadlines.
func (d Deadlines) orDefault() Deadlines {
	pick := func(v, def time.Duration) time.Duration {
		if v > 0 {
			return v
		}
		return def
	}
	return Deadlines{
		Freeze:   pick(d.Freeze, DefaultDeadlines.Freeze),
		Stop:     pick(d.Stop, DefaultDeadlines.Stop),
		Snapshot: pick(d.Snapshot, DefaultDeadlines.Snapshot),
		Boot:     pick(d.Boot, DefaultDeadlines.Boot),
	}
}

// DefaultDrainTimeout is how long a pause or hibernation waits for the
// operations in flight on its sandbox when Config.DrainTimeout is 0.
const DefaultDrainTimeout = 5 * time.Second

// timedOut is the error of a runtime call that did not come back within
// d: the runtime did not answer in time, which a retry may not meet again.
func timedOut(what string, d time.Duration) error {
	return &torpor.Error{Code: torpor.EUnavailable, Reason: "runtime_timeout", RetryAfter: time.Second,
		Message: fmt.Sprintf("the %s did not finish within %s", what, d)}
}

type callResult[T any] struct {
	v   T
	err error
}

// callGrace is how long a runtime call that reached its deadline gets to
// come back (as one that honours its context does at once) before the
// engine stops waiting for it.
const callGrace = 100 * time.Millisecond

// bounded runs call, a runtime call named what, and gives up on it after
// d: call's context ends then, and bounded returns timedOut without
// waiting long for a runtime that ignores its context. Such a call may
// still come back later; late, when set, is told its outcome then (if the
// engine is still open), so that what it did after all can be undone.
func bounded[T any](e *Engine, ctx context.Context, what string, d time.Duration, call func(context.Context) (T, error), late func(error)) (T, error) {
	cctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	res := make(chan callResult[T], 1)
	go func() {
		v, err := call(cctx)
		res <- callResult[T]{v, err}
	}()
	expired := time.NewTimer(d)
	defer expired.Stop()
	var r callResult[T]
	select {
	case r = <-res:
	case <-expired.C:
		select {
		case r = <-res:
		case <-time.After(callGrace):
			abandon(e, what, d, res, late)
			var zero T
			return zero, timedOut(what, d)
		}
	}
	if r.err != nil && ctx.Err() == nil && errors.Is(cctx.Err(), context.DeadlineExceeded) {
		return r.v, timedOut(what, d)
	}
	return r.v, r.err
}

// abandon stops waiting for a runtime call that did not come back within
// d, and tells late of its outcome if it ever comes.
func abandon[T any](e *Engine, what string, d time.Duration, res <-chan callResult[T], late func(error)) {
	e.log.Warn("a runtime call did not come back in time", "call", what, "within", d)
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		select {
		case r := <-res:
			e.log.Warn("a runtime call came back late", "call", what, "err", r.err)
			if late != nil {
				late(r.err)
			}
		case <-e.bg.Done():
		}
	}()
}

// boundedErr is bounded for a call that returns only an error.
func boundedErr(e *Engine, ctx context.Context, what string, d time.Duration, call func(context.Context) error, late func(error)) error {
	_, err := bounded(e, ctx, what, d, func(ctx context.Context) (struct{}, error) { return struct{}{}, call(ctx) }, late)
	return err
}

// The runtime calls of transitions, each within its deadline and on a
// context the caller's going away does not end: a transition, once begun,
// finishes or fails on the server's terms.

func (e *Engine) freezeInstance(ctx context.Context, rt torpor.Runtime, sb *torpor.Sandbox) error {
	handle := sb.Handle
	return boundedErr(e, context.WithoutCancel(ctx), "freeze", e.deadlines.Freeze, func(ctx context.Context) error {
		return rt.Freeze(ctx, ref(sb))
	}, func(err error) {
		if err == nil {
			e.thawLate(rt, sb.ID, handle)
		}
	})
}

// thawLate thaws an instance whose freeze came back after the pause had
// given up on it and put the sandbox back to running, unless the sandbox
// moved on meanwhile.
func (e *Engine) thawLate(rt torpor.Runtime, id, handle string) {
	unlock := e.locks.Lock(id)
	defer unlock()
	sb, err := e.store.GetSandbox(e.bg, id)
	if err != nil || sb.State != torpor.StateRunning || sb.Handle != handle {
		return
	}
	if err := e.thawInstance(e.bg, rt, sb); err != nil {
		e.log.Error("thawing a sandbox a late freeze froze", "sandbox", id, "err", err)
	}
}

func (e *Engine) thawInstance(ctx context.Context, rt torpor.Runtime, sb *torpor.Sandbox) error {
	return boundedErr(e, context.WithoutCancel(ctx), "thaw", e.deadlines.Freeze, func(ctx context.Context) error {
		return rt.Thaw(ctx, ref(sb))
	}, nil)
}

func (e *Engine) stopRuntime(ctx context.Context, rt torpor.Runtime, sb *torpor.Sandbox) error {
	return boundedErr(e, context.WithoutCancel(ctx), "stop", e.deadlines.Stop, func(ctx context.Context) error {
		return rt.Stop(ctx, ref(sb))
	}, nil)
}

func (e *Engine) destroyInstance(ctx context.Context, rt torpor.Runtime, sb *torpor.Sandbox) error {
	return boundedErr(e, context.WithoutCancel(ctx), "destroy", e.deadlines.Stop, func(ctx context.Context) error {
		return rt.Destroy(ctx, ref(sb))
	}, nil)
}

func (e *Engine) snapshotInstance(ctx context.Context, snap torpor.Snapshotter, sb *torpor.Sandbox) (torpor.SnapshotInfo, error) {
	return bounded(e, context.WithoutCancel(ctx), "snapshot", e.deadlines.Snapshot, func(ctx context.Context) (torpor.SnapshotInfo, error) {
		return snap.Snapshot(ctx, ref(sb))
	}, nil)
}

func (e *Engine) restoreInstance(ctx context.Context, snap torpor.Snapshotter, sb *torpor.Sandbox) (string, error) {
	return bounded(e, context.WithoutCancel(ctx), "restore", e.deadlines.Snapshot, func(ctx context.Context) (string, error) {
		return snap.Restore(ctx, ref(sb))
	}, nil)
}

// bootRuntime boots within the boot deadline. Unlike the other calls it
// keeps the caller's context: a create whose caller went away leaves its
// boot to the next reconcile (see boot).
func (e *Engine) bootRuntime(ctx context.Context, rt torpor.Runtime, spec torpor.BootSpec) (string, error) {
	return bounded(e, ctx, "boot", e.deadlines.Boot, func(ctx context.Context) (string, error) {
		return rt.Boot(ctx, spec)
	}, nil)
}
