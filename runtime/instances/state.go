package instances

import (
	"context"
	"fmt"
	"path"
	"strings"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/initproc"
	"github.com/torpor-dev/torpor/keyedmutex"
)

// CheckRef validates the sandbox id (before it reaches any path) and,
// with parseHandle (the runtime's own format), the handle; it returns the
// id.
func CheckRef(ref torpor.InstanceRef, parseHandle func(id, handle string) error) (string, error) {
	if !torpor.ValidID(ref.SandboxID) {
		return "", torpor.Invalid("sandbox_id", "invalid sandbox id %q", ref.SandboxID)
	}
	if err := parseHandle(ref.SandboxID, ref.Handle); err != nil {
		return "", err
	}
	return ref.SandboxID, nil
}

// Live reports whether the status is of an instance that runs or is
// frozen: one that Wait waits for and Stop has to end.
func Live(st torpor.InstanceStatus) bool {
	return st.State == torpor.InstanceRunning || st.State == torpor.InstanceFrozen
}

// StateError refuses a verb that needs a live instance: not_found when
// there is none, conflict when it has stopped; nil for a live one.
func StateError(verb string, st torpor.InstanceStatus) error {
	switch st.State {
	case torpor.InstanceMissing:
		return torpor.Errorf(torpor.ENotFound, "cannot %s: the sandbox has no instance", verb)
	case torpor.InstanceStopped:
		return &torpor.Error{Code: torpor.EConflict, Reason: "state",
			Message: fmt.Sprintf("cannot %s: the sandbox's instance has stopped", verb)}
	}
	return nil
}

// ExecStateError refuses exec (and everything that talks to processes
// inside the sandbox) into an instance that is not running: a frozen one
// as a paused sandbox, others as StateError does.
func ExecStateError(st torpor.InstanceStatus) error {
	if st.State == torpor.InstanceFrozen {
		return torpor.WrongState("exec in", torpor.StatePaused)
	}
	return StateError("exec", st)
}

// Inspector is the part of a torpor.Runtime that the helpers here ask
// about an instance.
type Inspector interface {
	Inspect(ctx context.Context, ref torpor.InstanceRef) (torpor.InstanceStatus, error)
}

// ExecRefusal explains a conversation with a process inside sandbox id
// that broke off: when the instance has stopped or frozen meanwhile, it
// returns the refusal ExecStateError makes of that; nil when the instance
// still runs (or cannot be inspected), and the break is the caller's to
// report.
func ExecRefusal(ctx context.Context, rt Inspector, id string) error {
	st, err := rt.Inspect(ctx, torpor.InstanceRef{SandboxID: id})
	if err != nil {
		return nil
	}
	return ExecStateError(st)
}

// Inspect checks ref with checkRef and returns the status inspect finds
// of its instance: a runtime's Inspect.
func Inspect[I any](ctx context.Context, ref torpor.InstanceRef, checkRef func(torpor.InstanceRef) (string, error), inspect func(context.Context, string) (torpor.InstanceStatus, I, error)) (torpor.InstanceStatus, error) {
	id, err := checkRef(ref)
	if err != nil {
		return torpor.InstanceStatus{}, err
	}
	st, _, err := inspect(ctx, id)
	return st, err
}

// Wait checks ref with checkRef and blocks until inspect finds its
// instance neither running nor frozen, or ctx ends, and returns that
// status as Inspect would: a runtime's Wait. Between looks it calls wait
// with the sandbox's id and what inspect returned of its instance (the
// record), which returns when the instance may have ended.
func Wait[I any](ctx context.Context, ref torpor.InstanceRef, checkRef func(torpor.InstanceRef) (string, error), inspect func(context.Context, string) (torpor.InstanceStatus, I, error), wait func(ctx context.Context, id string, in I) error) (torpor.InstanceStatus, error) {
	id, err := checkRef(ref)
	if err != nil {
		return torpor.InstanceStatus{}, err
	}
	for {
		st, in, err := inspect(ctx, id)
		if err != nil || !Live(st) {
			return st, err
		}
		if err := wait(ctx, id, in); err != nil {
			return st, err
		}
	}
}

// Locked checks ref with checkRef and runs f on its sandbox while holding
// the sandbox's lock in locks, so that the verbs that change a sandbox
// (Stop, Destroy) never overlap. f's error is prefixed with what (such as
// "runc: stop") and the sandbox's id.
func Locked(locks *keyedmutex.Mutex, ref torpor.InstanceRef, checkRef func(torpor.InstanceRef) (string, error), what string, f func(id string) error) error {
	id, err := checkRef(ref)
	if err != nil {
		return err
	}
	defer locks.Lock(id)()
	if err := f(id); err != nil {
		return fmt.Errorf("%s %s: %w", what, id, err)
	}
	return nil
}

// WithOutput appends the tail of a command's output to msg, both as
// text that came out of the sandbox: for the message of a Failure.
func WithOutput(msg, output string) string {
	msg = initproc.SandboxText(msg, 1024)
	if output = initproc.SandboxText(output, 2048); output != "" {
		msg += "; output:\n" + output
	}
	return msg
}

// ValidateExec refuses an exec request that no runtime can run, before it
// reaches the instance.
func ValidateExec(req torpor.ExecRequest) error {
	if len(req.Cmd) == 0 || req.Cmd[0] == "" {
		return torpor.Invalid("cmd", "a command is required")
	}
	for _, a := range req.Cmd {
		if strings.ContainsRune(a, 0) {
			return torpor.Invalid("cmd", "a command argument holds a NUL byte")
		}
	}
	if req.Cwd != "" && (!path.IsAbs(req.Cwd) || strings.ContainsRune(req.Cwd, 0)) {
		return torpor.Invalid("cwd", "the working directory must be an absolute path")
	}
	if req.Timeout < 0 {
		return torpor.Invalid("timeout", "the timeout cannot be negative")
	}
	if strings.ContainsRune(req.User, 0) {
		return torpor.Invalid("user", "the user holds a NUL byte")
	}
	return torpor.CheckEnv("env", req.Env)
}
