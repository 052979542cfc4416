package sim_test

import (
	"context"
	"errors"
	"syscall"
	"testing"

	"github.com/torpor-dev/torpor/gpu"
	"github.com/torpor-dev/torpor/gpu/sim"
)

// TestSimBehavesAsTheMeasuredHosts checks the simulated host against the
// measurements of spec 004.
func TestSimBehavesAsTheMeasuredHosts(t *testing.T) {
	ctx := context.Background()

	t.Run("checkpoint acts on the worker only; children keep running and their VRAM", func(t *testing.T) {
		h := sim.New(sim.Options{HardCap: true})
		w := h.StartWorker("g", 0, 500)
		c := h.StartChild("g", 0, 2000)
		if err := h.Checkpoint(ctx, w); err != nil {
			t.Fatal(err)
		}
		if p := h.Proc(w); !p.Checkpointed || p.VRAMMiB != 0 {
			t.Fatalf("worker = %+v", p)
		}
		if p := h.Proc(c); !p.Alive || p.Stopped || p.VRAMMiB != 2000 {
			t.Fatalf("child = %+v", p)
		}
		if err := h.Alloc(c, 100); err != nil {
			t.Fatalf("a child keeps running after the worker's checkpoint: %v", err)
		}
	})

	t.Run("checkpointing a child kills it", func(t *testing.T) {
		h := sim.New(sim.Options{})
		h.StartWorker("g", 0, 500)
		c := h.StartChild("g", 0, 2000)
		err := h.Checkpoint(ctx, c)
		if !errors.Is(err, sim.ErrChildKilled) || h.Proc(c).Alive {
			t.Fatalf("err = %v, child = %+v", err, h.Proc(c))
		}
	})

	t.Run("checkpoint and restore refuse a stopped process", func(t *testing.T) {
		h := sim.New(sim.Options{})
		w := h.StartWorker("g", 0, 500)
		if err := h.Freeze(ctx, "g"); err != nil {
			t.Fatal(err)
		}
		if err := h.Checkpoint(ctx, w); !errors.Is(err, gpu.ErrStopped) {
			t.Fatalf("checkpoint of a frozen process: %v", err)
		}
		_ = h.Thaw(ctx, "g")
		if err := h.Checkpoint(ctx, w); err != nil {
			t.Fatal(err)
		}
		_ = h.Freeze(ctx, "g")
		if err := h.Restore(ctx, w); !errors.Is(err, gpu.ErrStopped) {
			t.Fatalf("restore of a frozen process: %v", err)
		}
	})

	t.Run("restore fails with out-of-memory when the card is full", func(t *testing.T) {
		h := sim.New(sim.Options{DeviceMiB: []int64{4096}})
		w := h.StartWorker("g", 0, 3000)
		if err := h.Checkpoint(ctx, w); err != nil {
			t.Fatal(err)
		}
		h.StartChild("other", 0, 2000)
		if err := h.Restore(ctx, w); !errors.Is(err, gpu.ErrOutOfMemory) {
			t.Fatalf("restore = %v", err)
		}
		if !h.Proc(w).Checkpointed {
			t.Fatal("a failed restore lost the checkpoint")
		}
	})

	t.Run("freeze can fail with EPERM and leaves nothing stopped", func(t *testing.T) {
		h := sim.New(sim.Options{})
		w := h.StartWorker("g", 0, 500)
		c := h.StartChild("g", 0, 100)
		h.FailStop(c, syscall.EPERM)
		if err := h.Freeze(ctx, "g"); !errors.Is(err, syscall.EPERM) {
			t.Fatalf("freeze = %v", err)
		}
		if h.Proc(w).Stopped || h.Proc(c).Stopped {
			t.Fatal("a failed freeze left a process stopped")
		}
	})

	t.Run("a host without a hard cap has no VRAM reading", func(t *testing.T) {
		h := sim.New(sim.Options{})
		if _, err := h.Usage(ctx); !errors.Is(err, gpu.ErrProbeUnavailable) {
			t.Fatalf("usage = %v", err)
		}
	})

	t.Run("a hard-cap host reads VRAM per pid and can be made unreadable", func(t *testing.T) {
		h := sim.New(sim.Options{HardCap: true})
		w := h.StartWorker("g", 0, 500)
		u, err := h.Usage(ctx)
		if err != nil || u.ByPID[w] != 500 || u.Devices[0].UsedMiB != 500 {
			t.Fatalf("usage = %+v, %v", u, err)
		}
		h.FailProbe(errors.New("nvml gone"))
		if _, err := h.Usage(ctx); !errors.Is(err, gpu.ErrProbeUnavailable) {
			t.Fatalf("usage = %v", err)
		}
	})

	t.Run("kill continues stopped processes before SIGTERM", func(t *testing.T) {
		h := sim.New(sim.Options{})
		w := h.StartWorker("g", 0, 500)
		_ = h.Freeze(ctx, "g")
		_ = h.Kill(ctx, "g", 0)
		if p := h.Proc(w); p.Alive || len(p.Signals) != 3 || p.Signals[1] != "CONT" || p.Signals[2] != "TERM" {
			t.Fatalf("worker = %+v", p)
		}
	})
}
