package lifecycle

import (
	"context"
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/torpor-dev/torpor"
)

// Causes recorded on events: who asked for a transition.
const (
	CauseAPI       = "api"
	CauseReconcile = "reconcile"
)

// MaxExecTimeout bounds one command's run time.
const MaxExecTimeout = 24 * time.Hour

// withSandbox locks id, loads tenant's sandbox and runs fn on it. Every
// verb runs inside it, so transitions of one sandbox never interleave.
func (e *Engine) withSandbox(ctx context.Context, tenant, id string, fn func(sb *torpor.Sandbox) error) (*torpor.Sandbox, error) {
	unlock := e.locks.lock(id)
	defer unlock()
	sb, err := e.load(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	if err := fn(sb); err != nil {
		return nil, err
	}
	return sb, nil
}

func ref(sb *torpor.Sandbox) torpor.InstanceRef {
	return torpor.InstanceRef{SandboxID: sb.ID, Handle: sb.Handle}
}

// Pause stops a running sandbox's processes. A paused sandbox is returned
// as it is. An empty mode is the runtime's first (freeze for runc).
func (e *Engine) Pause(ctx context.Context, tenant, id string, mode torpor.PauseMode) (*torpor.Sandbox, error) {
	return e.withSandbox(ctx, tenant, id, func(sb *torpor.Sandbox) error {
		return e.pause(ctx, sb, mode, CauseAPI)
	})
}

func (e *Engine) pause(ctx context.Context, sb *torpor.Sandbox, mode torpor.PauseMode, cause string) error {
	switch sb.State {
	case torpor.StatePaused:
		return nil
	case torpor.StateRunning, torpor.StatePausing:
	case torpor.StateTerminated:
		return gone(sb)
	default:
		return torpor.WrongState("pause", sb.State)
	}
	rt, err := e.runtime(sb.Runtime.Kind)
	if err != nil {
		return err
	}
	if mode == "" {
		mode = rt.PauseModes()[0]
	}
	if !supports(rt, mode) {
		return torpor.Invalid("mode", "the %s runtime cannot pause by %q; it can: %v", rt.Kind(), mode, rt.PauseModes())
	}
	sb.PauseMode = mode
	if err := e.setState(ctx, sb, torpor.StatePausing); err != nil {
		return err
	}
	e.fail("pausing.before-runtime")
	if err := rt.Freeze(ctx, ref(sb)); err != nil {
		_ = rt.Thaw(context.WithoutCancel(ctx), ref(sb))
		sb.PauseMode = ""
		ev := e.event(sb, "sandbox.pause_failed", "error", err.Error())
		if rerr := e.setState(ctx, sb, torpor.StateRunning, ev); rerr != nil {
			return rerr
		}
		return fmt.Errorf("pause %s: %w", sb.ID, err)
	}
	e.fail("pausing.after-runtime")
	return e.setState(ctx, sb, torpor.StatePaused, e.event(sb, torpor.EventPaused, "cause", cause, "mode", string(mode)))
}

func supports(rt torpor.Runtime, mode torpor.PauseMode) bool {
	for _, m := range rt.PauseModes() {
		if m == mode {
			return true
		}
	}
	return false
}

// Start continues a paused sandbox where it stopped, or boots a hibernated
// (or failed) one fresh on its disk. A running sandbox is returned as it is.
func (e *Engine) Start(ctx context.Context, tenant, id string) (*torpor.Sandbox, error) {
	return e.withSandbox(ctx, tenant, id, func(sb *torpor.Sandbox) error {
		return e.start(ctx, sb, CauseAPI)
	})
}

func (e *Engine) start(ctx context.Context, sb *torpor.Sandbox, cause string) error {
	switch sb.State {
	case torpor.StateRunning:
		return nil
	case torpor.StatePaused, torpor.StateResuming:
		return e.resume(ctx, sb, cause)
	case torpor.StateHibernated, torpor.StateFailed, torpor.StateStarting:
		return e.coldStart(ctx, sb, torpor.StateStarting, torpor.EventStarted)
	case torpor.StateTerminated:
		return gone(sb)
	}
	return torpor.WrongState("start", sb.State)
}

func (e *Engine) resume(ctx context.Context, sb *torpor.Sandbox, cause string) error {
	rt, err := e.runtime(sb.Runtime.Kind)
	if err != nil {
		return err
	}
	if err := e.setState(ctx, sb, torpor.StateResuming); err != nil {
		return err
	}
	e.fail("resuming.before-runtime")
	if err := rt.Thaw(ctx, ref(sb)); err != nil {
		if rerr := e.setState(ctx, sb, torpor.StatePaused); rerr != nil {
			return rerr
		}
		return fmt.Errorf("resume %s: %w", sb.ID, err)
	}
	e.fail("resuming.after-runtime")
	sb.PauseMode = ""
	sb.LastActivityAt = e.now()
	return e.setState(ctx, sb, torpor.StateRunning, e.event(sb, torpor.EventResumed, "cause", cause, "auto", "false"))
}

// coldStart boots sb fresh on its disk through the in-between state via.
func (e *Engine) coldStart(ctx context.Context, sb *torpor.Sandbox, via torpor.State, evType string) error {
	rt, err := e.runtime(sb.Runtime.Kind)
	if err != nil {
		return err
	}
	tmpl, err := e.store.GetTemplate(ctx, sb.Template)
	if err != nil {
		return fmt.Errorf("template %s of sandbox %s: %w", sb.Template, sb.ID, err)
	}
	sb.LastActivityAt = e.now()
	if err := e.setState(ctx, sb, via); err != nil {
		return err
	}
	e.fail(string(via) + ".before-runtime")
	return e.boot(ctx, sb, rt, *tmpl, evType)
}

// Hibernate ends a running or paused sandbox's processes and keeps its disk.
func (e *Engine) Hibernate(ctx context.Context, tenant, id string) (*torpor.Sandbox, error) {
	return e.withSandbox(ctx, tenant, id, func(sb *torpor.Sandbox) error {
		return e.hibernate(ctx, sb, CauseAPI)
	})
}

func (e *Engine) hibernate(ctx context.Context, sb *torpor.Sandbox, cause string) error {
	switch sb.State {
	case torpor.StateHibernated:
		return nil
	case torpor.StateRunning, torpor.StatePaused, torpor.StateHibernating:
	case torpor.StateTerminated:
		return gone(sb)
	default:
		return torpor.WrongState("hibernate", sb.State)
	}
	rt, err := e.runtime(sb.Runtime.Kind)
	if err != nil {
		return err
	}
	e.unwatch(sb.ID)
	if err := e.setState(ctx, sb, torpor.StateHibernating); err != nil {
		return err
	}
	e.fail("hibernating.before-runtime")
	if err := rt.Stop(ctx, ref(sb)); err != nil {
		return fmt.Errorf("hibernate %s: %w", sb.ID, err)
	}
	e.fail("hibernating.after-runtime")
	sb.Handle, sb.PauseMode = "", ""
	return e.setState(ctx, sb, torpor.StateHibernated, e.event(sb, torpor.EventHibernated, "cause", cause))
}

// Restart boots a running sandbox again on a fresh instance; its disk stays.
func (e *Engine) Restart(ctx context.Context, tenant, id string) (*torpor.Sandbox, error) {
	return e.withSandbox(ctx, tenant, id, func(sb *torpor.Sandbox) error {
		switch sb.State {
		case torpor.StateRunning, torpor.StateRestarting:
			return e.coldStart(ctx, sb, torpor.StateRestarting, torpor.EventRestarted)
		case torpor.StateTerminated:
			return gone(sb)
		}
		return torpor.WrongState("restart", sb.State)
	})
}

// Touch records activity on a sandbox.
func (e *Engine) Touch(ctx context.Context, tenant, id string) (*torpor.Sandbox, error) {
	return e.withSandbox(ctx, tenant, id, func(sb *torpor.Sandbox) error {
		if sb.State == torpor.StateTerminated {
			return gone(sb)
		}
		sb.LastActivityAt = e.now()
		return e.store.UpdateSandbox(ctx, sb)
	})
}

// Delete ends a sandbox and removes its disk; the record stays, terminated.
func (e *Engine) Delete(ctx context.Context, tenant, id string) (*torpor.Sandbox, error) {
	return e.withSandbox(ctx, tenant, id, func(sb *torpor.Sandbox) error {
		return e.terminate(ctx, sb, CauseAPI)
	})
}

func (e *Engine) terminate(ctx context.Context, sb *torpor.Sandbox, cause string) error {
	if sb.State == torpor.StateTerminated {
		return nil
	}
	rt, err := e.runtime(sb.Runtime.Kind)
	if err != nil {
		return err
	}
	e.unwatch(sb.ID)
	if err := e.setState(ctx, sb, torpor.StateTerminating); err != nil {
		return err
	}
	e.fail("terminating.before-runtime")
	if err := rt.Destroy(ctx, ref(sb)); err != nil {
		return fmt.Errorf("delete %s: %w", sb.ID, err)
	}
	e.fail("terminating.after-runtime")
	now := e.now()
	sb.TerminatedAt = &now
	sb.Handle, sb.PauseMode = "", ""
	return e.setState(ctx, sb, torpor.StateTerminated, e.event(sb, torpor.EventTerminated, "cause", cause))
}

// Exec runs a command in a running sandbox and counts as activity.
func (e *Engine) Exec(ctx context.Context, tenant, id string, req torpor.ExecRequest) (torpor.ExecResult, error) {
	if err := validateExec(req); err != nil {
		return torpor.ExecResult{}, err
	}
	var rt torpor.Runtime
	sb, err := e.withSandbox(ctx, tenant, id, func(sb *torpor.Sandbox) error {
		switch sb.State {
		case torpor.StateRunning:
		case torpor.StatePaused, torpor.StateHibernated:
			return &torpor.Error{Code: torpor.EConflict, State: sb.State, Reason: "state",
				Message: fmt.Sprintf("sandbox %s is %s; call start (or connect) first", sb.ID, sb.State)}
		case torpor.StateTerminated:
			return gone(sb)
		default:
			return torpor.WrongState("exec in", sb.State)
		}
		var err error
		if rt, err = e.runtime(sb.Runtime.Kind); err != nil {
			return err
		}
		sb.LastActivityAt = e.now()
		return e.store.UpdateSandbox(ctx, sb)
	})
	if err != nil {
		return torpor.ExecResult{}, err
	}
	return rt.Exec(ctx, ref(sb), req)
}

func validateExec(req torpor.ExecRequest) error {
	if err := torpor.ValidateArgv("cmd", req.Cmd, false); err != nil {
		return err
	}
	if err := torpor.ValidateEnv(req.Env); err != nil {
		return err
	}
	if req.Cwd != "" && (!path.IsAbs(req.Cwd) || strings.ContainsRune(req.Cwd, 0) || len(req.Cwd) > 4096) {
		return torpor.Invalid("cwd", "must be an absolute path")
	}
	if req.Timeout < 0 || req.Timeout > MaxExecTimeout {
		return torpor.Invalid("timeout_seconds", "must be between 0 and %d", int(MaxExecTimeout.Seconds()))
	}
	return nil
}
