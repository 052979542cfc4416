// Package nvidia is the real GPU host of torpor's lease model: VRAM
// through NVML (github.com/NVIDIA/go-nvml, loaded with dlopen at run
// time; needs cgo) with nvidia-smi's CSV as the fallback, checkpoint and
// restore of one process's GPU state through NVIDIA's cuda-checkpoint
// utility, and freeze, thaw and kill of a lease's processes through the
// cgroup freezer (v1 or v2) or SIGSTOP/SIGCONT.
//
// The package builds and its host constructs on a machine without a GPU:
// what is missing shows as a clear error from the call that needs it.
package nvidia

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/torpor-dev/torpor/gpu"
)

// Config describes the host.
type Config struct {
	// HardCap: the host enforces a per-lease VRAM cap (MPS limits, MIG,
	// a driver-level cap). It turns on the per-process VRAM reading the
	// freeze-only rule and the watchdog use.
	HardCap bool
	// CgroupRoot is where the cgroup hierarchies are mounted.
	CgroupRoot string
	// Freezer is FreezerCgroup (default) or FreezerSignal for cgroup
	// groups; process groups ("pgid:N") always use signals.
	Freezer string
	// FreezeTimeout bounds how long a cgroup freeze may take.
	FreezeTimeout time.Duration
	// CheckpointBin is the cuda-checkpoint binary (found in PATH).
	CheckpointBin string
	// LockTimeout bounds cuda-checkpoint's lock action (driver 570+).
	LockTimeout time.Duration
	// SMIBin is nvidia-smi (found in PATH).
	SMIBin string
	// ProcRoot is the proc file system.
	ProcRoot string
	// NoNVML skips NVML and reads with nvidia-smi only.
	NoNVML bool
}

func (c *Config) defaults() {
	if c.CgroupRoot == "" {
		c.CgroupRoot = "/sys/fs/cgroup"
	}
	if c.Freezer == "" {
		c.Freezer = FreezerCgroup
	}
	if c.FreezeTimeout == 0 {
		c.FreezeTimeout = 10 * time.Second
	}
	if c.CheckpointBin == "" {
		c.CheckpointBin = "cuda-checkpoint"
	}
	if c.LockTimeout == 0 {
		c.LockTimeout = 10 * time.Second
	}
	if c.SMIBin == "" {
		c.SMIBin = "nvidia-smi"
	}
	if c.ProcRoot == "" {
		c.ProcRoot = "/proc"
	}
}

// runner runs a command and returns its combined output; a failure's
// error carries the output.
type runner func(ctx context.Context, name string, args ...string) ([]byte, error)

func execRunner(ctx context.Context, name string, args ...string) ([]byte, error) {
	path, err := exec.LookPath(name)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.Bytes(), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return out.Bytes(), nil
}

// Host is a real GPU host. It implements gpu.Host.
type Host struct {
	cfg Config
	run runner

	nvml    usageReader
	nvmlErr error

	ckptOnce    sync.Once
	ckptActions bool
	ckptErr     error

	cgOnce sync.Once
	v2     bool
}

// usageReader is NVML's side of the probe.
type usageReader interface {
	usage() (gpu.Usage, error)
	close()
}

var _ gpu.Host = (*Host)(nil)

// New returns the host. A missing NVIDIA library or tool is not an error
// here: NVML's absence is kept (NVMLError) and the probe falls back to
// nvidia-smi; a missing cuda-checkpoint fails the first checkpoint.
func New(cfg Config) (*Host, error) {
	cfg.defaults()
	if cfg.Freezer != FreezerCgroup && cfg.Freezer != FreezerSignal {
		return nil, fmt.Errorf("nvidia: freezer %q: want %q or %q", cfg.Freezer, FreezerCgroup, FreezerSignal)
	}
	h := &Host{cfg: cfg, run: execRunner}
	if cfg.NoNVML {
		h.nvmlErr = errors.New("NVML turned off")
	} else {
		h.nvml, h.nvmlErr = openNVML()
	}
	return h, nil
}

// Close releases NVML.
func (h *Host) Close() error {
	if h.nvml != nil {
		h.nvml.close()
		h.nvml = nil
	}
	return nil
}

// NVMLError says why NVML is not used (nil when it is).
func (h *Host) NVMLError() error { return h.nvmlErr }

// HardCap implements gpu.Prober.
func (h *Host) HardCap() bool { return h.cfg.HardCap }

// Usage implements gpu.Prober: NVML when it loaded, else nvidia-smi. An
// error wraps gpu.ErrProbeUnavailable and says what each source said.
func (h *Host) Usage(ctx context.Context) (gpu.Usage, error) {
	var errs []error
	if h.nvml != nil {
		u, err := h.nvml.usage()
		if err == nil {
			return u, nil
		}
		errs = append(errs, fmt.Errorf("nvml: %w", err))
	} else {
		errs = append(errs, fmt.Errorf("nvml: %w", h.nvmlErr))
	}
	u, err := h.smiUsage(ctx)
	if err == nil {
		return u, nil
	}
	errs = append(errs, err)
	return gpu.Usage{}, fmt.Errorf("%w: %v", gpu.ErrProbeUnavailable, errors.Join(errs...))
}

// ProbeSource names what Usage reads: "nvml" or "nvidia-smi".
func (h *Host) ProbeSource() string {
	if h.nvml != nil {
		return "nvml"
	}
	return "nvidia-smi"
}
