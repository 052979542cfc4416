package vm

import (
	"context"
	"errors"
	"io"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/runtime/instances"
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
	if err := instances.ValidateExec(req); err != nil {
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
			if serr := instances.ExecRefusal(ctx, r, id); serr != nil {
				return torpor.ExecResult{}, serr
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
	if err := instances.StateError(verb, st); err != nil {
		return nil, nil, err
	}
	ac, release, err := r.agents.get(ctx, r.sandboxPath(id, agentSock))
	if err != nil {
		return nil, nil, agentError(id, err)
	}
	return ac, release, nil
}
