package runc

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"syscall"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/initproc"
	"github.com/torpor-dev/torpor/runtime/instances"
)

const (
	// maxExecCallStdin is the most stdin an exec sends the code server
	// with its request; an exec with more goes through runc exec, which
	// streams it.
	maxExecCallStdin = 1 << 20
	// maxExecFrame bounds one line of the code server's answer to an exec:
	// a frame of output, or the end with the helper's report.
	maxExecFrame = 4 * initproc.MaxReportSize
)

// errNoExecCall: the code server cannot run this exec; runc exec does.
var errNoExecCall = errors.New("no code server to run the exec")

// execCall runs req through the sandbox's code server (initproc.ProcExec):
// the server starts the same exec helper runc exec would, as req's user,
// and streams its output back on the connection, so that an exec costs a
// fork in the sandbox instead of a runc exec. It is errNoExecCall, having
// done nothing (req.Stdin is as it was), when the server cannot take the
// exec: it is not running and cannot be started (a sandbox out of
// processes), it predates ProcExec (a sandbox that an older torpor booted
// keeps the server it started), it could not start the helper, or the
// stdin is more than maxExecCallStdin. The code server is started on the
// first exec, through runc exec, and then lives as long as the instance.
func (r *Runtime) execCall(ctx context.Context, ref torpor.InstanceRef, id string, initArgv []string, req *torpor.ExecRequest) (torpor.ExecResult, bool, error) {
	if isCodeServer(initArgv, req.Cmd) {
		return torpor.ExecResult{}, false, errNoExecCall
	}
	var stdin []byte
	if req.Stdin != nil {
		b, err := io.ReadAll(io.LimitReader(req.Stdin, maxExecCallStdin+1))
		if err != nil || len(b) > maxExecCallStdin {
			req.Stdin = io.MultiReader(bytes.NewReader(b), req.Stdin)
			return torpor.ExecResult{}, false, errNoExecCall
		}
		stdin = b
	}
	restore := func() {
		if req.Stdin != nil {
			req.Stdin = bytes.NewReader(stdin)
		}
	}
	c, err := r.codeConn(ctx, ref, id)
	if err != nil {
		restore()
		return torpor.ExecResult{}, false, errNoExecCall
	}
	defer c.Close()

	// The helper kills the command at its timeout; the connection's
	// deadline is the backstop for a helper that cannot (a sandbox frozen
	// meanwhile), as runc exec's is. Closing the connection stops the
	// command.
	runCtx, cancel := ctx, context.CancelFunc(func() {})
	if req.Timeout > 0 {
		runCtx, cancel = context.WithTimeout(ctx, req.Timeout+execGrace)
	}
	defer cancel()
	stop := context.AfterFunc(runCtx, func() { _ = c.SetDeadline(time.Now()) })
	defer stop()

	b, _ := json.Marshal(initproc.CodeRequest{Proc: &initproc.ProcRequest{
		Op:      initproc.ProcExec,
		Cmd:     helperArgs(initArgv, *req),
		User:    req.User,
		Data:    stdin,
		NoStdin: req.Stdin == nil,
	}})
	if _, err := c.Write(append(b, '\n')); err != nil {
		return r.execBroken(ctx, runCtx, id, err)
	}
	br := bufio.NewReaderSize(c, 64<<10)
	for {
		// A conversation that breaks off is not retried through runc
		// exec: the command may have run.
		line, err := readFrame(br)
		if err != nil {
			return r.execBroken(ctx, runCtx, id, err)
		}
		var f initproc.ExecFrame
		if err := json.Unmarshal(line, &f); err != nil {
			return torpor.ExecResult{}, false, fmt.Errorf("runc: code server of %s answered an exec badly: %w", id, err)
		}
		if f.Proc != nil {
			if f.Proc.Invalid != "" {
				param := f.Proc.Param
				if param == "" {
					param = "cmd"
				}
				return torpor.ExecResult{}, false, torpor.Invalid(param, "%s", initproc.SandboxText(f.Proc.Invalid, 1024))
			}
			// Not found: a server without ProcExec; a conflict: it could
			// not start the helper, which runc exec then tries, and
			// fails as it does.
			restore()
			return torpor.ExecResult{}, false, errNoExecCall
		}
		// The caller's writers' errors are not the command's: it goes on,
		// as with runc exec.
		if len(f.Stdout) > 0 && req.Stdout != nil {
			_, _ = req.Stdout.Write(f.Stdout)
		}
		if len(f.Stderr) > 0 && req.Stderr != nil {
			_, _ = req.Stderr.Write(f.Stderr)
		}
		if f.End {
			return execOutcome(ctx, runCtx, f.Report, f.Status, nil)
		}
	}
}

// execBroken is the outcome of an exec whose conversation with the code
// server broke off with err before the end: the caller gave up, the
// backstop fired, or the instance stopped or froze meanwhile.
func (r *Runtime) execBroken(ctx, runCtx context.Context, id string, err error) (torpor.ExecResult, bool, error) {
	switch {
	case ctx.Err() != nil:
		return torpor.ExecResult{}, false, ctx.Err()
	case runCtx.Err() != nil: // the backstop fired: the helper could not act
		return torpor.ExecResult{ExitCode: 128 + int(syscall.SIGKILL), TimedOut: true}, true, nil
	}
	if serr := instances.ExecRefusal(ctx, r, id); serr != nil {
		return torpor.ExecResult{}, false, serr
	}
	return torpor.ExecResult{}, false, fmt.Errorf("runc: exec in %s: the code server broke off: %w", id, err)
}

// readFrame reads one line of at most maxExecFrame bytes.
func readFrame(br *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		chunk, err := br.ReadSlice('\n')
		line = append(line, chunk...)
		if len(line) > maxExecFrame {
			return nil, fmt.Errorf("an answer line longer than %d bytes", maxExecFrame)
		}
		if err == nil {
			return line, nil
		}
		if !errors.Is(err, bufio.ErrBufferFull) {
			return nil, err
		}
	}
}
