package gpu_test

import (
	"context"
	"errors"
	"strconv"
	"syscall"
	"testing"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/gpu"
)

// TestPauseDecision is the table of what a pause does: none freezes;
// transparent spills on a host without a hard cap (children or not); on a
// hard-cap host it spills only when the probe reads the lease and no
// non-worker VRAM is resident, and is freeze-only otherwise.
func TestPauseDecision(t *testing.T) {
	cases := []struct {
		name       string
		hardCap    bool
		mode       gpu.SuspendMode
		childMiB   int64 // a non-worker holding this much VRAM (-1: no child)
		probeErr   bool
		wantSpill  bool
		wantReason string
	}{
		{"none freezes on a no-cap host", false, gpu.SuspendNone, 2048, false, false, ""},
		{"none freezes on a hard-cap host", true, gpu.SuspendNone, -1, false, false, ""},
		{"transparent on a no-cap host spills", false, gpu.SuspendTransparent, -1, false, true, ""},
		{"transparent on a no-cap host spills even with children holding VRAM", false, gpu.SuspendTransparent, 2048, false, true, ""},
		{"transparent on a hard-cap host with no non-worker VRAM spills", true, gpu.SuspendTransparent, -1, false, true, ""},
		{"transparent on a hard-cap host with a child holding no VRAM spills", true, gpu.SuspendTransparent, 0, false, true, ""},
		{"transparent on a hard-cap host with non-worker VRAM is freeze-only", true, gpu.SuspendTransparent, 2048, false, false, gpu.FreezeReasonNonWorkerVRAM},
		{"transparent on a hard-cap host with an unreadable probe is freeze-only", true, gpu.SuspendTransparent, -1, true, false, gpu.FreezeReasonProbeUnavailable},
		{"transparent on a hard-cap host with an unreadable probe and children is freeze-only", true, gpu.SuspendTransparent, 2048, true, false, gpu.FreezeReasonProbeUnavailable},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, c.hardCap)
			w := e.lease("a", c.mode)
			child := 0
			if c.childMiB >= 0 {
				child = e.child("a", c.childMiB)
			}
			if c.probeErr {
				e.sim.FailProbe(errors.New("nvml: unknown error"))
			}
			vramBefore := e.sim.GroupVRAM("g-a")
			st := e.pause("a")

			if st.Phase != gpu.PhaseSuspended {
				t.Fatalf("wire phase = %s, want suspended", st.Phase)
			}
			if st.Spilled != c.wantSpill || st.Frozen == c.wantSpill {
				t.Fatalf("spilled=%v frozen=%v, want spilled=%v", st.Spilled, st.Frozen, c.wantSpill)
			}
			if st.HoldsSeat == c.wantSpill {
				t.Fatalf("holds_seat = %v with spilled=%v", st.HoldsSeat, c.wantSpill)
			}
			if st.FreezeReason != c.wantReason {
				t.Fatalf("freeze_reason = %q, want %q", st.FreezeReason, c.wantReason)
			}
			if want := c.mode == gpu.SuspendTransparent && !c.wantSpill; st.FreezeOnly != want {
				t.Fatalf("freeze_only = %v, want %v", st.FreezeOnly, want)
			}
			// Nothing runs while paused, whichever the path.
			for _, pid := range []int{w, child} {
				if pid != 0 && !e.sim.Proc(pid).Stopped {
					t.Fatalf("process %d runs while the lease reads suspended", pid)
				}
			}
			wp := e.sim.Proc(w)
			if wp.Checkpointed != c.wantSpill {
				t.Fatalf("worker checkpointed = %v, want %v", wp.Checkpointed, c.wantSpill)
			}
			if !c.wantSpill && e.sim.GroupVRAM("g-a") != vramBefore {
				t.Fatalf("a freeze moved VRAM: %d MiB before, %d after", vramBefore, e.sim.GroupVRAM("g-a"))
			}
			if child != 0 && !e.sim.Proc(child).Alive {
				t.Fatal("the pause killed a child")
			}
		})
	}
}

// TestSpillCheckpointsTheWorkerOnlyAndChildrenKeepTheirVRAM: the
// checkpoint acts on the worker pid; a child is frozen, never
// checkpointed (that would kill it), and keeps its VRAM.
func TestSpillCheckpointsTheWorkerOnlyAndChildrenKeepTheirVRAM(t *testing.T) {
	e := newEnv(t, false)
	w := e.lease("a", gpu.SuspendTransparent)
	child := e.child("a", 1024)
	e.pause("a")
	if n := e.sim.Count("checkpoint "); n != 1 {
		t.Fatalf("%d checkpoints, want 1: %v", n, e.sim.Log())
	}
	if e.sim.Count("checkpoint "+itoa(w)) != 1 {
		t.Fatalf("the checkpoint was not the worker's: %v", e.sim.Log())
	}
	c := e.sim.Proc(child)
	if !c.Alive || c.Checkpointed || c.VRAMMiB != 1024 || !c.Stopped {
		t.Fatalf("child = %+v, want alive, frozen, not checkpointed, 1024 MiB", c)
	}
}

// TestSpillReleasesThenCheckpointsThenFreezes: the spill releases the
// worker's reservation and checkpoints it before the freeze (never on a
// frozen process), and the resume thaws before the restore, then
// re-reserves.
func TestSpillReleasesThenCheckpointsThenFreezes(t *testing.T) {
	e := newEnv(t, false)
	w := e.lease("a", gpu.SuspendTransparent)
	e.pause("a")
	e.resume("a")
	got := e.sim.Log()
	want := []string{
		"reserve " + itoa(w) + " 8192", // create: the full slice
		"reserve " + itoa(w) + " 0",    // release
		"checkpoint " + itoa(w),
		"freeze g-a",
		"thaw g-a",
		"restore " + itoa(w),
		"reserve " + itoa(w) + " 8192", // re-reserve, no cap on this host
	}
	if !equal(got, want) {
		t.Fatalf("host calls:\n got %v\nwant %v", got, want)
	}
}

// TestFreezeIsNotACheckpoint: a none pause and a freeze-only suspend make
// no toggle and no release/reserve traffic, on pause or on resume.
func TestFreezeIsNotACheckpoint(t *testing.T) {
	for _, c := range []struct {
		name    string
		hardCap bool
		mode    gpu.SuspendMode
	}{
		{"none", false, gpu.SuspendNone},
		{"freeze-only", true, gpu.SuspendTransparent},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, c.hardCap)
			e.lease("a", c.mode)
			e.child("a", 1024)
			before := len(e.sim.Log())
			e.pause("a")
			e.resume("a")
			after := e.sim.Log()[before:]
			if !equal(after, []string{"freeze g-a", "thaw g-a"}) {
				t.Fatalf("host calls = %v, want only freeze and thaw", after)
			}
		})
	}
}

// TestNoSilentHalfPause: a suspend that cannot stop a lease process
// (EPERM) continues what it stopped and refuses with an error; the lease
// keeps running and reads running, on every path.
func TestNoSilentHalfPause(t *testing.T) {
	for _, c := range []struct {
		name    string
		hardCap bool
		mode    gpu.SuspendMode
	}{
		{"none", false, gpu.SuspendNone},
		{"transparent spill", false, gpu.SuspendTransparent},
		{"transparent freeze-only", true, gpu.SuspendTransparent},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, c.hardCap)
			w := e.lease("a", c.mode)
			c1 := e.child("a", 512)
			c2 := e.child("a", 512)
			e.sim.FailStop(c2, syscall.EPERM)

			_, err := e.m.Pause(context.Background(), "a")
			wantCode(t, err, torpor.EConflict, "freeze_failed")

			for _, pid := range []int{w, c1, c2} {
				p := e.sim.Proc(pid)
				if p.Stopped || !p.Alive || p.Checkpointed {
					t.Fatalf("process %d = %+v after the refused pause, want running", pid, p)
				}
			}
			// What was stopped got SIGCONT.
			for _, pid := range []int{w, c1} {
				if s := e.sim.Proc(pid).Signals; !equal(s, []string{"STOP", "CONT"}) {
					t.Fatalf("process %d signals = %v, want STOP then CONT", pid, s)
				}
			}
			st := e.status("a")
			if st.Phase != gpu.PhaseResident || st.Frozen || st.Spilled || st.Meters.Freezes != 0 || st.Meters.Spills != 0 {
				t.Fatalf("status after the refused pause = %+v", st)
			}
			if e.sim.Proc(w).VRAMMiB != sliceMiB {
				t.Fatalf("worker holds %d MiB after the refused pause, want its slice back", e.sim.Proc(w).VRAMMiB)
			}
			// Once the process may be stopped, the pause works.
			e.sim.FailStop(c2, nil)
			e.pause("a")
		})
	}
}

// TestPauseIsIdempotent: pausing a paused lease succeeds and changes
// nothing.
func TestPauseIsIdempotent(t *testing.T) {
	for _, mode := range []gpu.SuspendMode{gpu.SuspendNone, gpu.SuspendTransparent} {
		t.Run(string(mode), func(t *testing.T) {
			e := newEnv(t, false)
			e.lease("a", mode)
			first := e.pause("a")
			calls := len(e.sim.Log())
			second := e.pause("a")
			if len(e.sim.Log()) != calls {
				t.Fatalf("a second pause touched the host: %v", e.sim.Log()[calls:])
			}
			if second.Phase != first.Phase || second.Frozen != first.Frozen || second.Meters.Freezes+second.Meters.Spills != 1 {
				t.Fatalf("second pause = %+v, first %+v", second, first)
			}
		})
	}
}

// TestResumeIsIdempotent: resuming a running lease succeeds and changes
// nothing.
func TestResumeIsIdempotent(t *testing.T) {
	e := newEnv(t, false)
	e.lease("a", gpu.SuspendTransparent)
	calls := len(e.sim.Log())
	st := e.resume("a")
	if len(e.sim.Log()) != calls || st.Meters.Resumes != 0 || st.Phase != gpu.PhaseResident {
		t.Fatalf("resume of a running lease: %+v, host calls %v", st, e.sim.Log()[calls:])
	}
	e.pause("a")
	e.resume("a")
	st = e.resume("a")
	if st.Meters.Resumes != 1 {
		t.Fatalf("resumes = %d, want 1", st.Meters.Resumes)
	}
}

// TestBusyLeaseRefusesPause: a lease with a job in flight refuses pause.
func TestBusyLeaseRefusesPause(t *testing.T) {
	e := newEnv(t, false)
	e.lease("a", gpu.SuspendNone)
	j, err := e.m.BeginJob(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.m.Pause(context.Background(), "a")
	wantCode(t, err, torpor.EConflict, "busy")
	if e.sim.Count("freeze") != 0 {
		t.Fatal("a refused pause froze the lease")
	}
	if err := j.End(context.Background()); err != nil {
		t.Fatal(err)
	}
	e.pause("a")
}

// TestOneJobAtATime: a second job on a lease with one in flight is
// refused.
func TestOneJobAtATime(t *testing.T) {
	e := newEnv(t, false)
	e.lease("a", gpu.SuspendNone)
	j, err := e.m.BeginJob(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	_, err = e.m.BeginJob(context.Background(), "a")
	wantCode(t, err, torpor.EConflict, "busy")
	_ = j.End(context.Background())
	_ = j.End(context.Background()) // twice is harmless
	e.job("a", 0)
}

// TestExecOrResumeOnFrozenLeaseThawsFirst: exec and resume on a frozen
// lease thaw it, then proceed; exec on a spilled lease resumes it.
func TestExecOrResumeOnFrozenLeaseThawsFirst(t *testing.T) {
	cases := []struct {
		name    string
		hardCap bool
		mode    gpu.SuspendMode
		child   bool
		exec    bool
		wantOps []string
	}{
		{"exec on a none freeze", false, gpu.SuspendNone, false, true, []string{"thaw g-a"}},
		{"resume of a none freeze", false, gpu.SuspendNone, false, false, []string{"thaw g-a"}},
		{"exec on a freeze-only suspend", true, gpu.SuspendTransparent, true, true, []string{"thaw g-a"}},
		{"resume of a freeze-only suspend", true, gpu.SuspendTransparent, true, false, []string{"thaw g-a"}},
		{"exec on a spilled lease", false, gpu.SuspendTransparent, false, true, []string{"thaw g-a", "restore", "reserve"}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, c.hardCap)
			w := e.lease("a", c.mode)
			if c.child {
				e.child("a", 1024)
			}
			e.pause("a")
			before := len(e.sim.Log())
			if c.exec {
				j, err := e.m.BeginJob(context.Background(), "a")
				if err != nil {
					t.Fatal(err)
				}
				if !e.status("a").Busy {
					t.Fatal("the job does not hold the lease")
				}
				defer func() { _ = j.End(context.Background()) }()
			} else {
				e.resume("a")
			}
			ops := e.sim.Log()[before:]
			if len(ops) < len(c.wantOps) {
				t.Fatalf("host calls = %v, want %v first", ops, c.wantOps)
			}
			for i, want := range c.wantOps {
				if ops[i] != want && !hasPrefix(ops[i], want+" ") {
					t.Fatalf("host calls = %v, want %v first", ops, c.wantOps)
				}
			}
			if p := e.sim.Proc(w); p.Stopped || p.Checkpointed {
				t.Fatalf("worker = %+v after the wake", p)
			}
			st := e.status("a")
			if st.Frozen || st.Spilled || st.Phase != gpu.PhaseResident || st.FreezeReason != "" || st.FreezeOnly {
				t.Fatalf("status after the wake = %+v", st)
			}
		})
	}
}

// TestRestoreOutOfMemoryLeavesLeaseSpilled: a resume whose restore finds
// no room is a capacity conflict; the lease stays spilled and frozen and
// can be resumed once there is room.
func TestRestoreOutOfMemoryLeavesLeaseSpilled(t *testing.T) {
	e := newEnv(t, false)
	w := e.lease("a", gpu.SuspendTransparent)
	e.pause("a")
	hog := e.sim.StartChild("other-lease", 0, 24576-100)
	_, err := e.m.Resume(context.Background(), "a")
	wantCode(t, err, torpor.EConflict, "capacity")
	st := e.status("a")
	if !st.Spilled || st.HoldsSeat {
		t.Fatalf("status after a failed restore = %+v, want still spilled", st)
	}
	if p := e.sim.Proc(w); !p.Stopped || !p.Checkpointed {
		t.Fatalf("worker = %+v, want frozen and checkpointed again", p)
	}
	e.sim.Exit(hog)
	e.resume("a")
}

// TestDestroyWorksOnFrozenLease: destroy of a frozen (or spilled) lease
// continues its stopped processes before SIGTERM, so the graceful path
// lands, and every process ends.
func TestDestroyWorksOnFrozenLease(t *testing.T) {
	for _, c := range []struct {
		name    string
		hardCap bool
		mode    gpu.SuspendMode
	}{
		{"none freeze", false, gpu.SuspendNone},
		{"freeze-only", true, gpu.SuspendTransparent},
		{"spilled", false, gpu.SuspendTransparent},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, c.hardCap)
			w := e.lease("a", c.mode)
			child := e.child("a", 1024)
			e.pause("a")
			st, err := e.m.Destroy(context.Background(), "a")
			if err != nil {
				t.Fatal(err)
			}
			if st.Phase != gpu.PhaseDestroyed {
				t.Fatalf("phase = %s", st.Phase)
			}
			for _, pid := range []int{w, child} {
				p := e.sim.Proc(pid)
				if p.Alive {
					t.Fatalf("process %d survived the destroy", pid)
				}
				if !equal(p.Signals, []string{"STOP", "CONT", "TERM"}) {
					t.Fatalf("process %d signals = %v, want STOP, CONT, TERM", pid, p.Signals)
				}
			}
			// Destroy again succeeds; other verbs say gone.
			if _, err := e.m.Destroy(context.Background(), "a"); err != nil {
				t.Fatal(err)
			}
			_, err = e.m.Resume(context.Background(), "a")
			wantCode(t, err, torpor.EGone, "")
		})
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

func hasPrefix(s, p string) bool { return len(s) >= len(p) && s[:len(p)] == p }

func itoa(n int) string { return strconv.Itoa(n) }

// TestSpillRacedByANonWorkerAllocationBecomesFreezeOnly: on a hard-cap
// host a non-worker that takes VRAM while the worker is being
// checkpointed makes the spill unsafe: the worker comes back and the
// lease is frozen with its seat instead.
func TestSpillRacedByANonWorkerAllocationBecomesFreezeOnly(t *testing.T) {
	e := newEnv(t, true)
	w := e.lease("a", gpu.SuspendTransparent)
	child := e.child("a", 0)
	e.sim.OnCheckpoint(func(int) {
		if err := e.sim.Alloc(child, 700); err != nil {
			t.Error(err)
		}
	})
	st := e.pause("a")
	if st.Spilled || !st.Frozen || !st.FreezeOnly || st.FreezeReason != gpu.FreezeReasonNonWorkerVRAM || !st.HoldsSeat {
		t.Fatalf("status = %+v, want freeze-only", st)
	}
	if p := e.sim.Proc(w); p.Checkpointed || !p.Stopped {
		t.Fatalf("worker = %+v, want restored and frozen", p)
	}
}

// TestFrozenLeaseStaysResidentWithFrozenTrue: a freeze keeps the phase
// resident inside (the seat is accounted, VRAM never left the card) with
// frozen=true; the wire phase says suspended.
func TestFrozenLeaseStaysResidentWithFrozenTrue(t *testing.T) {
	e := newEnv(t, true)
	e.lease("a", gpu.SuspendTransparent)
	e.jobChild("a", 512)
	st := e.pause("a")
	rec, err := e.m.Record("a")
	if err != nil {
		t.Fatal(err)
	}
	if rec.Phase != gpu.PhaseResident || !rec.Frozen || !rec.FreezeOnly {
		t.Fatalf("record = %+v, want resident and frozen", rec)
	}
	if st.Phase != gpu.PhaseSuspended || !st.Frozen || !st.HoldsSeat {
		t.Fatalf("status = %+v, want wire phase suspended, frozen, seat held", st)
	}
}
