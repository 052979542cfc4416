package lifecycle_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/gpu"
	"github.com/torpor-dev/torpor/gpu/sim"
	"github.com/torpor-dev/torpor/lifecycle"
)

// gpuEnv is an engine with a GPU lease manager over a simulated host.
type gpuEnv struct {
	*env
	host *sim.Host
	mgr  *gpu.Manager
}

func newGPUEnv(t *testing.T, hardCap bool) *gpuEnv {
	g := &gpuEnv{host: sim.New(sim.Options{HardCap: hardCap})}
	g.env = newEnv(t, func(c *lifecycle.Config) {
		cfg := gpu.DefaultConfig()
		mgr, err := gpu.NewManager(gpu.Options{Host: g.host, Worker: g.host, Clock: c.Clock, Config: cfg, Store: c.Store.(gpu.Store),
			Flagger: c.Store.(gpu.Flagger)})
		if err != nil {
			t.Fatal(err)
		}
		g.mgr = mgr
		c.GPU = mgr
		c.GPUAttach = func(ctx context.Context, sb *torpor.Sandbox) (string, int, []int, error) {
			group := "sandbox:" + sb.ID
			return group, g.host.StartWorker(group, 0, 300), []int{0}, nil
		}
	})
	return g
}

func gpuStatus(t *testing.T, sb *torpor.Sandbox) gpu.Status {
	t.Helper()
	st, ok := sb.GPU.(gpu.Status)
	if !ok {
		t.Fatalf("sandbox %s shows no GPU lease (%T)", sb.ID, sb.GPU)
	}
	return st
}

func accel(mode string, idle *float64) *torpor.AccelRequest {
	return &torpor.AccelRequest{VRAMMiB: 4096, SuspendMode: mode, IdleTimeoutS: idle}
}

func TestGPUSandboxPauseModesAndBilling(t *testing.T) {
	cases := []struct {
		mode        string
		wantSpilled bool
		wantFrozen  bool
	}{
		{"none", false, true},       // pause freezes the lease; VRAM stays
		{"transparent", true, true}, // a host without a hard cap always spills
	}
	for _, c := range cases {
		t.Run(c.mode, func(t *testing.T) {
			g := newGPUEnv(t, false)
			sb := g.create(torpor.CreateRequest{Accel: accel(c.mode, nil)})
			st := gpuStatus(t, sb)
			if st.Phase != gpu.PhaseResident || !st.HoldsSeat || st.Meters.IdleTimeoutS != gpu.DefaultIdleTimeoutS {
				t.Fatalf("after create: %+v", st)
			}
			g.clock.Advance(10 * time.Second)
			paused := must2(g.eng.Pause(ctx, "acme", sb.ID, ""))
			st = gpuStatus(t, paused)
			if st.Phase != gpu.PhaseSuspended || st.Spilled != c.wantSpilled {
				t.Fatalf("paused: phase %s spilled %v, want suspended spilled %v", st.Phase, st.Spilled, c.wantSpilled)
			}
			g.clock.Advance(20 * time.Second)
			st = gpuStatus(t, g.get(sb.ID))
			switch c.mode {
			case "none": // frozen-resident bills in full
				if st.Meters.BilledS != st.Meters.ResidentS || st.Meters.BilledS < 30 {
					t.Errorf("a none freeze: billed %.0f resident %.0f, want equal and 30", st.Meters.BilledS, st.Meters.ResidentS)
				}
			case "transparent": // a spilled lease bills nothing while paused
				if st.Meters.BilledS > 10.001 {
					t.Errorf("a spilled lease billed %.0fs, want the 10 s before the pause", st.Meters.BilledS)
				}
			}
			res := must2(g.eng.Start(ctx, "acme", sb.ID))
			if st := gpuStatus(t, res); st.Phase != gpu.PhaseResident || st.Frozen {
				t.Fatalf("after resume: %+v", st)
			}
			must(g.eng.Delete(ctx, "acme", sb.ID))
			rows, err := g.store.ListGPUUsage(ctx, sb.ID)
			if err != nil || len(rows) == 0 {
				t.Fatalf("no GPU usage rows after delete: %v", err)
			}
		})
	}
}

func TestGPUAccelValidationAndTiers(t *testing.T) {
	g := newGPUEnv(t, false)
	zero, long := 0.0, 900.0
	cases := []struct {
		name  string
		tier  string
		accel *torpor.AccelRequest
		code  torpor.ErrorCode
		param string
	}{
		{"no vram", torpor.TierStandard, &torpor.AccelRequest{}, torpor.EInvalid, "accel.vram_mib"},
		{"bad mode", torpor.TierStandard, accel("teleport", nil), torpor.EInvalid, "accel.suspend_mode"},
		{"free tier turning auto-pause off", torpor.TierFree, accel("", &zero), torpor.EForbidden, "accel.idle_timeout_s"},
		{"free tier over 600 s", torpor.TierFree, accel("", &long), torpor.EForbidden, "accel.idle_timeout_s"},
		{"standard tier may", torpor.TierStandard, accel("", &zero), "", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := g.eng.Create(ctx, "acme", torpor.CreateRequest{Template: "base", Accel: c.accel, Caller: torpor.Caller{Tier: c.tier}})
			if c.code == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			var te *torpor.Error
			if !errors.As(err, &te) || te.Code != c.code || te.Param != c.param {
				t.Fatalf("got %v, want %s naming %s", err, c.code, c.param)
			}
			if c.code == torpor.EForbidden && te.Reason != gpu.ReasonFreeTierLimit {
				t.Errorf("reason %q, want %s", te.Reason, gpu.ReasonFreeTierLimit)
			}
		})
	}
	plain := newEnv(t)
	if _, err := plain.eng.Create(ctx, "acme", torpor.CreateRequest{Template: "base", Accel: accel("", nil)}); !torpor.IsCode(err, torpor.EInvalid) {
		t.Errorf("accel on a node without a GPU host: %v", err)
	}
}

// The lease manager's idle sweep pauses through the engine's pause path;
// exec on the paused sandbox wakes it and runs as a job of the lease.
func TestGPUIdleSweepAndExec(t *testing.T) {
	g := newGPUEnv(t, false)
	idle := 60.0
	sb := g.create(torpor.CreateRequest{Accel: accel("none", &idle)})
	for range 62 {
		g.clock.Advance(time.Second)
		time.Sleep(time.Millisecond)
	}
	got := settle(g.env, sb.ID, torpor.StatePaused)
	st := gpuStatus(t, got)
	if st.Meters.AutoPaused != 1 || got.Meters.AutoPaused != 1 {
		t.Fatalf("after the idle timeout: lease auto_paused %d, sandbox auto_paused %d", st.Meters.AutoPaused, got.Meters.AutoPaused)
	}
	if _, err := g.eng.Exec(ctx, "acme", sb.ID, torpor.ExecRequest{Cmd: []string{"nvidia-smi"}}); err != nil {
		t.Fatal(err)
	}
	got = g.get(sb.ID)
	if st := gpuStatus(t, got); got.State != torpor.StateRunning || st.Frozen || st.Meters.Jobs != 1 {
		t.Fatalf("after exec: %s %+v", got.State, st)
	}
}

// A lease killed by the watchdog (a child over the slice on a hard-cap
// host) fails its sandbox, and a restart re-seeds a live lease.
func TestGPUWatchdogFailsTheSandboxAndRestartAdopts(t *testing.T) {
	g := newGPUEnv(t, true)
	keep := g.create(torpor.CreateRequest{Accel: accel("transparent", nil)})
	runaway := g.create(torpor.CreateRequest{Accel: accel("transparent", nil), Caller: torpor.Caller{KeyID: "key_1"}})
	g.host.StartChild("sandbox:"+runaway.ID, 0, 8192)
	g.clock.Advance(2 * time.Second)
	got := waitState(g.env, runaway.ID, torpor.StateFailed)
	if got.Failure == nil || got.Failure.Code != lifecycle.FailureGPU {
		t.Fatalf("failure %+v, want %s", got.Failure, lifecycle.FailureGPU)
	}
	flags, err := g.store.KeyFlags(ctx, "key_1")
	if err != nil || len(flags) != 1 {
		t.Fatalf("the creating key was not flagged: %+v %v", flags, err)
	}
	g.restart()
	if st := gpuStatus(t, g.get(keep.ID)); st.Phase != gpu.PhaseResident {
		t.Fatalf("after a restart the live lease is %+v", st)
	}
}
