// Package exitstatus says how a process ended, from its wait status: the
// shell-style exit code and the name of the signal that killed it, as
// torpor reports them. The sandbox's init (package initproc) and the VM
// guest's agent (runtime/vm/agent) both reap their own children and report
// the same way; the agent is built into the guest's initramfs, so this
// package holds nothing but the standard library.
package exitstatus

import (
	"strconv"
	"syscall"
)

// Code turns a wait status into a shell-style exit code: the exit status,
// or 128 plus the signal that killed the process.
func Code(ws syscall.WaitStatus) int {
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

// Signal names the signal that killed the process, or "" when it exited.
func Signal(ws syscall.WaitStatus) string {
	if !ws.Signaled() {
		return ""
	}
	return SignalName(ws.Signal())
}

// SignalName returns a signal's name, like "SIGKILL"; one without a name
// here is "signal N".
func SignalName(sig syscall.Signal) string {
	if name, ok := names[sig]; ok {
		return name
	}
	return "signal " + strconv.Itoa(int(sig))
}

// names are the names of the signals that usually end a process.
var names = map[syscall.Signal]string{
	syscall.SIGHUP: "SIGHUP", syscall.SIGINT: "SIGINT", syscall.SIGQUIT: "SIGQUIT",
	syscall.SIGILL: "SIGILL", syscall.SIGTRAP: "SIGTRAP", syscall.SIGABRT: "SIGABRT",
	syscall.SIGBUS: "SIGBUS", syscall.SIGFPE: "SIGFPE", syscall.SIGKILL: "SIGKILL",
	syscall.SIGUSR1: "SIGUSR1", syscall.SIGSEGV: "SIGSEGV", syscall.SIGUSR2: "SIGUSR2",
	syscall.SIGPIPE: "SIGPIPE", syscall.SIGALRM: "SIGALRM", syscall.SIGTERM: "SIGTERM",
	syscall.SIGXCPU: "SIGXCPU", syscall.SIGXFSZ: "SIGXFSZ", syscall.SIGSYS: "SIGSYS",
}
