// Package initproc is the init process (pid 1) of a sandbox: the torpor
// binary runs it inside the container as `torpor init`.
//
// Init runs the setup commands in order with /bin/sh -c, starts the
// entrypoint (or waits idle), reaps every process re-parented to it,
// forwards termination signals to the entrypoint, and exits when the
// entrypoint does. It reports to the runtime through small JSON files in its
// run directory (see ReadyFile, ResultFile), written atomically.
//
// `torpor init exec` is a helper the runtime runs through `runc exec`: it
// runs one command in its own process tree, kills the whole tree at a
// timeout, and writes an ExecResult to a descriptor the runtime passed.
//
// The package depends on the standard library only. It runs inside root
// file systems with any C library or none: so it never looks a name up
// through the C library (users and groups come from the sandbox's
// /etc/passwd and /etc/group, read here; the network is used through unix
// sockets only). The torpor binary is linked statically (CGO_ENABLED=0),
// or runs through the host's ELF interpreter with the host's C library
// (package runc sees to that).
package initproc

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/runtime/exitstatus"
)

// DefaultRunDir is where the runtime mounts the run directory.
const DefaultRunDir = "/.torpor/run"

// Main runs init with its arguments and returns the exit status:
//
//	torpor init [-run DIR] [-setup CMD]... [-- ENTRYPOINT ARG...]
//	torpor init exec [-timeout D] [-cwd DIR] [-env K=V]... [-result-fd N] -- CMD ARG...
//	torpor init code-server [-socket PATH] [-foreground] [-self WORD]...
func Main(args []string) int {
	if len(args) > 0 && args[0] == "code-server" {
		return codeServerMain(args[1:])
	}
	if len(args) > 0 && args[0] == "exec" {
		return execMain(args[1:])
	}
	return initMain(args)
}

// stringList is a repeatable string flag.
type stringList []string

func (l *stringList) String() string     { return strings.Join(*l, " ") }
func (l *stringList) Set(s string) error { *l = append(*l, s); return nil }

func initMain(args []string) int {
	fs := flag.NewFlagSet("torpor init", flag.ContinueOnError)
	runDir := fs.String("run", DefaultRunDir, "directory for reports and the entrypoint log")
	var setup stringList
	fs.Var(&setup, "setup", "shell command to run before the entrypoint (repeatable, in order)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	in := &initProc{
		run:  *runDir,
		sigs: make(chan os.Signal, 32),
	}
	// Signals are caught before any child exists so that no SIGCHLD is lost.
	signal.Notify(in.sigs, syscall.SIGCHLD, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP,
		syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2)
	return in.main(setup, fs.Args())
}

// initProc is the state of the running init.
type initProc struct {
	run  string
	sigs chan os.Signal
	// stopSignal is the termination signal received during setup, if any.
	stopSignal os.Signal
}

func (p *initProc) main(setup, entrypoint []string) int {
	if err := os.MkdirAll(p.run, 0o755); err != nil {
		fmt.Fprintf(os.Stderr, "torpor init: %v\n", err)
		return 2
	}
	for i, cmd := range setup {
		if code, ok := p.runSetup(i, cmd); !ok {
			return code
		}
	}
	if len(entrypoint) == 0 {
		return p.idle()
	}
	return p.runEntrypoint(entrypoint)
}

// report writes a report file, logging (not failing) when it cannot.
func (p *initProc) report(name string, v any) {
	if err := writeReport(p.run, name, v); err != nil {
		fmt.Fprintf(os.Stderr, "torpor init: write %s: %v\n", name, err)
	}
}

func (p *initProc) fail(r Result) {
	r.Time = time.Now().UTC()
	r.Output = clip(r.Output, MaxOutputTail)
	r.Message = clip(r.Message, MaxOutputTail)
	p.report(ResultFile, r)
}

// isStop reports whether sig asks init to stop.
func isStop(sig os.Signal) bool {
	return sig == syscall.SIGTERM || sig == syscall.SIGINT
}

// waitFor blocks until the child pid exits, reaping every other child on
// the way and passing other signals to onSignal.
func (p *initProc) waitFor(pid int, onSignal func(os.Signal)) syscall.WaitStatus {
	for {
		exited, _ := reapAll()
		for _, r := range exited {
			if r.pid == pid {
				return r.status
			}
		}
		if sig := <-p.sigs; sig != syscall.SIGCHLD {
			onSignal(sig)
		}
	}
}

// runSetup runs setup command i; on failure it writes the result and
// returns init's exit code and false.
func (p *initProc) runSetup(i int, cmd string) (int, bool) {
	out := newTail(MaxOutputTail)
	pid, pm, err := startCommand([]string{"/bin/sh", "-c", cmd}, out)
	if err != nil {
		p.fail(Result{Kind: torpor.FailureSetup, Step: i, Command: clipHead(cmd, 1024), ExitCode: 127,
			Message: fmt.Sprintf("setup command %d: %v", i+1, err)})
		return 1, false
	}
	ws := p.waitFor(pid, func(sig os.Signal) {
		if isStop(sig) {
			p.stopSignal = sig
		}
		_ = syscall.Kill(pid, sig.(syscall.Signal))
	})
	pm.settle(settleGrace)
	if p.stopSignal != nil {
		sig := p.stopSignal.(syscall.Signal)
		p.fail(Result{Kind: KindTerminated, Signal: exitstatus.SignalName(sig), ExitCode: 128 + int(sig),
			Message: "init was stopped by " + exitstatus.SignalName(sig) + " during setup"})
		return 128 + int(sig), false
	}
	if ws.Exited() && ws.ExitStatus() == 0 {
		return 0, true
	}
	code := exitstatus.Code(ws)
	msg := fmt.Sprintf("setup command %d (%s) exited with status %d", i+1, clipHead(cmd, 200), code)
	if s := exitstatus.Signal(ws); s != "" {
		msg = fmt.Sprintf("setup command %d (%s) was killed by %s", i+1, clipHead(cmd, 200), s)
	}
	p.fail(Result{Kind: torpor.FailureSetup, Step: i, Command: clipHead(cmd, 1024), ExitCode: code,
		Signal: exitstatus.Signal(ws), Output: out.String(), Message: msg})
	return 1, false
}

// runEntrypoint starts the entrypoint, reports ready, forwards signals to
// it and reports how it exited.
func (p *initProc) runEntrypoint(argv []string) int {
	log, err := openRotatingLog(filepath.Join(p.run, LogFile), MaxLogSize)
	if err != nil {
		p.fail(Result{Kind: KindInitError, ExitCode: 2, Message: fmt.Sprintf("entrypoint log: %v", err)})
		return 2
	}
	out := newTail(MaxOutputTail)
	pid, pm, err := startCommand(argv, io.MultiWriter(log, out))
	if err != nil {
		code := startErrorCode(err)
		p.fail(Result{Kind: torpor.FailureEntrypoint, ExitCode: code,
			Message: fmt.Sprintf("start entrypoint: %v", err)})
		return code
	}
	p.report(ReadyFile, Ready{EntrypointPID: pid, Time: time.Now().UTC()})
	ws := p.waitFor(pid, func(sig os.Signal) { _ = syscall.Kill(pid, sig.(syscall.Signal)) })
	pm.settle(settleGrace)
	code := exitstatus.Code(ws)
	msg := fmt.Sprintf("entrypoint exited with status %d", code)
	if s := exitstatus.Signal(ws); s != "" {
		msg = "entrypoint was killed by " + s
	}
	p.fail(Result{Kind: torpor.FailureEntrypoint, ExitCode: code, Signal: exitstatus.Signal(ws),
		Output: out.String(), Message: msg})
	return code
}

// idle reports ready and reaps orphans until asked to stop.
func (p *initProc) idle() int {
	// Nothing waits for the report below before using the sandbox: a
	// child that exited before the signal handler was installed is
	// reaped here, its SIGCHLD lost.
	reapAll()
	p.report(ReadyFile, Ready{Time: time.Now().UTC()})
	for sig := range p.sigs {
		if sig == syscall.SIGCHLD {
			reapAll()
			continue
		}
		if isStop(sig) {
			code := 128 + int(sig.(syscall.Signal))
			p.fail(Result{Kind: KindTerminated, Signal: exitstatus.SignalName(sig.(syscall.Signal)), ExitCode: code,
				Message: "init was stopped by " + exitstatus.SignalName(sig.(syscall.Signal))})
			return code
		}
	}
	return 0
}

// startCommand starts argv with stdin from /dev/null and its stdout and
// stderr pumped into w, and returns its pid. The caller reaps it.
func startCommand(argv []string, w io.Writer) (int, *pump, error) {
	path, err := exec.LookPath(argv[0])
	if err != nil {
		return 0, nil, err
	}
	devnull, err := os.Open(os.DevNull)
	if err != nil {
		return 0, nil, err
	}
	defer devnull.Close()
	r, pw, err := os.Pipe()
	if err != nil {
		return 0, nil, err
	}
	proc, err := os.StartProcess(path, argv, &os.ProcAttr{
		Env:   os.Environ(),
		Files: []*os.File{devnull, pw, pw},
	})
	pw.Close()
	if err != nil {
		r.Close()
		return 0, nil, err
	}
	pid := proc.Pid
	_ = proc.Release() // reaped by wait4(-1), never by proc.Wait
	return pid, startPump(r, w), nil
}

// startErrorCode is the shell's exit code for a command that could not
// start: 127 when it does not exist, 126 otherwise.
func startErrorCode(err error) int {
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
		return 127
	}
	return 126
}
