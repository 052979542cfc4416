package gpu_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/gpu"
	"github.com/torpor-dev/torpor/gpu/sim"
)

// hookHost runs afterRestore after each successful Restore: a child that
// woke with the thaw and took VRAM, an unreadable probe, time passing.
type hookHost struct {
	*sim.Host
	afterRestore func()
}

func (h *hookHost) Restore(ctx context.Context, pid int) error {
	if err := h.Host.Restore(ctx, pid); err != nil {
		return err
	}
	if h.afterRestore != nil {
		h.afterRestore()
	}
	return nil
}

func newHookEnv(t *testing.T, hardCap bool) (*env, *hookHost) {
	var h *hookHost
	e := newEnv(t, hardCap, withHost(func(s *sim.Host) gpu.Host {
		h = &hookHost{Host: s}
		return h
	}))
	return e, h
}

func lastReserve(t *testing.T, s *sim.Host) string {
	t.Helper()
	log := s.Log()
	for i := len(log) - 1; i >= 0; i-- {
		if strings.HasPrefix(log[i], "reserve ") {
			f := strings.Fields(log[i])
			return f[2]
		}
	}
	t.Fatal("no reserve")
	return ""
}

// TestResumeReReserve is the table of the resume re-reserve: cap =
// max(0, slice − non-worker VRAM), target = min(slice, cap); no cap (the
// full target) on a host without a hard cap; cap 0 when usage is
// unreadable.
func TestResumeReReserve(t *testing.T) {
	cases := []struct {
		name       string
		hardCap    bool
		nonWorker  int64 // VRAM a non-worker takes between thaw and measure
		unreadable bool
		wantCap    int64 // -1: no cap
		wantTarget int64
	}{
		{"no hard cap reserves the full target", false, 3000, false, -1, sliceMiB},
		{"hard cap with no non-worker VRAM", true, 0, false, sliceMiB, sliceMiB},
		{"hard cap subtracts non-worker VRAM", true, 3000, false, sliceMiB - 3000, sliceMiB - 3000},
		{"hard cap never goes below 0", true, sliceMiB + 2000, false, 0, 0},
		{"hard cap with unreadable usage caps at 0", true, 0, true, 0, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e, h := newHookEnv(t, c.hardCap)
			w := e.lease("a", gpu.SuspendTransparent)
			e.pause("a")
			if !e.status("a").Spilled {
				t.Fatal("want a spill")
			}
			h.afterRestore = func() {
				if c.nonWorker > 0 {
					e.child("a", c.nonWorker)
				}
				if c.unreadable {
					e.sim.FailProbe(errors.New("nvml: GPU is lost"))
				}
			}
			st := e.resume("a")
			if c.wantCap < 0 {
				if st.CapMiB != nil {
					t.Fatalf("cap = %d, want none", *st.CapMiB)
				}
			} else if st.CapMiB == nil || *st.CapMiB != c.wantCap {
				t.Fatalf("cap = %v, want %d", st.CapMiB, c.wantCap)
			}
			if st.TargetMiB != c.wantTarget {
				t.Fatalf("target = %d, want %d", st.TargetMiB, c.wantTarget)
			}
			if got := lastReserve(t, e.sim); got != itoa(int(c.wantTarget)) {
				t.Fatalf("re-reserve of %s MiB, want %d", got, c.wantTarget)
			}
			if c.hardCap && !c.unreadable && c.nonWorker <= sliceMiB {
				// The lease settles at about its slice, not slice plus
				// children.
				if got := e.sim.GroupVRAM("g-a"); got > sliceMiB {
					t.Fatalf("lease holds %d MiB after the resume, over its slice of %d", got, sliceMiB)
				}
			}
			_ = w
		})
	}
}

// TestCapIsMeasuredAgainstTheOriginalSliceTarget: a capped resume does
// not shrink the slice for the lease's life; the next resume's cap starts
// from the original target again.
func TestCapIsMeasuredAgainstTheOriginalSliceTarget(t *testing.T) {
	e, h := newHookEnv(t, true)
	e.lease("a", gpu.SuspendTransparent)
	e.pause("a")
	var child int
	h.afterRestore = func() { child = e.child("a", 3000) }
	if st := e.resume("a"); *st.CapMiB != sliceMiB-3000 {
		t.Fatalf("first cap = %d", *st.CapMiB)
	}
	e.sim.Exit(child)
	e.pause("a") // no non-worker VRAM now: a spill again
	if !e.status("a").Spilled {
		t.Fatal("want a spill")
	}
	h.afterRestore = func() { e.child("a", 1000) }
	st := e.resume("a")
	if *st.CapMiB != sliceMiB-1000 || st.TargetMiB != sliceMiB-1000 {
		t.Fatalf("second cap %d target %d, want %d from the original slice", *st.CapMiB, st.TargetMiB, sliceMiB-1000)
	}
	if st.SliceMiB != sliceMiB {
		t.Fatalf("slice = %d, want it unchanged", st.SliceMiB)
	}
}

// TestCapIsStickyForTopUpsAfterEachJob: after a capped resume the
// worker's top-up after each job reserves the capped target.
func TestCapIsStickyForTopUpsAfterEachJob(t *testing.T) {
	e, h := newHookEnv(t, true)
	w := e.lease("a", gpu.SuspendTransparent)
	e.pause("a")
	h.afterRestore = func() { e.child("a", 2000) }
	e.resume("a")
	for i := 0; i < 3; i++ {
		e.job("a", time.Second)
		if got := lastReserve(t, e.sim); got != itoa(sliceMiB-2000) {
			t.Fatalf("top-up after job %d reserved %s MiB, want the capped %d", i, got, sliceMiB-2000)
		}
	}
	if p := e.sim.Proc(w); p.VRAMMiB != sliceMiB-2000 {
		t.Fatalf("worker holds %d MiB", p.VRAMMiB)
	}
}

// TestReserveWithoutCapRestoresTheFullTarget: a resume that reserves
// without a cap (no non-worker VRAM left) restores the full slice after a
// capped one.
func TestReserveWithoutCapRestoresTheFullTarget(t *testing.T) {
	e, h := newHookEnv(t, true)
	w := e.lease("a", gpu.SuspendTransparent)
	e.pause("a")
	var child int
	h.afterRestore = func() { child = e.child("a", 4000) }
	e.resume("a")
	e.sim.Exit(child)
	e.pause("a")
	h.afterRestore = nil
	st := e.resume("a")
	if st.TargetMiB != sliceMiB || e.sim.Proc(w).VRAMMiB != sliceMiB {
		t.Fatalf("target %d, worker %d MiB; want the full %d", st.TargetMiB, e.sim.Proc(w).VRAMMiB, sliceMiB)
	}
	e.job("a", time.Second)
	if got := lastReserve(t, e.sim); got != itoa(sliceMiB) {
		t.Fatalf("top-up reserved %s, want %d", got, sliceMiB)
	}
}

// TestCreateReservesTheFullSlice: a new lease's worker reserves its whole
// slice, without a cap.
func TestCreateReservesTheFullSlice(t *testing.T) {
	e := newEnv(t, true)
	w := e.lease("a", gpu.SuspendTransparent)
	st := e.status("a")
	if st.CapMiB != nil || st.TargetMiB != sliceMiB || e.sim.Proc(w).VRAMMiB != sliceMiB {
		t.Fatalf("status %+v, worker %d MiB", st, e.sim.Proc(w).VRAMMiB)
	}
}
