package vm

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"path"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/initproc"
	"github.com/torpor-dev/torpor/runtime/instances"
	"github.com/torpor-dev/torpor/runtime/vm/proto"
)

var (
	_ torpor.CodeRunner    = (*Runtime)(nil)
	_ torpor.ProcessRunner = (*Runtime)(nil)
)

// The guest's code server is initproc's, run by the agent's copy of
// itself: the same interpreters, snippets and background processes as in
// a container.
var codeSocket = path.Join(proto.GuestRunDir, initproc.CodeSocket)

const (
	// codeGrace is how long past a snippet's timeout the runtime waits
	// for the code server's answer.
	codeGrace = 5 * time.Second
	// maxCodeAnswer bounds the code server's answer.
	maxCodeAnswer = 64 << 20
	// procTimeout bounds one process-table operation.
	procTimeout = 15 * time.Second
)

// RunCode runs a snippet in the guest's code server, reached through the
// agent (a dialled unix socket); the server is started on first use and
// lives as long as the VM — across a freeze and a snapshot.
func (r *Runtime) RunCode(ctx context.Context, ref torpor.InstanceRef, req torpor.CodeRequest) (torpor.CodeResult, error) {
	if err := torpor.ValidateCode(req); err != nil {
		return torpor.CodeResult{}, err
	}
	deadline := time.Time{}
	if req.Timeout > 0 {
		deadline = time.Now().Add(req.Timeout + codeGrace)
	}
	res, err := r.codeCall(ctx, ref, initproc.NewCodeRequest(req), deadline, maxCodeAnswer)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() && ctx.Err() == nil {
		return torpor.CodeResult{TimedOut: true, Context: torpor.ContextExisting,
			Error: &torpor.CodeError{Name: "TimeoutError", Value: "the code server did not answer in time"}}, nil
	}
	if err != nil {
		return torpor.CodeResult{}, err
	}
	switch {
	case res.Refused != nil:
		return torpor.CodeResult{}, res.RefusedError()
	case res.Missing != "":
		return torpor.CodeResult{}, &torpor.Error{Code: torpor.EInvalid, Param: "language",
			Message: fmt.Sprintf("%s is not installed in this sandbox; %s needs a template that has it", initproc.SandboxText(res.Missing, 64), req.Language)}
	case res.Fail != "":
		return torpor.CodeResult{}, fmt.Errorf("vm: code server of %s: %s", ref.SandboxID, initproc.SandboxText(res.Fail, 1024))
	}
	if res.Context != torpor.ContextNew {
		res.Context = torpor.ContextExisting
	}
	return res.CodeResult, nil
}

// codeCall sends one request to the code server and reads its answer.
func (r *Runtime) codeCall(ctx context.Context, ref torpor.InstanceRef, req initproc.CodeRequest, deadline time.Time, limit int64) (*initproc.CodeResponse, error) {
	id, err := checkRef(ref)
	if err != nil {
		return nil, err
	}
	c, err := r.codeConn(ctx, ref, id)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()
	if !deadline.IsZero() {
		_ = c.SetDeadline(deadline)
	}
	b, _ := json.Marshal(req)
	if _, err := c.Write(append(b, '\n')); err != nil {
		return nil, r.codeFailure(ctx, id, err)
	}
	line, err := bufio.NewReaderSize(io.LimitReader(c, limit), 64<<10).ReadBytes('\n')
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return nil, err
		}
		return nil, r.codeFailure(ctx, id, err)
	}
	var res initproc.CodeResponse
	if err := json.Unmarshal(line, &res); err != nil {
		return nil, fmt.Errorf("vm: code server of %s answered badly: %w", id, err)
	}
	return &res, nil
}

// codeFailure explains a broken conversation with the code server.
func (r *Runtime) codeFailure(ctx context.Context, id string, err error) error {
	if serr := instances.ExecRefusal(ctx, r, id); serr != nil {
		return serr
	}
	return fmt.Errorf("vm: code server of %s: %w", id, err)
}

// codeConn connects to the guest's code server, starting it when none
// answers.
func (r *Runtime) codeConn(ctx context.Context, ref torpor.InstanceRef, id string) (net.Conn, error) {
	c, err := r.DialContext(ctx, ref, "unix", codeSocket)
	if err == nil {
		return c, nil
	}
	var te *torpor.Error
	if errors.As(err, &te) && te.Code != torpor.EUnavailable {
		return nil, err // not running, frozen, ...
	}
	defer r.codeStarts.Lock(id)()
	if c, err := r.DialContext(ctx, ref, "unix", codeSocket); err == nil {
		return c, nil
	}
	var out bytes.Buffer
	res, err := r.Exec(ctx, ref, torpor.ExecRequest{
		Cmd:     []string{proto.GuestAgentPath, "init", "code-server", "-socket", codeSocket},
		Stdout:  &out,
		Stderr:  &out,
		Timeout: 30 * time.Second,
	})
	if err != nil {
		return nil, err
	}
	if res.ExitCode != 0 {
		return nil, fmt.Errorf("vm: start the code server of %s: exit status %d: %s", id, res.ExitCode, initproc.SandboxText(out.String(), 1024))
	}
	return r.DialContext(ctx, ref, "unix", codeSocket)
}

// sendProc carries one process-table request to the guest's code server;
// initproc.ProcessClient does the rest.
func (r *Runtime) sendProc(ctx context.Context, ref torpor.InstanceRef, req initproc.CodeRequest) (*initproc.CodeResponse, error) {
	return r.codeCall(ctx, ref, req, time.Now().Add(procTimeout), 4*torpor.MaxProcessOutputRead+(1<<20))
}
