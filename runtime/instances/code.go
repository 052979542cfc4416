package instances

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/initproc"
)

const (
	// codeGrace is how long past a snippet's timeout the runtime waits
	// for the code server's answer before it gives up on the connection.
	codeGrace = 5 * time.Second
	// maxCodeAnswer bounds the code server's answer to a snippet.
	maxCodeAnswer = 64 << 20
	// procTimeout bounds one process-table operation (a stdin write may
	// wait up to 5 s for the process to read).
	procTimeout = 15 * time.Second
	// maxProcAnswer bounds the answer to one: at most four reads of
	// output, and the rest of the answer.
	maxProcAnswer = 4*torpor.MaxProcessOutputRead + (1 << 20)
)

// errNoAnswer: the code server did not answer by the deadline.
var errNoAnswer = errors.New("the code server did not answer in time")

// CodeServer is the host's side of a sandbox's code server (`torpor init
// code-server`, package initproc), which keeps one interpreter per
// language and the sandbox's background processes: one JSON request a
// line and one answer a line, over a connection the runtime opens. It
// gives a runtime RunCode (torpor.CodeRunner) and the Send of its
// initproc.ProcessClient.
type CodeServer struct {
	// Who names the runtime in errors ("runc", "vm").
	Who string
	// CheckRef validates a ref and returns its sandbox id.
	CheckRef func(torpor.InstanceRef) (string, error)
	// Conn connects to the code server of sandbox id, starting it when
	// none answers.
	Conn func(ctx context.Context, ref torpor.InstanceRef, id string) (net.Conn, error)
	// Runtime is asked, when a conversation breaks off, whether the
	// instance stopped or froze meanwhile.
	Runtime Inspector
}

// RunCode runs a snippet in the sandbox's code server. An answer that does
// not come within the snippet's timeout (and a grace) is a timed-out
// result, as the snippet's own timeout is.
func (s CodeServer) RunCode(ctx context.Context, ref torpor.InstanceRef, req torpor.CodeRequest) (torpor.CodeResult, error) {
	if err := torpor.ValidateCode(req); err != nil {
		return torpor.CodeResult{}, err
	}
	deadline := time.Time{}
	if req.Timeout > 0 {
		deadline = time.Now().Add(req.Timeout + codeGrace)
	}
	res, err := s.call(ctx, ref, initproc.NewCodeRequest(req), deadline, maxCodeAnswer)
	if errors.Is(err, errNoAnswer) {
		return torpor.CodeResult{TimedOut: true, Context: torpor.ContextExisting,
			Error: &torpor.CodeError{Name: "TimeoutError", Value: errNoAnswer.Error()}}, nil
	}
	if err != nil {
		return torpor.CodeResult{}, err
	}
	switch {
	case res.Refused != nil:
		return torpor.CodeResult{}, res.RefusedError()
	case res.Missing != "":
		return torpor.CodeResult{}, &torpor.Error{Code: torpor.EInvalid, Param: "language",
			Message: fmt.Sprintf("%s is not installed in this sandbox; %s needs a template that has it (e.g. `torpor template build python --debian bookworm --packages python3`)",
				initproc.SandboxText(res.Missing, 64), req.Language)}
	case res.Fail != "":
		return torpor.CodeResult{}, fmt.Errorf("%s: code server of %s: %s", s.Who, ref.SandboxID, initproc.SandboxText(res.Fail, 1024))
	}
	if res.Context != torpor.ContextNew {
		res.Context = torpor.ContextExisting
	}
	return res.CodeResult, nil
}

// Send carries one process-table request to the sandbox's code server and
// brings back its answer: the Send of the runtime's
// initproc.ProcessClient, which does the rest.
func (s CodeServer) Send(ctx context.Context, ref torpor.InstanceRef, req initproc.CodeRequest) (*initproc.CodeResponse, error) {
	res, err := s.call(ctx, ref, req, time.Now().Add(procTimeout), maxProcAnswer)
	if errors.Is(err, errNoAnswer) {
		return nil, s.broken(ctx, ref.SandboxID, err)
	}
	return res, err
}

// call sends one request to the code server and reads its answer, of at
// most limit bytes. An answer that has not come by the deadline (zero:
// none) is errNoAnswer.
func (s CodeServer) call(ctx context.Context, ref torpor.InstanceRef, req initproc.CodeRequest, deadline time.Time, limit int64) (*initproc.CodeResponse, error) {
	id, err := s.CheckRef(ref)
	if err != nil {
		return nil, err
	}
	c, err := s.Conn(ctx, ref, id)
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
		return nil, s.broken(ctx, id, err)
	}
	line, err := bufio.NewReaderSize(io.LimitReader(c, limit), 64<<10).ReadBytes('\n')
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			return nil, errNoAnswer
		}
		return nil, s.broken(ctx, id, err)
	}
	var res initproc.CodeResponse
	if err := json.Unmarshal(line, &res); err != nil {
		return nil, fmt.Errorf("%s: code server of %s answered badly: %w", s.Who, id, err)
	}
	return &res, nil
}

// broken explains a conversation with the code server that broke off:
// the instance stopped or froze meanwhile, or err.
func (s CodeServer) broken(ctx context.Context, id string, err error) error {
	if serr := ExecRefusal(ctx, s.Runtime, id); serr != nil {
		return serr
	}
	return fmt.Errorf("%s: code server of %s: %w", s.Who, id, err)
}
