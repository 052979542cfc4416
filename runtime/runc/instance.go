package runc

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor"
)

// instance identifies a booted container's init process on the host: its
// pid and its start time (so that a recycled pid is never mistaken for it).
// The runtime keeps it in the sandbox's directory, which the sandbox cannot
// reach; the handle returned by Boot carries the same fields but is only
// checked, never trusted.
type instance struct {
	PID   int    `json:"pid"`
	Start uint64 `json:"start"`
}

// handle encodes the instance as Boot's opaque handle.
func (in instance) handle(id string) string {
	return fmt.Sprintf("runc:%s:%d:%d", id, in.PID, in.Start)
}

// parseHandle checks that h is a handle of sandbox id. An empty handle is
// fine: the runtime finds the instance by sandbox id alone.
func parseHandle(id, h string) error {
	if h == "" {
		return nil
	}
	f := strings.Split(h, ":")
	if len(f) != 4 || f[0] != "runc" || f[1] != id {
		return torpor.Invalid("handle", "not a runc handle of sandbox %s", id)
	}
	if _, err := strconv.Atoi(f[2]); err != nil {
		return torpor.Invalid("handle", "malformed runc handle")
	}
	if _, err := strconv.ParseUint(f[3], 10, 64); err != nil {
		return torpor.Invalid("handle", "malformed runc handle")
	}
	return nil
}

// procStat returns a process's start time (in clock ticks since boot) and
// state letter from /proc/pid/stat.
func procStat(pid int) (start uint64, state byte, err error) {
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

// alive reports whether the instance's init still runs (a zombie does not).
func (in *instance) alive() bool {
	start, state, err := procStat(in.PID)
	return err == nil && start == in.Start && state != 'Z' && state != 'X'
}

// errGone: the instance's init process has exited.
var errGone = errors.New("instance init has exited")

// openPidfd returns a pidfd on the instance's init, checked to be that
// process and not a later one with the same pid; errGone if it exited.
func (in *instance) openPidfd() (*os.File, error) {
	fd, err := unix.PidfdOpen(in.PID, unix.PIDFD_NONBLOCK)
	if errors.Is(err, syscall.ESRCH) {
		return nil, errGone
	}
	if err != nil {
		return nil, fmt.Errorf("pidfd_open: %w", err)
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	// The pid is pinned now; check that it is still our process.
	if start, state, err := procStat(in.PID); err != nil || start != in.Start || state == 'Z' || state == 'X' {
		f.Close()
		return nil, errGone
	}
	return f, nil
}

// signal sends sig to the instance's init, if it is still that process.
func (in *instance) signal(sig syscall.Signal) error {
	f, err := in.openPidfd()
	if err != nil {
		return err
	}
	defer f.Close()
	return unix.PidfdSendSignal(int(f.Fd()), sig, nil, 0)
}

// wait blocks until the instance's init exits or ctx ends. It waits for the
// pidfd to become readable through Go's netpoller, so a waiting sandbox
// costs no OS thread, and it works for processes that are not this
// process's children (booted by an earlier daemon).
func (in *instance) wait(ctx context.Context) error {
	f, err := in.openPidfd()
	if errors.Is(err, errGone) {
		return nil
	}
	if err != nil {
		return in.pollWait(ctx)
	}
	defer f.Close()
	rc, err := f.SyscallConn()
	if err != nil {
		return in.pollWait(ctx)
	}
	stop := context.AfterFunc(ctx, func() { _ = f.SetReadDeadline(time.Unix(1, 0)) })
	defer stop()
	err = rc.Read(func(fd uintptr) bool {
		p := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, _ := unix.Poll(p, 0)
		return n > 0
	})
	if ctxErr := ctx.Err(); ctxErr != nil {
		return ctxErr
	}
	if err != nil {
		// Not pollable here: fall back to polling /proc.
		return in.pollWait(ctx)
	}
	return nil
}

// pollWait is wait's fallback for kernels without pidfds.
func (in *instance) pollWait(ctx context.Context) error {
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for in.alive() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// loadInstance reads the sandbox's instance record; nil when there is none.
func (r *Runtime) loadInstance(id string) (*instance, error) {
	b, err := os.ReadFile(r.instanceFile(id))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var in instance
	if err := json.Unmarshal(b, &in); err != nil || in.PID <= 0 {
		return nil, fmt.Errorf("instance record of %s is corrupt: %v", id, err)
	}
	return &in, nil
}

// saveInstance writes the instance record atomically.
func (r *Runtime) saveInstance(id string, in instance) error {
	b, err := json.Marshal(in)
	if err != nil {
		return err
	}
	return writeFileAtomic(r.instanceFile(id), b)
}

// writeFileAtomic writes a file through a temporary file and a rename.
func writeFileAtomic(name string, b []byte) error {
	tmp := name + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, name)
}

// liveSet remembers, per sandbox, the instance whose init was last seen
// alive together with a pidfd on that init, so that asking whether it still
// runs is one poll(2) instead of reading /proc and the record. An entry
// whose pidfd reports an exit is dropped, and the caller goes back to the
// record on disk (another Runtime may have booted a new instance).
type liveSet struct {
	mu sync.Mutex
	m  map[string]liveEntry
}

type liveEntry struct {
	in    instance
	pidfd int
}

// get returns the cached instance of id if its init still runs.
func (s *liveSet) get(id string) (instance, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e, ok := s.m[id]
	if !ok {
		return instance{}, false
	}
	p := []unix.PollFd{{Fd: int32(e.pidfd), Events: unix.POLLIN}}
	if n, err := unix.Poll(p, 0); err == nil && n == 0 {
		return e.in, true
	}
	unix.Close(e.pidfd)
	delete(s.m, id)
	return instance{}, false
}

// put caches in with a pidfd the set now owns.
func (s *liveSet) put(id string, in instance, pidfd int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.m == nil {
		s.m = map[string]liveEntry{}
	}
	if old, ok := s.m[id]; ok {
		unix.Close(old.pidfd)
	}
	s.m[id] = liveEntry{in: in, pidfd: pidfd}
}

// drop forgets id.
func (s *liveSet) drop(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if e, ok := s.m[id]; ok {
		unix.Close(e.pidfd)
		delete(s.m, id)
	}
}

// lookup returns the sandbox's instance record (nil when there is none)
// and whether its init still runs.
func (r *Runtime) lookup(ctx context.Context, id string) (*instance, bool, error) {
	if in, ok := r.live.get(id); ok {
		return &in, true, nil
	}
	in, err := r.findInstance(ctx, id)
	if err != nil || in == nil {
		return in, false, err
	}
	f, err := in.openPidfd()
	if errors.Is(err, errGone) {
		return in, false, nil
	}
	if err != nil {
		return in, in.alive(), nil // no pidfds: ask /proc every time
	}
	fd, err := unix.Dup(int(f.Fd()))
	f.Close()
	if err != nil {
		return in, in.alive(), nil
	}
	unix.CloseOnExec(fd)
	r.live.put(id, *in, fd)
	return in, true, nil
}
