package runc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/runtime/instances"
)

// instance identifies a booted container's init process on the host: its
// pid and its start time (so that a recycled pid is never mistaken for it).
// The runtime keeps it in the sandbox's directory, which the sandbox cannot
// reach; the handle returned by Boot carries the same fields but is only
// checked, never trusted.
type instance struct {
	instances.Proc
	// Init is the command that runs the torpor binary in the instance
	// (initBinary.argv at its boot); empty in records of instances booted
	// before it was kept, which ran a static binary.
	Init []string `json:"init,omitempty"`
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
	return instances.WriteFileAtomic(r.instanceFile(id), b, 0o600)
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
	f, err := in.Pidfd()
	if errors.Is(err, instances.ErrGone) {
		return in, false, nil
	}
	if err != nil {
		return in, in.Alive(), nil // no pidfds: ask /proc every time
	}
	fd, err := unix.Dup(int(f.Fd()))
	f.Close()
	if err != nil {
		return in, in.Alive(), nil
	}
	unix.CloseOnExec(fd)
	r.live.put(id, *in, fd)
	return in, true, nil
}
