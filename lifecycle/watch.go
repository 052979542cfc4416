package lifecycle

import (
	"context"
	"time"

	"github.com/torpor-dev/torpor"
)

type watcher struct{ cancel context.CancelFunc }

// watch follows a booted instance until it stops, so that an entrypoint
// that exits (or an instance that dies) turns its sandbox failed.
func (e *Engine) watch(id, handle string, rt torpor.Runtime) {
	ctx, cancel := context.WithCancel(e.bg)
	w := &watcher{cancel: cancel}
	e.watchMu.Lock()
	if old := e.watchers[id]; old != nil {
		old.cancel()
	}
	e.watchers[id] = w
	e.watchMu.Unlock()

	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		defer func() {
			e.watchMu.Lock()
			if e.watchers[id] == w {
				delete(e.watchers, id)
			}
			e.watchMu.Unlock()
			cancel()
		}()
		ref := torpor.InstanceRef{SandboxID: id, Handle: handle}
		st, err := e.waitInstance(ctx, rt, ref)
		if err != nil || ctx.Err() != nil {
			return
		}
		e.onExit(id, handle, st)
	}()
}

// waitInstance waits through the runtime, and falls back to polling when
// the runtime cannot wait.
func (e *Engine) waitInstance(ctx context.Context, rt torpor.Runtime, ref torpor.InstanceRef) (torpor.InstanceStatus, error) {
	st, err := rt.Wait(ctx, ref)
	if err == nil || ctx.Err() != nil {
		return st, err
	}
	e.log.Warn("cannot wait for instance; polling", "sandbox", ref.SandboxID, "err", err)
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return torpor.InstanceStatus{}, ctx.Err()
		case <-t.C:
		}
		st, err := rt.Inspect(ctx, ref)
		if err == nil && st.State != torpor.InstanceRunning && st.State != torpor.InstanceFrozen {
			return st, nil
		}
	}
}

// unwatch stops following a sandbox's instance (before the engine itself
// stops or replaces it).
func (e *Engine) unwatch(id string) {
	e.watchMu.Lock()
	defer e.watchMu.Unlock()
	if w := e.watchers[id]; w != nil {
		w.cancel()
		delete(e.watchers, id)
	}
}

// onExit records that an instance stopped on its own.
func (e *Engine) onExit(id, handle string, st torpor.InstanceStatus) {
	ctx := e.bg
	unlock := e.locks.Lock(id)
	defer unlock()
	sb, err := e.store.GetSandbox(ctx, id)
	if err != nil {
		return
	}
	if sb.Handle != handle || (sb.State != torpor.StateRunning && sb.State != torpor.StatePaused) {
		return // the engine moved it on itself
	}
	f := st.Failure
	if f == nil {
		f = &torpor.Failure{Code: torpor.FailureRuntime, Message: "the sandbox's instance stopped unexpectedly"}
	}
	if err := e.recordFailure(ctx, sb, f); err != nil {
		e.log.Error("recording failure", "sandbox", id, "err", err)
	}
	if sb.Pool != "" {
		e.memberLost(sb.Pool, id)
	}
}
