package lifecycle

import (
	"context"
	"fmt"

	"github.com/torpor-dev/torpor"
)

// reconcile brings every stored sandbox and every runtime instance into
// agreement after a start: running instances are adopted, half-done
// transitions are finished (or rolled back where finishing is impossible),
// and instances or disks that no live sandbox owns are removed.
func (e *Engine) reconcile(ctx context.Context) error {
	// A node reconciles its own sandboxes; the instances it holds of
	// others' (a node declared down that comes back) are leftovers.
	sbs, err := e.store.ListSandboxes(ctx, torpor.SandboxFilter{Node: e.node})
	if err != nil {
		return fmt.Errorf("reconcile: %w", err)
	}
	live := map[string]bool{}
	for _, sb := range sbs {
		if !e.mine(sb) {
			// Held before the node was declared down: the fleet settles
			// it, and what is here of it is a leftover.
			continue
		}
		live[sb.ID] = true
		if err := e.reconcileOne(ctx, sb.ID); err != nil {
			e.log.Error("reconcile", "sandbox", sb.ID, "state", sb.State, "err", err)
		}
	}
	for _, rt := range e.runtimes {
		ids, err := rt.List(ctx)
		if err != nil {
			return fmt.Errorf("reconcile: list %s instances: %w", rt.Kind(), err)
		}
		for _, id := range ids {
			if live[id] {
				continue
			}
			e.log.Info("removing leftover instance", "sandbox", id, "runtime", rt.Kind())
			if err := rt.Destroy(ctx, torpor.InstanceRef{SandboxID: id}); err != nil {
				e.log.Error("removing leftover instance", "sandbox", id, "err", err)
			}
		}
	}
	e.sweepCheckpoints(ctx)
	return nil
}

func (e *Engine) reconcileOne(ctx context.Context, id string) error {
	unlock := e.locks.Lock(id)
	defer unlock()
	sb, err := e.store.GetSandbox(ctx, id)
	if err != nil {
		return err
	}
	return e.reconcileSandbox(ctx, sb)
}

// reconcileSandbox is reconcileOne of sb, whose lock the caller holds.
func (e *Engine) reconcileSandbox(ctx context.Context, sb *torpor.Sandbox) error {
	rt, err := e.runtime(sb.Runtime.Kind)
	if err != nil {
		return e.recordFailure(ctx, sb, &torpor.Failure{Code: torpor.FailureRuntime,
			Message: fmt.Sprintf("runtime %q is not configured on this server", sb.Runtime.Kind)})
	}
	// A checkpoint, fork or restore cut short first: it may end sb (a
	// fork that never stood) or its instance (a restore).
	if err := e.reconcileCheckpoints(ctx, rt, sb); err != nil || sb.State == torpor.StateTerminated {
		return err
	}
	st, err := rt.Inspect(ctx, ref(sb))
	if err != nil {
		return err
	}
	alive := st.State == torpor.InstanceRunning || st.State == torpor.InstanceFrozen
	e.log.Info("reconciling", "sandbox", sb.ID, "state", sb.State, "instance", st.State)
	if !alive {
		if err := e.closeLost(ctx, sb); err != nil {
			return err
		}
	}
	if sb.Tenant == torpor.PoolTenant && sb.State != torpor.StateTerminated {
		// A warm pool's member still frozen is adopted as it is; any other
		// (a boot or a claim cut short, an instance lost) is removed, and
		// the refill boots its replacement (pool.go).
		if sb.Pool != "" && sb.State == torpor.StatePaused && sb.PauseMode == torpor.PauseFreeze && st.State == torpor.InstanceFrozen {
			e.watch(sb.ID, sb.Handle, rt)
			return nil
		}
		return e.terminate(ctx, sb, CauseReconcile)
	}
	if done, err := e.reconcileArchive(ctx, rt, sb, st); done || err != nil {
		return err
	}

	switch sb.State {
	case torpor.StateStarting, torpor.StateRestarting:
		// The boot's outcome was never recorded: boot again from scratch.
		return e.coldStart(ctx, sb, sb.State, torpor.EventStarted, CauseReconcile)

	case torpor.StateRunning, torpor.StateResuming:
		if sb.State == torpor.StateResuming && sb.PauseMode == torpor.PauseSnapshot && !alive {
			return e.resume(ctx, sb, CauseReconcile)
		}
		switch st.State {
		case torpor.InstanceFrozen:
			if err := e.thawInstance(ctx, rt, sb); err != nil {
				return err
			}
			fallthrough
		case torpor.InstanceRunning:
			e.watch(sb.ID, sb.Handle, rt)
			sb.PauseMode = ""
			// Activity noted in memory and not yet flushed (operations,
			// traffic: see operate) died with the daemon. The restart
			// counts as activity, so that it can put an idle pause off
			// but never bring one early.
			sb.LastActivityAt = e.now()
			return e.setState(ctx, sb, torpor.StateRunning, e.event(sb, torpor.EventReconciled, "instance", string(st.State)))
		case torpor.InstanceStopped:
			return e.recordFailure(ctx, sb, stoppedFailure(st))
		default: // lost with the host: boot it again on its disk
			return e.coldStart(ctx, sb, torpor.StateStarting, torpor.EventStarted, CauseReconcile)
		}

	case torpor.StatePausing, torpor.StatePaused:
		if !alive && sb.PauseMode == torpor.PauseSnapshot && (st.DiskExists || (sb.State == torpor.StatePaused && releasable(sb))) {
			// A snapshot pause ends the instance: nothing was lost. One
			// cut short shows when it is restored. One taken from another
			// node has its state in the object store until its resume.
			if sb.State == torpor.StatePausing {
				// The snapshot was written but not recorded: what it holds
				// is billed from its size, so ask the runtime for it.
				e.recoverSnapshot(ctx, rt, sb)
				return e.setState(ctx, sb, torpor.StatePaused, e.event(sb, torpor.EventPaused, "cause", CauseReconcile, "mode", string(sb.PauseMode)))
			}
			return nil
		}
		if !alive {
			// The processes are gone; the disk is what is left.
			sb.Handle, sb.PauseMode = "", ""
			return e.setState(ctx, sb, torpor.StateHibernated,
				e.event(sb, torpor.EventHibernated, "cause", CauseReconcile, "reason", "instance lost while paused"))
		}
		if st.State == torpor.InstanceRunning {
			sb.State = torpor.StatePausing
			mode := sb.PauseMode
			if err := e.pause(ctx, sb, mode, CauseReconcile); err != nil {
				return err
			}
		} else if sb.State == torpor.StatePausing {
			if err := e.setState(ctx, sb, torpor.StatePaused, e.event(sb, torpor.EventPaused, "cause", CauseReconcile, "mode", string(sb.PauseMode))); err != nil {
				return err
			}
		}
		if sb.PauseMode == torpor.PauseSnapshot {
			// The pause just finished wrote the instance to disk and ended
			// it: a watcher would take that for a death and fail it.
			return nil
		}
		e.watch(sb.ID, sb.Handle, rt)
		return nil

	case torpor.StateHibernating:
		return e.hibernate(ctx, sb, CauseReconcile)

	case torpor.StateTerminating:
		return e.terminate(ctx, sb, CauseReconcile)

	case torpor.StateHibernated, torpor.StateFailed:
		if alive {
			return e.stopRuntime(ctx, rt, sb)
		}
	}
	return nil
}

func stoppedFailure(st torpor.InstanceStatus) *torpor.Failure {
	if st.Failure != nil {
		return st.Failure
	}
	return &torpor.Failure{Code: torpor.FailureRuntime, Message: "the sandbox's instance stopped while the daemon was down"}
}

// recoverSnapshot records the snapshot of a sandbox whose snapshot pause
// ended its instance before the pause was stored: a runtime asked to
// snapshot a snapshotted instance returns the snapshot it has. Without a
// complete one nothing is recorded, and the resume finds out.
func (e *Engine) recoverSnapshot(ctx context.Context, rt torpor.Runtime, sb *torpor.Sandbox) {
	snap, ok := rt.(torpor.Snapshotter)
	if !ok || sb.Snapshot != nil {
		return
	}
	info, err := snap.Snapshot(ctx, ref(sb))
	if err != nil {
		e.log.Warn("no snapshot of a sandbox paused by snapshot", "sandbox", sb.ID, "err", err)
		return
	}
	sb.Snapshot = &info
}
