package initproc

import (
	"context"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/torpor-dev/torpor"
)

// ProcessClient is the host's side of a code server's process table: it
// implements torpor.ProcessRunner for a runtime, which gives it Send, its
// way to carry one request to the code server inside a sandbox and bring
// back the answer. Who names the runtime in errors.
type ProcessClient struct {
	Send func(ctx context.Context, ref torpor.InstanceRef, req CodeRequest) (*CodeResponse, error)
	Who  string
}

// StartProcess starts a background process through the sandbox's code
// server, which keeps it, its stdin and the last MiB of its output until
// the instance stops.
func (p ProcessClient) StartProcess(ctx context.Context, ref torpor.InstanceRef, req torpor.ProcessRequest) (torpor.ProcessInfo, error) {
	if err := torpor.ValidateProcess(req); err != nil {
		return torpor.ProcessInfo{}, err
	}
	res, err := p.proc(ctx, ref, ProcRequest{Op: ProcStart, Cmd: req.Cmd, Env: req.Env, Cwd: req.Cwd, MinID: req.MinID,
		User: req.User, Tag: req.Tag, NoStdin: req.NoStdin, Stderr: req.Stderr, TimeoutMS: timeoutMS(req.Timeout)})
	if err != nil {
		return torpor.ProcessInfo{}, err
	}
	if res.Info == nil {
		return torpor.ProcessInfo{}, fmt.Errorf("%s: the code server of %s did not say which process it started", p.Who, ref.SandboxID)
	}
	return *res.Info, nil
}

// CodeOutput reads what the snippet running in a code context wrote so
// far (torpor.CodeOutputReader).
func (p ProcessClient) CodeOutput(ctx context.Context, ref torpor.InstanceRef, context string, stdoutOffset, stderrOffset int64) (torpor.CodeOutput, error) {
	res, err := p.proc(ctx, ref, ProcRequest{Op: ProcCodeOutput, Context: context, Offset: stdoutOffset, ErrOffset: stderrOffset})
	if err != nil {
		return torpor.CodeOutput{}, err
	}
	if res.Code == nil {
		return torpor.CodeOutput{}, fmt.Errorf("%s: the code server of %s did not answer with code output", p.Who, ref.SandboxID)
	}
	return *res.Code, nil
}

// ListProcesses lists the sandbox's background processes.
func (p ProcessClient) ListProcesses(ctx context.Context, ref torpor.InstanceRef) ([]torpor.ProcessInfo, error) {
	res, err := p.proc(ctx, ref, ProcRequest{Op: ProcList})
	if err != nil {
		return nil, err
	}
	if res.List == nil {
		return []torpor.ProcessInfo{}, nil
	}
	return res.List, nil
}

// ProcessOutput reads a background process's output from offset.
func (p ProcessClient) ProcessOutput(ctx context.Context, ref torpor.InstanceRef, id int, offset int64) (torpor.ProcessOutput, error) {
	return p.ReadProcess(ctx, ref, id, torpor.ProcessRead{Offset: offset})
}

// ReadProcess reads a background process's output: from an offset,
// waiting for some when asked, split by stream when asked.
func (p ProcessClient) ReadProcess(ctx context.Context, ref torpor.InstanceRef, id int, req torpor.ProcessRead) (torpor.ProcessOutput, error) {
	if err := torpor.ValidateProcessRead(req); err != nil {
		return torpor.ProcessOutput{}, err
	}
	res, err := p.proc(ctx, ref, ProcRequest{Op: ProcOutput, ID: id, Offset: req.Offset,
		WaitMS: min(req.Wait, torpor.MaxProcessWait).Milliseconds(), Split: req.Split})
	if err != nil {
		return torpor.ProcessOutput{}, err
	}
	if res.Output == nil {
		return torpor.ProcessOutput{}, fmt.Errorf("%s: the code server of %s sent no output", p.Who, ref.SandboxID)
	}
	out := *res.Output
	out.Data = string(res.Data)
	out.Signal = res.Signal
	for _, c := range res.Chunks {
		out.Chunks = append(out.Chunks, torpor.ProcessChunk{Stderr: c.Stderr, Data: c.Data})
	}
	return out, nil
}

// timeoutMS is d in milliseconds, rounded up so that a limit is never 0.
func timeoutMS(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64((d + time.Millisecond - 1) / time.Millisecond)
}

// WriteProcessStdin writes to a background process's stdin, and closes it
// when close is set.
func (p ProcessClient) WriteProcessStdin(ctx context.Context, ref torpor.InstanceRef, id int, data []byte, close bool) error {
	if len(data) > torpor.MaxProcessStdin {
		return torpor.Invalid("data", "at most %d bytes", torpor.MaxProcessStdin)
	}
	_, err := p.proc(ctx, ref, ProcRequest{Op: ProcStdin, ID: id, Data: data, Close: close})
	return err
}

// SignalProcess sends a signal to a background process's group.
func (p ProcessClient) SignalProcess(ctx context.Context, ref torpor.InstanceRef, id int, signal string) error {
	sig, err := torpor.NormalizeSignal(signal)
	if err != nil {
		return err
	}
	_, err = p.proc(ctx, ref, ProcRequest{Op: ProcSignal, ID: id, Signal: sig})
	return err
}

// proc sends one process-table operation and maps the code server's
// refusals to errors.
func (p ProcessClient) proc(ctx context.Context, ref torpor.InstanceRef, req ProcRequest) (*ProcResponse, error) {
	res, err := p.Send(ctx, ref, CodeRequest{Proc: &req})
	if err != nil {
		return nil, err
	}
	switch {
	case res.Proc == nil && res.Fail != "" && req.Op != "":
		// A code server started by an older daemon takes the request for
		// a snippet without a language.
		return nil, torpor.Errorf(torpor.EConflict, "the code server in sandbox %s predates background processes; restart the sandbox to use them", ref.SandboxID)
	case res.Fail != "":
		return nil, fmt.Errorf("%s: code server of %s: %s", p.Who, ref.SandboxID, SandboxText(res.Fail, 1024))
	case res.Proc == nil:
		return nil, fmt.Errorf("%s: the code server of %s does not know background processes", p.Who, ref.SandboxID)
	case res.Proc.NotFound:
		return nil, torpor.Errorf(torpor.ENotFound, "sandbox %s has no process %d", ref.SandboxID, req.ID)
	case res.Proc.Invalid != "":
		param := res.Proc.Param
		if param == "" {
			switch req.Op {
			case ProcSignal:
				param = "signal"
			case ProcOutput:
				param = "offset"
			default:
				param = "cmd"
			}
		}
		return nil, torpor.Invalid(param, "%s", SandboxText(res.Proc.Invalid, 1024))
	case res.Proc.Conflict != "":
		return nil, torpor.Errorf(torpor.EConflict, "%s", SandboxText(res.Proc.Conflict, 1024))
	}
	return res.Proc, nil
}

// SandboxText makes text that came out of a sandbox fit for an error
// message: its last max bytes, as valid UTF-8.
func SandboxText(s string, max int) string {
	if len(s) > max {
		s = s[len(s)-max:]
		for len(s) > 0 && !utf8.RuneStart(s[0]) {
			s = s[1:]
		}
	}
	return strings.ToValidUTF8(s, "\uFFFD")
}
