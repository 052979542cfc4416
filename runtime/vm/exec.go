package vm

import (
	"context"
	"errors"
	"io"
	"path"
	"strings"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/runtime/vm/proto"
)

// Exec runs a command in the running VM through its agent, which runs it
// in a cgroup of its own and kills its whole tree at req.Timeout or when
// ctx ends. A frozen instance is refused with a conflict at once, a
// missing one with not_found.
func (r *Runtime) Exec(ctx context.Context, ref torpor.InstanceRef, req torpor.ExecRequest) (torpor.ExecResult, error) {
	id, err := checkRef(ref)
	if err != nil {
		return torpor.ExecResult{}, err
	}
	if err := validateExec(req); err != nil {
		return torpor.ExecResult{}, err
	}
	ac, release, err := r.liveAgent(ctx, id, "exec in")
	if err != nil {
		return torpor.ExecResult{}, err
	}
	defer release()
	stdout, stderr := req.Stdout, req.Stderr
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	rid := ac.newID()
	// Whatever of the request is left when it ends (an input the command
	// did not read) is dropped.
	defer ac.c.Drop(rid)
	outs := []*proto.Inbound{ac.c.Receive(rid, proto.Stdout, stdout), ac.c.Receive(rid, proto.Stderr, stderr)}
	ch, err := ac.send(rid, proto.OpExec, proto.Exec{
		Cmd: req.Cmd, Env: req.Env, Cwd: req.Cwd, User: req.User, Stdin: req.Stdin != nil, Timeout: req.Timeout,
	})
	if err != nil {
		return torpor.ExecResult{}, agentError(id, err)
	}
	if req.Stdin != nil {
		go func() {
			if err := ac.c.SendStream(ctx, rid, proto.Stdin, req.Stdin); err != nil {
				_ = ac.c.CloseStream(rid, proto.Stdin)
			}
		}()
	}
	var res proto.ExecResult
	if err := ac.await(ctx, rid, ch, &res); err != nil {
		if errors.Is(err, errAgentGone) {
			if st, _, ierr := r.inspect(ctx, id); ierr == nil {
				if serr := execStateError(st); serr != nil {
					return torpor.ExecResult{}, serr
				}
			}
		}
		return torpor.ExecResult{}, agentError(id, err)
	}
	for _, in := range outs {
		if err := in.Wait(ctx); err != nil && ctx.Err() != nil {
			return torpor.ExecResult{}, ctx.Err()
		}
	}
	return torpor.ExecResult{ExitCode: res.ExitCode, TimedOut: res.TimedOut}, nil
}

// liveAgent checks that the VM runs and returns its agent connection.
func (r *Runtime) liveAgent(ctx context.Context, id, verb string) (*agentConn, func(), error) {
	st, _, err := r.inspect(ctx, id)
	if err != nil {
		return nil, nil, err
	}
	if st.State == torpor.InstanceFrozen {
		return nil, nil, torpor.WrongState(verb, torpor.StatePaused)
	}
	if err := stateError(verb, st); err != nil {
		return nil, nil, err
	}
	ac, release, err := r.agents.get(ctx, r.sandboxPath(id, agentSock))
	if err != nil {
		return nil, nil, agentError(id, err)
	}
	return ac, release, nil
}

func validateExec(req torpor.ExecRequest) error {
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

// execStateError refuses exec into an instance that is not running.
func execStateError(st torpor.InstanceStatus) error {
	if st.State == torpor.InstanceFrozen {
		return torpor.WrongState("exec in", torpor.StatePaused)
	}
	if err := stateError("exec", st); err != nil {
		return err
	}
	return nil
}
