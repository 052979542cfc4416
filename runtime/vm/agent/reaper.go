package agent

import (
	"errors"
	"os"
	"os/signal"
	"sync"
	"syscall"
)

// reaper collects every child that exits: as pid 1 the agent inherits
// all orphans, and waiting for one pid with os/exec would race with
// reaping the rest. Processes the agent starts are registered (under the
// same lock the reaping takes, so no exit is missed) and get their
// status on a channel; others are reaped and forgotten.
type reaper struct {
	mu      sync.Mutex
	waiting map[int]chan syscall.WaitStatus
}

func startReaper() *reaper {
	r := &reaper{waiting: map[int]chan syscall.WaitStatus{}}
	sigs := make(chan os.Signal, 64)
	signal.Notify(sigs, syscall.SIGCHLD)
	go func() {
		for range sigs {
			r.reapAll()
		}
	}()
	return r
}

func (r *reaper) reapAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		if ch, ok := r.waiting[pid]; ok {
			ch <- ws
			delete(r.waiting, pid)
		}
	}
}

// start starts a process and returns a channel that gets its exit status.
func (r *reaper) start(path string, argv []string, attr *os.ProcAttr) (int, <-chan syscall.WaitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	p, err := os.StartProcess(path, argv, attr)
	if err != nil {
		return 0, nil, err
	}
	ch := make(chan syscall.WaitStatus, 1)
	r.waiting[p.Pid] = ch
	pid := p.Pid
	_ = p.Release()
	// A SIGCHLD that came before the registration found nothing to
	// deliver to; look again.
	go r.reapAll()
	return pid, ch, nil
}
