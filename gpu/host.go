// Package gpu holds torpor's GPU lease model (spec 004): a GPU sandbox is
// a lease of a slice of VRAM on a GPU host, held by the lease's worker
// process. Pause either freezes the whole lease (VRAM stays on the card,
// billed in full) or spills the worker's GPU state to host memory and
// frees the seat; a watchdog kills leases that overshoot their slice on
// hard-cap hosts; an idle sweep pauses leases nobody uses; meters say what
// each lease held and what it is billed.
//
// The package knows no HTTP, SQL or NVIDIA library: it talks to a GPU host
// through the small Host interface (gpu/nvidia is the real one, gpu/sim a
// simulated one that behaves as the spec's measurements say real hosts do)
// and to the lease's worker through Worker.
package gpu

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Prober reads how much VRAM is in use.
type Prober interface {
	// HardCap reports whether the host enforces a hard per-lease VRAM cap.
	// Only such a host reads VRAM per process: on a host without one,
	// transparent suspends always spill and there is no watchdog.
	HardCap() bool
	// Usage returns the VRAM in use per host pid and per device. An error
	// means the probe is unreadable.
	Usage(ctx context.Context) (Usage, error)
}

// Checkpointer moves one process's GPU state out of VRAM and back. It
// acts on that pid only (children are not touched) and must never be
// called on a stopped or frozen process: checkpoint before freeze, thaw
// before restore.
type Checkpointer interface {
	// Checkpoint copies the process's device memory to host memory and
	// releases its GPU resources (a spill).
	Checkpoint(ctx context.Context, pid int) error
	// Restore re-acquires the GPU and copies the memory back. It fails
	// with ErrOutOfMemory when the card cannot take it.
	Restore(ctx context.Context, pid int) error
}

// Group controls the processes of one lease as a whole. A group is named
// by a string the host understands (a cgroup path for gpu/nvidia).
type Group interface {
	// Processes lists the pids of the group's live processes; an empty
	// list when the group is gone.
	Processes(ctx context.Context, group string) ([]int, error)
	// Freeze stops every process of the group. It is all or nothing: when
	// one process cannot be stopped, those already stopped are continued
	// and the error says which one failed (see FreezeAll).
	Freeze(ctx context.Context, group string) error
	// Thaw continues every process of the group.
	Thaw(ctx context.Context, group string) error
	// Kill ends every process of the group, frozen or not: stopped
	// processes are continued before SIGTERM so their graceful path runs,
	// and what is left after grace gets SIGKILL.
	Kill(ctx context.Context, group string, grace time.Duration) error
}

// Host is what torpor asks of a GPU host.
type Host interface {
	Prober
	Checkpointer
	Group
}

// Worker controls the lease's worker: the long-running process torpor
// starts in the lease to hold its VRAM slice and run its jobs. Every other
// process of the lease (exec'd jobs and their children) is a non-worker.
type Worker interface {
	// Reserve makes the worker hold mib MiB of VRAM in all, growing or
	// shrinking its reservation; 0 releases the reservation, keeping only
	// what the worker needs to run (its CUDA context).
	Reserve(ctx context.Context, t Target, mib int64) error
}

// Target names a lease's processes for a host or worker call.
type Target struct {
	LeaseID   string
	Group     string
	WorkerPID int
	Devices   []int
}

// Usage is one reading of the host's VRAM.
type Usage struct {
	// ByPID is the VRAM each host process uses, in MiB, summed over
	// devices. A process with no VRAM may be absent.
	ByPID   map[int]int64
	Devices []DeviceUsage
}

// DeviceUsage is one device's memory.
type DeviceUsage struct {
	Index    int    `json:"index"`
	UUID     string `json:"uuid,omitempty"`
	UsedMiB  int64  `json:"used_mib"`
	TotalMiB int64  `json:"total_mib"`
}

// Split adds up the VRAM of pids: the worker's and everyone else's.
func (u Usage) Split(pids []int, worker int) (workerMiB, others int64) {
	for _, pid := range pids {
		if pid == worker {
			workerMiB += u.ByPID[pid]
		} else {
			others += u.ByPID[pid]
		}
	}
	// The worker may be missing from the group's list (a listing race);
	// its VRAM is still the worker's.
	if !contains(pids, worker) {
		workerMiB += u.ByPID[worker]
	}
	return workerMiB, others
}

func contains(pids []int, pid int) bool {
	for _, p := range pids {
		if p == pid {
			return true
		}
	}
	return false
}

// Errors a host reports, for errors.Is.
var (
	// ErrOutOfMemory: the card (or the lease's cap) cannot take the memory.
	ErrOutOfMemory = errors.New("out of GPU memory")
	// ErrProbeUnavailable: the VRAM usage cannot be read.
	ErrProbeUnavailable = errors.New("VRAM probe unavailable")
	// ErrNoProcess: the process does not exist (any more).
	ErrNoProcess = errors.New("no such process")
	// ErrStopped: the process is stopped or frozen, and the operation
	// must not run on a frozen process.
	ErrStopped = errors.New("process is stopped or frozen")
	// ErrNotCheckpointed / ErrCheckpointed: the process's GPU state is
	// not in the state the operation needs.
	ErrNotCheckpointed = errors.New("process is not checkpointed")
	ErrCheckpointed    = errors.New("process is checkpointed")
)

// Signaler stops and continues single processes (SIGSTOP and SIGCONT).
// Stop returns an error wrapping ErrNoProcess for a process that is gone.
type Signaler interface {
	Stop(pid int) error
	Continue(pid int) error
}

// FreezeError is a freeze that could not stop one of the lease's
// processes. Every process stopped before it was continued again.
type FreezeError struct {
	PID int
	Err error
	// Continued lists the processes that were stopped and continued.
	Continued []int
	// ContinueErr is set when continuing one of them failed as well.
	ContinueErr error
}

func (e *FreezeError) Error() string {
	msg := fmt.Sprintf("cannot stop process %d: %v; the %d processes stopped before it were continued", e.PID, e.Err, len(e.Continued))
	if e.ContinueErr != nil {
		msg += fmt.Sprintf(" (continuing failed: %v)", e.ContinueErr)
	}
	return msg
}

func (e *FreezeError) Unwrap() error { return e.Err }

// FreezeAll stops every pid in order. There is no half-freeze: when one
// cannot be stopped (EPERM, say), those it stopped are continued, last
// first, and a *FreezeError names the one that failed. A process that is
// already gone is skipped.
func FreezeAll(pids []int, s Signaler) error {
	stopped := make([]int, 0, len(pids))
	for _, pid := range pids {
		err := s.Stop(pid)
		if err == nil {
			stopped = append(stopped, pid)
			continue
		}
		if errors.Is(err, ErrNoProcess) {
			continue
		}
		var errs []error
		for i := len(stopped) - 1; i >= 0; i-- {
			if cerr := s.Continue(stopped[i]); cerr != nil && !errors.Is(cerr, ErrNoProcess) {
				errs = append(errs, cerr)
			}
		}
		return &FreezeError{PID: pid, Err: err, Continued: stopped, ContinueErr: errors.Join(errs...)}
	}
	return nil
}
