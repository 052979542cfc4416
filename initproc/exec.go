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
	fl := newExecFlags()
	if err := fl.fs.Parse(args); err != nil {
		return 2
	}
	if *fl.serveFD >= 0 {
		return serveExecs(*fl.serveFD)
	}
	if *fl.requestFD >= 0 {
		var rest []string
		f := os.NewFile(uintptr(*fl.requestFD), "request")
		err := json.NewDecoder(io.LimitReader(f, maxHelperRequest)).Decode(&rest)
		f.Close()
		if err != nil { // the code server that started it went away
			return 2
		}
		if err := fl.fs.Parse(rest); err != nil {
			return 2
		}
	}
	var result *os.File
	if *fl.resultFD >= 0 {
		syscall.CloseOnExec(*fl.resultFD) // the command must not inherit it
		result = os.NewFile(uintptr(*fl.resultFD), "result")
	}
	res, _ := runExec(fl.fs.Args(), fl.env, *fl.cwd, *fl.timeout)
	if result != nil {
		// The streams end before the report: whoever has the report has
		// all the output too, and need not wait for this process's exit
		// (the code server does not).
		os.Stdout.Close()
		os.Stderr.Close()
		b, _ := json.Marshal(res)
		_, _ = result.Write(b)
		_ = result.Close()
	}
	return res.ExitCode
}

// execFlags are the flags of `torpor init exec`.
type execFlags struct {
	fs                           *flag.FlagSet
	timeout                      *time.Duration
	cwd                          *string
	resultFD, requestFD, serveFD *int
	env                          stringList
}

func newExecFlags() *execFlags {
	fl := &execFlags{fs: flag.NewFlagSet("torpor init exec", flag.ContinueOnError)}
	fl.timeout = fl.fs.Duration("timeout", 0, "kill the command's process tree after this long (0: never)")
	fl.cwd = fl.fs.String("cwd", "", "working directory")
	fl.resultFD = fl.fs.Int("result-fd", -1, "descriptor to write the JSON result to")
	fl.requestFD = fl.fs.Int("request-fd", -1, "descriptor to read the rest of the command line from, a JSON array (a helper started ahead of its command)")
	fl.serveFD = fl.fs.Int("serve-fd", -1, "a SOCK_SEQPACKET socket to take runs from, one after the other (see serveExecs)")
	fl.fs.Var(&fl.env, "env", "KEY=VALUE to set (repeatable; overrides the inherited environment)")
	return fl
}

// serveExecs is a helper started ahead that runs one command after the
// other, so that an exec costs no process start of its own (a Go binary's
// start, about 5 ms of CPU, was most of what an exec cost). Each run comes
// on the socket fd as one message: the rest of the command line (a JSON
// array, as -request-fd takes it) with the run's stdout, stderr and result
// descriptors attached. The run's streams are closed before its report is
// written, as execMain's are. The helper takes the next run only when the
// run left it as it found it: no process of the command's tree alive (its
// tree is its own, as a new helper's is), its output copied to the end,
// and its environment and working directory back as they were. Otherwise,
// or when the socket ends, it closes the socket before it reports (the
// code server sees it leave) and exits with the command's exit code.
// Between runs it listens for no signal: a SIGTERM then ends it, as it
// ends a helper waiting for its request.
func serveExecs(fd int) int {
	sock := os.NewFile(uintptr(fd), "serve")
	syscall.CloseOnExec(fd)
	environ := os.Environ()
	wd, wdErr := os.Getwd()
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil || wdErr != nil {
		return 2
	}
	buf := make([]byte, maxServedRequest)
	oob := make([]byte, syscall.CmsgSpace(3*4))
	for {
		n, oobn, _, _, err := syscall.Recvmsg(fd, buf, oob, 0)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || n == 0 {
			return 0 // the code server closed the socket, or went away
		}
		files := receivedFiles(oob[:oobn])
		fl := newExecFlags()
		var rest []string
		if len(files) != 3 || json.Unmarshal(buf[:n], &rest) != nil || fl.fs.Parse(rest) != nil {
			closeAll(files)
			return 2
		}
		// This run's streams are this process's stdout and stderr while
		// it lasts; /dev/null's before and after.
		_ = syscall.Dup3(int(files[0].Fd()), 1, 0)
		_ = syscall.Dup3(int(files[1].Fd()), 2, 0)
		files[0].Close()
		files[1].Close()
		result := files[2]
		res, clean := runExec(fl.fs.Args(), fl.env, *fl.cwd, *fl.timeout)
		signal.Reset(execSignals...)
		_, none := reapAll()
		again := clean && none && restoreEnv(environ) && os.Chdir(wd) == nil
		_ = syscall.Dup3(int(null.Fd()), 1, 0)
		_ = syscall.Dup3(int(null.Fd()), 2, 0)
		if !again {
			sock.Close()
		}
		b, _ := json.Marshal(res)
		_, _ = result.Write(b)
		_ = result.Close()
		if !again {
			return res.ExitCode
		}
	}
}

// maxServedRequest bounds the command line of a run that serveExecs takes;
// a longer one goes to a helper of its own (-request-fd).
const maxServedRequest = 64 << 10

// receivedFiles returns the descriptors attached to a message.
func receivedFiles(oob []byte) []*os.File {
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var files []*os.File
	for _, m := range msgs {
		fds, err := syscall.ParseUnixRights(&m)
		if err != nil {
			continue
		}
		for _, fd := range fds {
			syscall.CloseOnExec(fd)
			files = append(files, os.NewFile(uintptr(fd), "run"))
		}
	}
	return files
}

// restoreEnv makes the environment environ again.
func restoreEnv(environ []string) bool {
	os.Clearenv()
	for _, kv := range environ {
		k, v, _ := strings.Cut(kv, "=")
		if os.Setenv(k, v) != nil {
			return false
		}
	}
	return true
}

// maxHelperRequest bounds the command line a helper started ahead reads:
// twice what execve takes.
const maxHelperRequest = 4 << 20

// runExec runs argv as execMain describes. clean reports whether the
// command's output was copied to its end (no process holds its pipes).
func runExec(argv, env []string, cwd string, timeout time.Duration) (res ExecResult, clean bool) {
	if len(argv) == 0 {
		return ExecResult{ExitCode: 2, Error: "no command", Param: "cmd"}, true
	}
	sigs := make(chan os.Signal, 32)
	signal.Notify(sigs, execSignals...)
	if err := setSubreaper(); err != nil {
		fmt.Fprintf(os.Stderr, "torpor exec: subreaper: %v\n", err)
	}
	for _, kv := range env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return ExecResult{ExitCode: 2, Error: fmt.Sprintf("bad environment entry %q", kv), Param: "env"}, true
		}
		os.Setenv(k, v)
	}
	if cwd != "" {
		if err := os.Chdir(cwd); err != nil {
			return ExecResult{ExitCode: 126, Error: fmt.Sprintf("working directory: %v", err), Param: "cwd"}, true
		}
	}

	pid, outPump, errPump, err := startExecChild(argv)
	if err != nil {
		fmt.Fprintf(os.Stderr, "torpor: exec %s: %v\n", argv[0], err)
		return ExecResult{ExitCode: startErrorCode(err)}, true
	}

	var deadline <-chan time.Time
	if timeout > 0 {
		t := time.NewTimer(timeout)
		defer t.Stop()
		deadline = t.C
	}
	for {
		select {
		case sig := <-sigs:
			if sig == syscall.SIGCHLD {
				exited, _ := reapAll()
				if ws, ok := find(exited, pid); ok {
					res.ExitCode = exitstatus.Code(ws)
					outPump.settle(settleGrace)
					errPump.settle(settleGrace)
					return res, outPump.finished() && errPump.finished()
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
		return res, outPump.finished() && errPump.finished()
	}
}

// execSignals are the signals a run listens for.
var execSignals = []os.Signal{syscall.SIGCHLD, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP}

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
