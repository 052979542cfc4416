package lifecycle

import (
	"context"
	"fmt"
	"math"
	"time"

	"github.com/torpor-dev/torpor"
)

// EndChange says how SetEnd moves a sandbox's end time (Sandbox.EndAt).
type EndChange struct {
	// In puts the end at now + In.
	In time.Duration
	// LaterOnly keeps an end that is already later, and a sandbox without
	// an end stays without (E2B's refresh, and connect to a running
	// sandbox).
	LaterOnly bool
	// Renew makes In the run time each later start or resume grants
	// (Sandbox.EndAfterSeconds), when the end moves.
	Renew bool
}

// maxEnd bounds how far ahead an end may be put.
const maxEnd = torpor.MaxPolicySeconds * time.Second

// SetEnd moves a running sandbox's end time (E2B's setTimeout and
// refresh). The end of a paused or hibernated sandbox does not run, so
// setting it is a conflict there: connect first.
func (e *Engine) SetEnd(ctx context.Context, tenant, id string, c EndChange) (*torpor.Sandbox, error) {
	if err := checkEndIn(c.In); err != nil {
		return nil, err
	}
	return e.withSandbox(ctx, tenant, id, func(sb *torpor.Sandbox) error {
		switch sb.State {
		case torpor.StateRunning:
		case torpor.StateTerminated:
			return gone(sb)
		default:
			return &torpor.Error{Code: torpor.EConflict, State: sb.State, Reason: "state",
				Message: fmt.Sprintf("sandbox %s is %s: its end time runs only while it runs; connect to it first", sb.ID, sb.State)}
		}
		return e.moveEnd(ctx, sb, c)
	})
}

func checkEndIn(d time.Duration) error {
	if d < 0 || d > maxEnd {
		return torpor.Invalid("timeout", "must be between 0 and %d seconds", torpor.MaxPolicySeconds)
	}
	return nil
}

func (e *Engine) moveEnd(ctx context.Context, sb *torpor.Sandbox, c EndChange) error {
	at := e.now().Add(c.In)
	if c.LaterOnly && (sb.EndAt == nil || !at.After(*sb.EndAt)) {
		return nil // what it has is later already
	}
	sb.EndAt = &at
	if secs := endSeconds(c.In); c.Renew && secs > 0 {
		sb.EndAfterSeconds = secs
	}
	return e.save(ctx, sb, e.event(sb, "sandbox.end_set", "end_at", sb.EndAt.Format(time.RFC3339Nano)))
}

// endSeconds is d in whole seconds, rounded up.
func endSeconds(d time.Duration) int64 { return int64(math.Ceil(d.Seconds())) }

// Connect makes a sandbox run for at least d from now (E2B's connect): a
// running one's end moves later, never earlier; a paused, hibernated or
// failed one is started (a paused one continues from memory, a hibernated
// one boots on its disk) with its end at now + d. Either way d becomes the
// run time each later resume grants. resumed says whether it was woken.
func (e *Engine) Connect(ctx context.Context, tenant, id string, d time.Duration) (sb *torpor.Sandbox, resumed bool, err error) {
	if err := checkEndIn(d); err != nil {
		return nil, false, err
	}
	sb, err = e.withSandbox(ctx, tenant, id, func(sb *torpor.Sandbox) error {
		switch sb.State {
		case torpor.StateRunning:
			return e.moveEnd(ctx, sb, EndChange{In: d, LaterOnly: true, Renew: true})
		case torpor.StateTerminated:
			return gone(sb)
		}
		if secs := endSeconds(d); secs > 0 {
			sb.EndAfterSeconds = secs
		}
		if err := e.start(ctx, sb, CauseAPI); err != nil {
			return err
		}
		resumed = true
		return nil
	})
	return sb, resumed, err
}

// ResourceUsage returns one of tenant's sandboxes with what its instance uses now,
// as far as its runtime can tell (nothing for a sandbox without an
// instance). It is not activity and wakes nothing.
func (e *Engine) ResourceUsage(ctx context.Context, tenant, id string) (*torpor.Sandbox, torpor.ResourceUsage, error) {
	var u torpor.ResourceUsage
	sb, err := e.withSandbox(ctx, tenant, id, func(sb *torpor.Sandbox) error {
		if sb.State != torpor.StateRunning && sb.State != torpor.StatePaused {
			return nil
		}
		if sb.State == torpor.StatePaused && sb.PauseMode == torpor.PauseSnapshot {
			return nil // the instance is on disk: it uses no CPU and no memory
		}
		rt, err := e.runtime(sb.Runtime.Kind)
		if err != nil {
			return nil
		}
		if ur, ok := rt.(torpor.UsageReporter); ok {
			got, err := ur.ResourceUsage(ctx, ref(sb))
			if err != nil {
				e.log.Debug("resource usage", "sandbox", sb.ID, "err", err)
			} else {
				u = got
			}
		}
		if cr, ok := rt.(torpor.CPUReporter); ok && u.CPU == nil {
			if used, err := cr.CPUUsage(ctx, ref(sb)); err == nil {
				u.CPU = &used
			}
		}
		return nil
	})
	if err != nil {
		return nil, torpor.ResourceUsage{}, err
	}
	return sb, u, nil
}
