package runc

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/initproc"
)

var _ torpor.ProcessRunner = (*Runtime)(nil)

// procTimeout bounds one process-table operation (a stdin write may wait
// up to 5 s for the process to read).
const procTimeout = 15 * time.Second

// StartProcess starts a background process through the sandbox's code
// server (see RunCode), which keeps it, its stdin and the last MiB of its
// output until the instance stops.
func (r *Runtime) StartProcess(ctx context.Context, ref torpor.InstanceRef, req torpor.ProcessRequest) (torpor.ProcessInfo, error) {
	if err := torpor.ValidateProcess(req); err != nil {
		return torpor.ProcessInfo{}, err
	}
	res, err := r.proc(ctx, ref, initproc.ProcRequest{Op: initproc.ProcStart, Cmd: req.Cmd, Env: req.Env, Cwd: req.Cwd, MinID: req.MinID})
	if err != nil {
		return torpor.ProcessInfo{}, err
	}
	if res.Info == nil {
		return torpor.ProcessInfo{}, fmt.Errorf("runc: code server of %s did not say which process it started", ref.SandboxID)
	}
	return *res.Info, nil
}

// ListProcesses lists the sandbox's background processes.
func (r *Runtime) ListProcesses(ctx context.Context, ref torpor.InstanceRef) ([]torpor.ProcessInfo, error) {
	res, err := r.proc(ctx, ref, initproc.ProcRequest{Op: initproc.ProcList})
	if err != nil {
		return nil, err
	}
	if res.List == nil {
		return []torpor.ProcessInfo{}, nil
	}
	return res.List, nil
}

// ProcessOutput reads a background process's output from offset.
func (r *Runtime) ProcessOutput(ctx context.Context, ref torpor.InstanceRef, id int, offset int64) (torpor.ProcessOutput, error) {
	if offset < 0 {
		return torpor.ProcessOutput{}, torpor.Invalid("offset", "must not be negative")
	}
	res, err := r.proc(ctx, ref, initproc.ProcRequest{Op: initproc.ProcOutput, ID: id, Offset: offset})
	if err != nil {
		return torpor.ProcessOutput{}, err
	}
	if res.Output == nil {
		return torpor.ProcessOutput{}, fmt.Errorf("runc: code server of %s sent no output", ref.SandboxID)
	}
	out := *res.Output
	out.Data = string(res.Data)
	return out, nil
}

// WriteProcessStdin writes to a background process's stdin, and closes it
// when close is set.
func (r *Runtime) WriteProcessStdin(ctx context.Context, ref torpor.InstanceRef, id int, data []byte, close bool) error {
	if len(data) > torpor.MaxProcessStdin {
		return torpor.Invalid("data", "at most %d bytes", torpor.MaxProcessStdin)
	}
	_, err := r.proc(ctx, ref, initproc.ProcRequest{Op: initproc.ProcStdin, ID: id, Data: data, Close: close})
	return err
}

// SignalProcess sends a signal to a background process's group.
func (r *Runtime) SignalProcess(ctx context.Context, ref torpor.InstanceRef, id int, signal string) error {
	sig, err := torpor.NormalizeSignal(signal)
	if err != nil {
		return err
	}
	_, err = r.proc(ctx, ref, initproc.ProcRequest{Op: initproc.ProcSignal, ID: id, Signal: sig})
	return err
}

// proc sends one process-table operation to the code server and maps
// its refusals to errors.
func (r *Runtime) proc(ctx context.Context, ref torpor.InstanceRef, req initproc.ProcRequest) (*initproc.ProcResponse, error) {
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
	_ = c.SetDeadline(time.Now().Add(procTimeout))
	b, _ := json.Marshal(initproc.CodeRequest{Proc: &req})
	if _, err := c.Write(append(b, '\n')); err != nil {
		return nil, r.codeFailure(ctx, id, err)
	}
	line, err := bufio.NewReaderSize(io.LimitReader(c, 4*torpor.MaxProcessOutputRead+(1<<20)), 64<<10).ReadBytes('\n')
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, r.codeFailure(ctx, id, err)
	}
	var res initproc.CodeResponse
	if err := json.Unmarshal(line, &res); err != nil {
		return nil, fmt.Errorf("runc: code server of %s answered badly: %w", id, err)
	}
	switch {
	case res.Proc == nil && res.Fail != "" && req.Op != "":
		// A code server started by an older daemon takes the request
		// for a snippet without a language.
		return nil, torpor.Errorf(torpor.EConflict, "the code server in sandbox %s predates background processes; restart the sandbox to use them", ref.SandboxID)
	case res.Fail != "":
		return nil, fmt.Errorf("runc: code server of %s: %s", id, cleanText(res.Fail, 1024))
	case res.Proc == nil:
		return nil, fmt.Errorf("runc: the code server of %s does not know background processes", id)
	case res.Proc.NotFound:
		return nil, torpor.Errorf(torpor.ENotFound, "sandbox %s has no process %d", ref.SandboxID, req.ID)
	case res.Proc.Invalid != "":
		param := "cmd"
		switch req.Op {
		case initproc.ProcSignal:
			param = "signal"
		case initproc.ProcOutput:
			param = "offset"
		}
		if res.Proc.Param != "" {
			param = res.Proc.Param
		}
		return nil, torpor.Invalid(param, "%s", cleanText(res.Proc.Invalid, 1024))
	case res.Proc.Conflict != "":
		return nil, torpor.Errorf(torpor.EConflict, "%s", cleanText(res.Proc.Conflict, 1024))
	}
	return res.Proc, nil
}
