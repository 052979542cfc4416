package nvidia

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor/gpu"
)

// A lease's group is named either by a cgroup path relative to the
// hierarchy's root ("torpor/sb_1", what runc gives a container), or by
// "pgid:N", the process group N (for a lease that is a plain process
// tree, as in scripts/gpu-check.sh).
const pgidPrefix = "pgid:"

// Freezer methods.
const (
	// FreezerCgroup freezes a cgroup with the kernel's freezer (v1
	// freezer.state, v2 cgroup.freeze): all or nothing by the kernel.
	FreezerCgroup = "cgroup"
	// FreezerSignal stops each process with SIGSTOP; one that cannot be
	// stopped (EPERM) makes the freeze continue those it stopped and fail.
	FreezerSignal = "signal"
)

func parsePgid(group string) (int, bool) {
	s, ok := strings.CutPrefix(group, pgidPrefix)
	if !ok {
		return 0, false
	}
	n, err := strconv.Atoi(s)
	return n, err == nil && n > 0
}

// cgroupV2 reports whether the cgroup root is a unified (v2) hierarchy.
func (h *Host) cgroupV2() bool {
	h.cgOnce.Do(func() {
		var st unix.Statfs_t
		if err := unix.Statfs(h.cfg.CgroupRoot, &st); err == nil {
			h.v2 = st.Type == unix.CGROUP2_SUPER_MAGIC
		}
	})
	return h.v2
}

// cgroupDir is the group's directory in the freezer's hierarchy.
func (h *Host) cgroupDir(group string) (string, error) {
	rel := filepath.Clean("/" + group)
	if rel == "/" {
		return "", fmt.Errorf("nvidia: group %q names the root cgroup", group)
	}
	if h.cgroupV2() {
		return filepath.Join(h.cfg.CgroupRoot, rel), nil
	}
	return filepath.Join(h.cfg.CgroupRoot, "freezer", rel), nil
}

// Processes implements gpu.Group.
func (h *Host) Processes(ctx context.Context, group string) ([]int, error) {
	if pgid, ok := parsePgid(group); ok {
		return pgroupMembers(h.cfg.ProcRoot, pgid)
	}
	dir, err := h.cgroupDir(group)
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.procs"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var pids []int
	for _, f := range strings.Fields(string(b)) {
		if pid, err := strconv.Atoi(f); err == nil && pid > 0 {
			pids = append(pids, pid)
		}
	}
	sort.Ints(pids)
	return pids, nil
}

// procSignaler stops and continues host processes with signals.
type procSignaler struct{ procRoot string }

func (s procSignaler) Stop(pid int) error {
	if err := syscall.Kill(pid, syscall.SIGSTOP); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("stop %d: %w", pid, gpu.ErrNoProcess)
		}
		return fmt.Errorf("stop %d: %w", pid, err)
	}
	// SIGSTOP is asynchronous: wait until the process is stopped.
	deadline := time.Now().Add(2 * time.Second)
	for !stopped(s.procRoot, pid) {
		if !alive(s.procRoot, pid) {
			return fmt.Errorf("stop %d: %w", pid, gpu.ErrNoProcess)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("stop %d: still running 2 s after SIGSTOP", pid)
		}
		time.Sleep(time.Millisecond)
	}
	return nil
}

func (s procSignaler) Continue(pid int) error {
	if err := syscall.Kill(pid, syscall.SIGCONT); err != nil {
		if errors.Is(err, syscall.ESRCH) {
			return fmt.Errorf("continue %d: %w", pid, gpu.ErrNoProcess)
		}
		return fmt.Errorf("continue %d: %w", pid, err)
	}
	return nil
}

// Freeze implements gpu.Group: the cgroup freezer for a cgroup (unless
// the host is configured for signals), SIGSTOP of each process for a
// process group. Either way it is all or nothing.
func (h *Host) Freeze(ctx context.Context, group string) error {
	if _, ok := parsePgid(group); ok || h.cfg.Freezer == FreezerSignal {
		pids, err := h.Processes(ctx, group)
		if err != nil {
			return err
		}
		return gpu.FreezeAll(pids, procSignaler{h.cfg.ProcRoot})
	}
	dir, err := h.cgroupDir(group)
	if err != nil {
		return err
	}
	if err := h.setFrozen(ctx, dir, true); err != nil {
		// No half-freeze: undo whatever the kernel managed.
		if terr := h.setFrozen(context.WithoutCancel(ctx), dir, false); terr != nil {
			err = errors.Join(err, fmt.Errorf("thaw after the failed freeze: %w", terr))
		}
		return fmt.Errorf("nvidia: freeze %s: %w", group, err)
	}
	return nil
}

// Thaw implements gpu.Group. A gone group thaws.
func (h *Host) Thaw(ctx context.Context, group string) error {
	if _, ok := parsePgid(group); ok || h.cfg.Freezer == FreezerSignal {
		pids, err := h.Processes(ctx, group)
		if err != nil {
			return err
		}
		var errs []error
		for _, pid := range pids {
			if err := (procSignaler{h.cfg.ProcRoot}).Continue(pid); err != nil && !errors.Is(err, gpu.ErrNoProcess) {
				errs = append(errs, err)
			}
		}
		return errors.Join(errs...)
	}
	dir, err := h.cgroupDir(group)
	if err != nil {
		return err
	}
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err := h.setFrozen(ctx, dir, false); err != nil {
		return fmt.Errorf("nvidia: thaw %s: %w", group, err)
	}
	return nil
}

// setFrozen writes the freezer's state and waits until the kernel says
// it holds (a v1 freeze can stay FREEZING while a task sleeps
// uninterruptibly; the write is repeated now and then).
func (h *Host) setFrozen(ctx context.Context, dir string, frozen bool) error {
	file, want, check, checkWant := filepath.Join(dir, "freezer.state"), "THAWED", filepath.Join(dir, "freezer.state"), "THAWED"
	if frozen {
		want, checkWant = "FROZEN", "FROZEN"
	}
	if h.cgroupV2() {
		file, check = filepath.Join(dir, "cgroup.freeze"), filepath.Join(dir, "cgroup.events")
		want, checkWant = "0", "0"
		if frozen {
			want, checkWant = "1", "1"
		}
	}
	write := func() error { return os.WriteFile(file, []byte(want), 0) }
	if err := write(); err != nil {
		return err
	}
	timeout := h.cfg.FreezeTimeout
	start, last := time.Now(), time.Now()
	for {
		b, err := os.ReadFile(check)
		if err != nil {
			return err
		}
		got := strings.TrimSpace(string(b))
		if h.cgroupV2() {
			got = eventValue(b, "frozen")
		}
		if got == checkWant {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		if time.Since(start) > timeout {
			return fmt.Errorf("freezer still %q after %v, want %q", got, timeout, checkWant)
		}
		if time.Since(last) > 50*time.Millisecond {
			if err := write(); err != nil {
				return err
			}
			last = time.Now()
		}
		time.Sleep(200 * time.Microsecond)
	}
}

func eventValue(b []byte, key string) string {
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok && k == key {
			return strings.TrimSpace(v)
		}
	}
	return ""
}

// Kill implements gpu.Group: the group is thawed and every process gets
// SIGCONT and then SIGTERM, so a stopped process runs its graceful path;
// whatever is left after grace gets SIGKILL.
func (h *Host) Kill(ctx context.Context, group string, grace time.Duration) error {
	if err := h.Thaw(ctx, group); err != nil {
		return err
	}
	list := func() []int {
		pids, _ := h.Processes(ctx, group)
		return pids
	}
	return killPIDs(ctx, h.cfg.ProcRoot, list, grace)
}

// killPIDs sends SIGCONT then SIGTERM to every process list returns,
// waits up to grace for them to go, then sends SIGKILL to those left.
func killPIDs(ctx context.Context, procRoot string, list func() []int, grace time.Duration) error {
	pids := list()
	for _, pid := range pids {
		_ = syscall.Kill(pid, syscall.SIGCONT)
		_ = syscall.Kill(pid, syscall.SIGTERM)
	}
	deadline := time.Now().Add(grace)
	for {
		left := pids[:0:0]
		for _, pid := range pids {
			if alive(procRoot, pid) {
				left = append(left, pid)
			}
		}
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			break
		}
		time.Sleep(5 * time.Millisecond)
	}
	var errs []error
	// A group may have forked since: list it again.
	for _, pid := range append(pids, list()...) {
		if !alive(procRoot, pid) {
			continue
		}
		if err := syscall.Kill(pid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
			errs = append(errs, fmt.Errorf("kill %d: %w", pid, err))
		}
	}
	return errors.Join(errs...)
}
