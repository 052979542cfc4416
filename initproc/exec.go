package initproc

import (
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/torpor-dev/torpor/runtime/exitstatus"
)

// execMain is `torpor init exec`: it runs one command as its child, in a
// new process group, with this process as child subreaper so that every
// process the command starts stays in its tree. At the timeout, or when
// asked to stop (SIGTERM, SIGINT, SIGHUP: runc exec forwards the signals it
// gets), it kills the whole tree. It then writes an ExecResult to the
// result descriptor and exits with the command's exit code.
func execMain(args []string) int {
	fs := flag.NewFlagSet("torpor init exec", flag.ContinueOnError)
	timeout := fs.Duration("timeout", 0, "kill the command's process tree after this long (0: never)")
	cwd := fs.String("cwd", "", "working directory")
	resultFD := fs.Int("result-fd", -1, "descriptor to write the JSON result to")
	requestFD := fs.Int("request-fd", -1, "descriptor to read the rest of the command line from, a JSON array (a helper started ahead of its command)")
	var env stringList
	fs.Var(&env, "env", "KEY=VALUE to set (repeatable; overrides the inherited environment)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *requestFD >= 0 {
		var rest []string
		f := os.NewFile(uintptr(*requestFD), "request")
		err := json.NewDecoder(io.LimitReader(f, maxHelperRequest)).Decode(&rest)
		f.Close()
		if err != nil { // the code server that started it went away
			return 2
		}
		if err := fs.Parse(rest); err != nil {
			return 2
		}
	}
	var result *os.File
	if *resultFD >= 0 {
		syscall.CloseOnExec(*resultFD) // the command must not inherit it
		result = os.NewFile(uintptr(*resultFD), "result")
	}
	res := runExec(fs.Args(), env, *cwd, *timeout)
	if result != nil {
		b, _ := json.Marshal(res)
		_, _ = result.Write(b)
		_ = result.Close()
	}
	return res.ExitCode
}

// maxHelperRequest bounds the command line a helper started ahead reads:
// twice what execve takes.
const maxHelperRequest = 4 << 20

func runExec(argv, env []string, cwd string, timeout time.Duration) ExecResult {
	if len(argv) == 0 {
		return ExecResult{ExitCode: 2, Error: "no command", Param: "cmd"}
	}
	sigs := make(chan os.Signal, 32)
	signal.Notify(sigs, syscall.SIGCHLD, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	if err := setSubreaper(); err != nil {
		fmt.Fprintf(os.Stderr, "torpor exec: subreaper: %v\n", err)
	}
	for _, kv := range env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return ExecResult{ExitCode: 2, Error: fmt.Sprintf("bad environment entry %q", kv), Param: "env"}
		}
		os.Setenv(k, v)
	}
	if cwd != "" {
		if err := os.Chdir(cwd); err != nil {
			return ExecResult{ExitCode: 126, Error: fmt.Sprintf("working directory: %v", err), Param: "cwd"}
		}
	}

	pid, outPump, errPump, err := startExecChild(argv)
	if err != nil {
		fmt.Fprintf(os.Stderr, "torpor: exec %s: %v\n", argv[0], err)
		return ExecResult{ExitCode: startErrorCode(err)}
	}

	var deadline <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		deadline = t.C
	}
	res := ExecResult{}
	for {
		select {
		case sig := <-sigs:
			if sig == syscall.SIGCHLD {
				exited, _ := reapAll()
				if ws, ok := find(exited, pid); ok {
					res.ExitCode = exitstatus.Code(ws)
					outPump.settle(settleGrace)
					errPump.settle(settleGrace)
					return res
				}
				continue
			}
			// Asked to stop: the caller gave up on the command.
			res.ExitCode = killAll(pid)
		case <-deadline:
			res.ExitCode = killAll(pid)
			res.TimedOut = true
		}
		outPump.settle(settleGrace)
		errPump.settle(settleGrace)
		return res
	}
}

// killAll kills the command's group and tree and returns its exit code.
func killAll(pid int) int {
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	ws, found := killTree(pid)
	if !found {
		return 128 + int(syscall.SIGKILL)
	}
	return exitstatus.Code(ws)
}

func find(exited []reaped, pid int) (syscall.WaitStatus, bool) {
	for _, r := range exited {
		if r.pid == pid {
			return r.status, true
		}
	}
	return 0, false
}

// startExecChild starts argv in a new process group with this process's
// stdin and with its output pumped to this process's stdout and stderr
// through pipes of its own, so that a background process the command
// leaves behind does not hold the caller's streams open.
func startExecChild(argv []string) (int, *pump, *pump, error) {
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return 0, nil, nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return 0, nil, nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return 0, nil, nil, err
	}
	proc, err := os.StartProcess(path, argv, &os.ProcAttr{
		Env:   os.Environ(),
		Files: []*os.File{os.Stdin, outW, errW},
		Sys:   &syscall.SysProcAttr{Setpgid: true},
	})
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		errR.Close()
		return 0, nil, nil, err
	}
	pid := proc.Pid
	_ = proc.Release()
	return pid, startPump(outR, os.Stdout), startPump(errR, os.Stderr), nil
}
