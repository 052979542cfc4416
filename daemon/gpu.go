package daemon

import (
	"context"
	"log/slog"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/gpu"
	"github.com/torpor-dev/torpor/gpu/sim"
	"github.com/torpor-dev/torpor/lifecycle"
	"github.com/torpor-dev/torpor/store/sqlite"
)

// simWorkerBaseMiB is what a simulated worker holds before it reserves
// its slice: its CUDA context.
const simWorkerBaseMiB = 300

// newGPU returns the node's GPU lease manager and how a booted GPU
// sandbox's lease is placed, or nils when the node has no GPU host. bind
// gives the manager the engine, which is made after it.
func newGPU(cfg Config, st *sqlite.Store, getenv func(string) string, log *slog.Logger) (lifecycle.GPULeases, lifecycle.GPUAttacher, func(*lifecycle.Engine), error) {
	if !cfg.GPUSim {
		return nil, nil, func(*lifecycle.Engine) {}, nil
	}
	gcfg, err := gpu.ConfigFromEnv(getenv)
	if err != nil {
		return nil, nil, nil, err
	}
	host := sim.New(sim.Options{HardCap: cfg.GPUSimHardCap})
	var eng *lifecycle.Engine
	mgr, err := gpu.NewManager(gpu.Options{
		Host: host, Worker: host, Clock: torpor.SystemClock{}, Config: gcfg, Store: st, Flagger: st, Log: log,
		Pause: func(ctx context.Context, id string) error { return eng.PauseForGPUSweep(ctx, id) },
		OnEvent: func(ev gpu.Event) {
			if eng != nil {
				eng.OnGPUEvent(ev)
			}
		},
	})
	if err != nil {
		return nil, nil, nil, err
	}
	log.Info("GPU host: simulated", "hard_cap", cfg.GPUSimHardCap, "idle_autopause", gcfg.IdleAutoPause,
		"resume_grace", gcfg.ResumeGrace)
	attach := func(ctx context.Context, sb *torpor.Sandbox) (string, int, []int, error) {
		group := "sandbox:" + sb.ID
		return group, host.StartWorker(group, 0, simWorkerBaseMiB), []int{0}, nil
	}
	return mgr, attach, func(e *lifecycle.Engine) { eng = e }, nil
}
