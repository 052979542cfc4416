package gpu_test

import (
	"context"
	"testing"

	"github.com/torpor-dev/torpor/clocktest"
	"github.com/torpor-dev/torpor/gpu"
	"github.com/torpor-dev/torpor/gpu/sim"
)

// A host says how many GPUs it has, of which model and how much VRAM.
func TestCapacity(t *testing.T) {
	c, err := newEnv(t, false).m.Capacity(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if c != (gpu.Capacity{Count: 1, Model: sim.SimModel, TotalMiB: 24576}) {
		t.Fatalf("the default simulated host says %+v, want one %q of 24576 MiB", c, sim.SimModel)
	}
	h := sim.New(sim.Options{DeviceMiB: []int64{81920, 81920}, Model: "H100"})
	m, err := gpu.NewManager(gpu.Options{Host: h, Worker: h, Clock: clocktest.New(t0)})
	if err != nil {
		t.Fatal(err)
	}
	if c, err = m.Capacity(context.Background()); err != nil || c != (gpu.Capacity{Count: 2, Model: "H100", TotalMiB: 2 * 81920}) {
		t.Fatalf("a host of two H100s says %+v, %v", c, err)
	}
}

// The leases that hold a seat hold their slice of the VRAM, frozen ones
// too; a spilled lease gives it back until it resumes, a destroyed one
// for good.
func TestHeldVRAMFollowsTheSeats(t *testing.T) {
	e := newEnv(t, false)
	e.lease("frozen", gpu.SuspendNone)
	e.lease("spilled", gpu.SuspendTransparent)
	if got := e.m.HeldVRAMMiB(); got != 2*sliceMiB {
		t.Fatalf("two resident leases hold %d MiB, want %d", got, 2*sliceMiB)
	}
	e.pause("frozen")
	e.pause("spilled")
	if got := e.m.HeldVRAMMiB(); got != sliceMiB {
		t.Fatalf("a frozen and a spilled lease hold %d MiB, want the frozen one's %d", got, sliceMiB)
	}
	e.resume("spilled")
	if got := e.m.HeldVRAMMiB(); got != 2*sliceMiB {
		t.Fatalf("after the spilled lease resumed: %d MiB held, want %d", got, 2*sliceMiB)
	}
	if _, err := e.m.Destroy(context.Background(), "frozen"); err != nil {
		t.Fatal(err)
	}
	if got := e.m.HeldVRAMMiB(); got != sliceMiB {
		t.Fatalf("after a destroy: %d MiB held, want %d", got, sliceMiB)
	}
}
