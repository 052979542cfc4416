package nvidia

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/torpor-dev/torpor/gpu"
)

// ErrNoCheckpointTool: NVIDIA's cuda-checkpoint utility is not installed,
// so this host cannot spill; transparent suspends fail to checkpoint.
var ErrNoCheckpointTool = errors.New("cuda-checkpoint not found (https://github.com/NVIDIA/cuda-checkpoint, display driver 550 or later)")

// CUDA process states cuda-checkpoint --get-state prints.
const (
	cudaRunning      = "running"
	cudaLocked       = "locked"
	cudaCheckpointed = "checkpointed"
	cudaFailed       = "failed"
)

// checkpointer drives cuda-checkpoint: with driver 570 or later it uses
// the explicit actions (lock with a timeout, then checkpoint; restore,
// then unlock), with 550 the --toggle form.
func (h *Host) hasActions(ctx context.Context) (bool, error) {
	h.ckptOnce.Do(func() {
		out, err := h.run(ctx, h.cfg.CheckpointBin, "--help")
		if err != nil && len(out) == 0 {
			h.ckptErr = fmt.Errorf("%w: %v", ErrNoCheckpointTool, err)
			return
		}
		h.ckptActions = strings.Contains(string(out), "--action")
	})
	return h.ckptActions, h.ckptErr
}

// cudaState returns the CUDA checkpoint state of pid.
func (h *Host) cudaState(ctx context.Context, pid int) (string, error) {
	out, err := h.run(ctx, h.cfg.CheckpointBin, "--get-state", "--pid", strconv.Itoa(pid))
	if err != nil {
		return "", err
	}
	return parseCudaState(out)
}

func parseCudaState(out []byte) (string, error) {
	s := strings.ToLower(strings.TrimSpace(string(out)))
	for _, st := range []string{cudaCheckpointed, cudaRunning, cudaLocked, cudaFailed} {
		if s == st || strings.HasSuffix(s, " "+st) || strings.HasPrefix(s, st+"\n") {
			return st, nil
		}
	}
	return "", fmt.Errorf("cuda-checkpoint: unknown state %q", strings.TrimSpace(string(out)))
}

// ckptError classifies a cuda-checkpoint failure: out-of-memory and a
// vanished process get the gpu package's errors.
func ckptError(pid int, procRoot string, err error) error {
	msg := strings.ToLower(err.Error())
	switch {
	case strings.Contains(msg, "out of memory") || strings.Contains(msg, "out_of_memory"):
		return fmt.Errorf("%w: %v", gpu.ErrOutOfMemory, err)
	case !alive(procRoot, pid):
		return fmt.Errorf("%w: %v", gpu.ErrNoProcess, err)
	}
	return err
}

// prepare validates pid before cuda-checkpoint touches it: a process,
// not a thread, alive, and neither stopped nor in a frozen cgroup.
func (h *Host) prepare(ctx context.Context, pid int) error {
	if err := checkProcess(h.cfg.ProcRoot, pid); err != nil {
		return err
	}
	if h.inFrozenCgroup(pid) {
		return fmt.Errorf("pid %d is in a frozen cgroup: %w (checkpoint before freeze, thaw before restore)", pid, gpu.ErrStopped)
	}
	if _, err := h.hasActions(ctx); err != nil {
		return err
	}
	return nil
}

// Checkpoint implements gpu.Checkpointer with cuda-checkpoint: the
// process's device memory goes to host memory and its GPU resources are
// released. It acts on pid only; a checkpointed pid succeeds.
func (h *Host) Checkpoint(ctx context.Context, pid int) error {
	if err := h.prepare(ctx, pid); err != nil {
		return err
	}
	p := strconv.Itoa(pid)
	state, stErr := h.cudaState(ctx, pid)
	if stErr == nil {
		switch state {
		case cudaCheckpointed:
			return nil
		case cudaFailed:
			return fmt.Errorf("cuda-checkpoint: pid %d is in the failed state", pid)
		}
	}
	actions, _ := h.hasActions(ctx)
	if !actions {
		if stErr == nil && state != cudaRunning {
			return fmt.Errorf("cuda-checkpoint: pid %d is %s, not running", pid, state)
		}
		if _, err := h.run(ctx, h.cfg.CheckpointBin, "--toggle", "--pid", p); err != nil {
			return ckptError(pid, h.cfg.ProcRoot, err)
		}
	} else {
		if stErr != nil || state == cudaRunning {
			ms := strconv.FormatInt(h.cfg.LockTimeout.Milliseconds(), 10)
			if _, err := h.run(ctx, h.cfg.CheckpointBin, "--action", "lock", "--pid", p, "--timeout", ms); err != nil {
				return ckptError(pid, h.cfg.ProcRoot, err)
			}
		}
		if _, err := h.run(ctx, h.cfg.CheckpointBin, "--action", "checkpoint", "--pid", p); err != nil {
			// Give the process its CUDA back before reporting.
			_, _ = h.run(ctx, h.cfg.CheckpointBin, "--action", "unlock", "--pid", p)
			return ckptError(pid, h.cfg.ProcRoot, err)
		}
	}
	if st, err := h.cudaState(ctx, pid); err == nil && st != cudaCheckpointed {
		return fmt.Errorf("cuda-checkpoint: pid %d is %s after the checkpoint", pid, st)
	}
	return nil
}

// Restore implements gpu.Checkpointer with cuda-checkpoint. A process
// that is not checkpointed returns gpu.ErrNotCheckpointed; one left
// locked by an interrupted restore is unlocked.
func (h *Host) Restore(ctx context.Context, pid int) error {
	if err := h.prepare(ctx, pid); err != nil {
		return err
	}
	p := strconv.Itoa(pid)
	state, stErr := h.cudaState(ctx, pid)
	if stErr == nil {
		switch state {
		case cudaRunning:
			return fmt.Errorf("pid %d: %w", pid, gpu.ErrNotCheckpointed)
		case cudaFailed:
			return fmt.Errorf("cuda-checkpoint: pid %d is in the failed state", pid)
		}
	}
	actions, _ := h.hasActions(ctx)
	switch {
	case !actions:
		if _, err := h.run(ctx, h.cfg.CheckpointBin, "--toggle", "--pid", p); err != nil {
			return ckptError(pid, h.cfg.ProcRoot, err)
		}
	default:
		if stErr != nil || state == cudaCheckpointed {
			if _, err := h.run(ctx, h.cfg.CheckpointBin, "--action", "restore", "--pid", p); err != nil {
				return ckptError(pid, h.cfg.ProcRoot, err)
			}
		}
		if _, err := h.run(ctx, h.cfg.CheckpointBin, "--action", "unlock", "--pid", p); err != nil {
			return ckptError(pid, h.cfg.ProcRoot, err)
		}
	}
	if st, err := h.cudaState(ctx, pid); err == nil && st != cudaRunning {
		return fmt.Errorf("cuda-checkpoint: pid %d is %s after the restore", pid, st)
	}
	return nil
}

// inFrozenCgroup reports whether pid's cgroup is frozen (v1 freezer
// state FROZEN or FREEZING, v2 cgroup.freeze 1).
func (h *Host) inFrozenCgroup(pid int) bool {
	b, err := os.ReadFile(filepath.Join(h.cfg.ProcRoot, strconv.Itoa(pid), "cgroup"))
	if err != nil {
		return false
	}
	v2 := h.cgroupV2()
	rel, ok := parseProcCgroup(b, v2)
	if !ok {
		return false
	}
	if v2 {
		s, err := os.ReadFile(filepath.Join(h.cfg.CgroupRoot, rel, "cgroup.freeze"))
		return err == nil && strings.TrimSpace(string(s)) == "1"
	}
	s, err := os.ReadFile(filepath.Join(h.cfg.CgroupRoot, "freezer", rel, "freezer.state"))
	return err == nil && strings.TrimSpace(string(s)) != "THAWED"
}
