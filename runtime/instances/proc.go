// Package instances holds what the runtimes that run sandbox instances on
// this host (runtime/runc and runtime/vm) do alike, so that a fix lands
// once: they know an instance by its top process (a container's init,
// a VM's QEMU), pinned by pid and start time and waited on through a
// pidfd; they keep its records in the sandbox's directory; and they check
// InstanceRefs, refuse verbs by the instance's state and wait for it to
// stop in the same way. What is particular to one runtime (the runc CLI,
// QEMU's monitor, the guest agent) stays in its package.
package instances

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Proc identifies a process on the host by its pid and its start time (in
// clock ticks since boot), so that a recycled pid is never taken for it.
// It is kept in the instance's record, so a daemon that restarts finds
// the processes an earlier one started; they are not its children.
type Proc struct {
	PID   int    `json:"pid"`
	Start uint64 `json:"start"`
}

// ErrGone says that the process has exited.
var ErrGone = errors.New("the process has exited")

// ExitTimeout bounds the wait for a process that was killed, or told to
// end, to exit.
const ExitTimeout = 10 * time.Second

// pollInterval is how often Wait looks at /proc where pidfds cannot be
// polled.
const pollInterval = 10 * time.Millisecond

// Stat returns a process's start time (clock ticks since boot) and state
// letter from /proc/pid/stat.
func Stat(pid int) (start uint64, state byte, err error) {
	if pid <= 0 {
		return 0, 0, fs.ErrNotExist
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, err
	}
	// pid (comm) state ppid ... starttime is field 22; comm may hold
	// spaces and parentheses, so count from the last ')'.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 {
		return 0, 0, errors.New("malformed /proc stat")
	}
	f := bytes.Fields(b[i+1:])
	if len(f) < 20 || len(f[0]) != 1 {
		return 0, 0, errors.New("malformed /proc stat")
	}
	start, err = strconv.ParseUint(string(f[19]), 10, 64)
	return start, f[0][0], err
}

// Alive reports whether the process still runs (a zombie does not).
func (p Proc) Alive() bool {
	start, state, err := Stat(p.PID)
	return err == nil && start == p.Start && state != 'Z' && state != 'X'
}

// Pidfd returns a pidfd on the process, checked to be that process and
// not a later one with the same pid; ErrGone if it has exited.
func (p Proc) Pidfd() (*os.File, error) {
	fd, err := unix.PidfdOpen(p.PID, unix.PIDFD_NONBLOCK)
	if errors.Is(err, unix.ESRCH) {
		return nil, ErrGone
	}
	if err != nil {
		return nil, fmt.Errorf("pidfd_open: %w", err)
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	// The pid is pinned now; check that it is still our process.
	if !p.Alive() {
		f.Close()
		return nil, ErrGone
	}
	return f, nil
}

// Signal sends sig to the process if it is still the one started;
// ErrGone if it has exited.
func (p Proc) Signal(sig syscall.Signal) error {
	f, err := p.Pidfd()
	if err != nil {
		return err
	}
	defer f.Close()
	err = unix.PidfdSendSignal(int(f.Fd()), sig, nil, 0)
	if errors.Is(err, unix.ESRCH) {
		return ErrGone
	}
	return err
}

// Wait blocks until the process has exited or ctx ends. It waits for the
// pidfd to become readable through Go's netpoller, so a waiting sandbox
// costs no OS thread, and it works for processes that are not this
// process's children (started by an earlier daemon).
func (p Proc) Wait(ctx context.Context) error {
	f, err := p.Pidfd()
	if errors.Is(err, ErrGone) {
		return nil
	}
	if err != nil {
		return p.pollWait(ctx)
	}
	defer f.Close()
	rc, err := f.SyscallConn()
	if err != nil {
		return p.pollWait(ctx)
	}
	stop := context.AfterFunc(ctx, func() { _ = f.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	err = rc.Read(func(fd uintptr) bool {
		pf := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, _ := unix.Poll(pf, 0)
		return n > 0
	})
	if ctxErr := ctx.Err(); ctxErr != nil {
		return ctxErr
	}
	if err != nil {
		// Not pollable here: fall back to polling /proc.
		return p.pollWait(ctx)
	}
	return nil
}

// pollWait is Wait's fallback for kernels without pidfds.
func (p Proc) pollWait(ctx context.Context) error {
	t := time.NewTicker(pollInterval)
	defer t.Stop()
	for p.Alive() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// AwaitExit waits, at most ExitTimeout, for the process to exit.
func (p Proc) AwaitExit(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, ExitTimeout)
	defer cancel()
	return p.Wait(ctx)
}

// Kill ends the process at once and waits (at most ExitTimeout) for it to
// exit. A process that is gone already is fine.
func (p Proc) Kill(ctx context.Context) error {
	if err := p.Signal(syscall.SIGKILL); err != nil && !errors.Is(err, ErrGone) {
		return fmt.Errorf("signal: %w", err)
	}
	if err := p.AwaitExit(ctx); err != nil {
		return fmt.Errorf("does not exit: %w", err)
	}
	return nil
}
