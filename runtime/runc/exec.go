package runc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"sort"
	"syscall"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/initproc"
	"github.com/torpor-dev/torpor/runtime/instances"
)

// execGrace is how long after its timeout (or after the caller gave up) a
// command still gets to report before runc is killed: the helper inside the
// sandbox does the killing, and only fails to when the sandbox is frozen.
const execGrace = 5 * time.Second

// Exec runs a command in the running instance through the init binary's
// exec helper, which runs the command in its own process tree and kills the
// whole tree at req.Timeout. The sandbox's code server starts the helper
// (execCall), or, where it cannot, `runc exec` does. A frozen instance is
// refused with a conflict at once, a missing one with not_found.
func (r *Runtime) Exec(ctx context.Context, ref torpor.InstanceRef, req torpor.ExecRequest) (torpor.ExecResult, error) {
	id, err := checkRef(ref)
	if err != nil {
		return torpor.ExecResult{}, err
	}
	if err := instances.ValidateExec(req); err != nil {
		return torpor.ExecResult{}, err
	}
	st, in, err := r.inspect(ctx, id)
	if err != nil {
		return torpor.ExecResult{}, err
	}
	if err := instances.ExecStateError(st); err != nil {
		return torpor.ExecResult{}, err
	}

	if req.User != "" {
		if req.User, err = r.resolveUser(id, req.User); err != nil {
			return torpor.ExecResult{}, err
		}
	}
	initArgv := initArgvOf(in)
	res, ran, err := r.execCall(ctx, ref, id, initArgv, &req)
	if errors.Is(err, errNoExecCall) {
		res, ran, err = r.runExec(ctx, id, initArgv, req)
	}
	if err != nil || ran {
		return res, err
	}
	// The helper never reported: runc could not exec (the instance was
	// frozen or stopped meanwhile) or the helper was killed.
	if err := instances.ExecRefusal(ctx, r, id); err != nil {
		return torpor.ExecResult{}, err
	}
	return res, fmt.Errorf("runc: exec in %s: the command did not report (runc exit status %d)", id, res.ExitCode)
}

// runExec runs the helper, with the instance's init command initArgv,
// through runc exec. ran reports whether the helper wrote its result (the
// result is then the command's).
func (r *Runtime) runExec(ctx context.Context, id string, initArgv []string, req torpor.ExecRequest) (torpor.ExecResult, bool, error) {
	resultR, resultW, err := os.Pipe()
	if err != nil {
		return torpor.ExecResult{}, false, err
	}
	defer resultR.Close()

	runCtx, cancel := ctx, context.CancelFunc(func() {})
	if req.Timeout > 0 {
		runCtx, cancel = context.WithTimeout(ctx, req.Timeout+execGrace)
	}
	defer cancel()
	cmd := exec.CommandContext(runCtx, r.runcPath, execArgs(r.runcRoot, id, initArgv, req)...)
	cmd.Stdin = req.Stdin
	cmd.Stdout = req.Stdout
	cmd.Stderr = req.Stderr
	cmd.ExtraFiles = []*os.File{resultW} // fd 3, passed on by --preserve-fds
	// runc exec forwards SIGTERM to the helper, which kills the command's
	// tree; SIGKILL would kill runc alone.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = execGrace
	if err := cmd.Start(); err != nil {
		resultW.Close()
		return torpor.ExecResult{}, false, fmt.Errorf("runc exec: %w", err)
	}
	resultW.Close()
	report := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(io.LimitReader(resultR, initproc.MaxReportSize))
		report <- b
	}()
	waitErr := cmd.Wait()

	var b []byte
	select {
	case b = <-report:
	case <-time.After(100 * time.Millisecond):
		resultR.Close() // a frozen helper still holds the pipe
		b = <-report
	}
	return execOutcome(ctx, runCtx, b, cmd.ProcessState.ExitCode(), waitErr)
}

// execOutcome makes the result of an exec from the helper's report b (if
// any), runc's exit code and error, and the contexts: ctx the caller's,
// runCtx the one with the backstop timeout.
func execOutcome(ctx, runCtx context.Context, b []byte, runcCode int, waitErr error) (torpor.ExecResult, bool, error) {
	var out initproc.ExecResult
	if len(b) == 0 || json.Unmarshal(b, &out) != nil {
		res := torpor.ExecResult{ExitCode: runcCode}
		switch {
		case ctx.Err() != nil:
			return res, false, ctx.Err()
		case runCtx.Err() != nil: // the backstop fired: the helper could not act
			return torpor.ExecResult{ExitCode: 128 + int(syscall.SIGKILL), TimedOut: true}, true, nil
		}
		var ee *exec.ExitError
		if waitErr != nil && !errors.As(waitErr, &ee) {
			return res, false, fmt.Errorf("runc exec: %w", waitErr)
		}
		return res, false, nil
	}
	if ctx.Err() != nil {
		return torpor.ExecResult{}, true, ctx.Err()
	}
	if out.Error != "" {
		param := out.Param
		if param == "" {
			param = "cmd"
		}
		return torpor.ExecResult{}, true, torpor.Invalid(param, "%s", initproc.SandboxText(out.Error, 1024))
	}
	return torpor.ExecResult{ExitCode: out.ExitCode, TimedOut: out.TimedOut}, true, nil
}

// execArgs is the runc command line that runs req through the helper,
// which initArgv runs.
func execArgs(runcRoot, id string, initArgv []string, req torpor.ExecRequest) []string {
	args := []string{"--root", runcRoot, "exec", "--preserve-fds", "1"}
	if req.User != "" {
		args = append(args, "--user", req.User)
	}
	if isCodeServer(initArgv, req.Cmd) {
		// The code server starts background processes and execs as the
		// users they name (E2B runs everything as its "user"): it may
		// switch uid and gid, which the sandbox's root otherwise may not.
		// With CAP_SETPCAP it drops all three from its bounding set
		// (-setid-caps), so that what it starts as root has no more than
		// the sandbox's own capabilities.
		args = append(args, "--cap", "CAP_SETUID", "--cap", "CAP_SETGID", "--cap", "CAP_SETPCAP")
	}
	args = append(args, id)
	return append(args, helperArgs(initArgv, req)...)
}

// helperArgs is the command line of the helper that runs req, which
// initArgv runs, with its result on descriptor 3.
func helperArgs(initArgv []string, req torpor.ExecRequest) []string {
	args := append(slices.Clip(initArgv), "init", "exec", "-result-fd", "3")
	if req.Timeout > 0 {
		args = append(args, "-timeout", req.Timeout.String())
	}
	if req.Cwd != "" {
		args = append(args, "-cwd", req.Cwd)
	}
	keys := make([]string, 0, len(req.Env))
	for k := range req.Env {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	for _, k := range keys {
		args = append(args, "-env", k+"="+req.Env[k])
	}
	args = append(args, "--")
	return append(args, req.Cmd...)
}

// isCodeServer reports whether cmd starts the code server of the init
// that initArgv runs.
func isCodeServer(initArgv, cmd []string) bool {
	n := len(initArgv)
	return len(cmd) > n+1 && slices.Equal(cmd[:n], initArgv) && cmd[n] == "init" && cmd[n+1] == "code-server"
}
