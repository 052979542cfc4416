package daemon

import (
	"context"
	"log/slog"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/gpu"
	"github.com/torpor-dev/torpor/gpu/sim"
	"github.com/torpor-dev/torpor/lifecycle"
)

// simWorkerBaseMiB is what a simulated worker holds before it reserves
// its slice: its CUDA context.
const simWorkerBaseMiB = 300

// newGPU returns the node's GPU lease manager and how a booted GPU
// sandbox's lease is placed, or nils when the node has no GPU host. The
// engine that is given the manager attaches itself to it (gpu.Sink).
func newGPU(cfg Config, st nodeStore, getenv func(string) string, log *slog.Logger) (lifecycle.GPULeases, lifecycle.GPUAttacher, error) {
	if !cfg.GPUSim {
		return nil, nil, nil
	}
	gcfg, err := gpu.ConfigFromEnv(getenv)
	if err != nil {
		return nil, nil, err
	}
	host := sim.New(sim.Options{HardCap: cfg.GPUSimHardCap})
	mgr, err := gpu.NewManager(gpu.Options{
		Host: host, Worker: host, Clock: torpor.SystemClock{}, Config: gcfg, Store: st, Flagger: st, Log: log,
	})
	if err != nil {
		return nil, nil, err
	}
	log.Info("GPU host: simulated", "hard_cap", cfg.GPUSimHardCap, "idle_autopause", gcfg.IdleAutoPause,
		"resume_grace", gcfg.ResumeGrace)
	attach := func(ctx context.Context, sb *torpor.Sandbox) (string, int, []int, error) {
		group := "sandbox:" + sb.ID
		return group, host.StartWorker(group, 0, simWorkerBaseMiB), []int{0}, nil
	}
	return mgr, attach, nil
}
