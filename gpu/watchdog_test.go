package gpu_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/gpu"
	"github.com/torpor-dev/torpor/gpu/sim"
)

// TestWatchdogKillsAnOverLimitLeaseAndFlagsItsKey: on a hard-cap host a
// lease whose VRAM exceeds its limit is killed and its key flagged.
func TestWatchdogKillsAnOverLimitLeaseAndFlagsItsKey(t *testing.T) {
	e := newEnv(t, true)
	w := e.lease("a", gpu.SuspendTransparent)
	e.lease("b", gpu.SuspendTransparent)
	// A job's process uses the slice the worker handed over.
	j, err := e.m.BeginJob(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	child := e.child("a", sliceMiB-workerCtx)
	if r := e.m.Tick(context.Background()); len(r.Killed) != 0 {
		t.Fatalf("killed %v at its limit", r.Killed)
	}
	if err := e.sim.Alloc(child, 2000); err != nil {
		t.Fatal(err)
	}
	r := e.m.Tick(context.Background())
	if len(r.Killed) != 1 || r.Killed[0] != "a" {
		t.Fatalf("killed %v, want [a]", r.Killed)
	}
	st := e.status("a")
	if st.Phase != gpu.PhaseDead || st.DeadReason != gpu.DeadWatchdog || st.HoldsSeat {
		t.Fatalf("status = %+v", st)
	}
	for _, pid := range []int{w, child} {
		if e.sim.Proc(pid).Alive {
			t.Fatalf("process %d survived the watchdog", pid)
		}
	}
	flags := e.flags.all()
	if len(flags) != 1 || flags[0].KeyID != "key_a" || flags[0].UsedMiB != sliceMiB+2000 || flags[0].LimitMiB != sliceMiB {
		t.Fatalf("flags = %+v", flags)
	}
	if len(e.eventsOf(gpu.EventWatchdogKill)) != 1 {
		t.Fatal("no watchdog kill event")
	}
	if e.status("b").Phase != gpu.PhaseResident {
		t.Fatal("the watchdog killed an innocent lease")
	}
	_, err = e.m.Resume(context.Background(), "a")
	wantCode(t, err, torpor.EConflict, "dead")
	if err := j.End(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// TestWatchdogKillWorksOnAFrozenLease: a frozen lease over its limit is
// killed; its stopped processes get SIGCONT before SIGTERM.
func TestWatchdogKillWorksOnAFrozenLease(t *testing.T) {
	e := newEnv(t, true)
	w := e.lease("a", gpu.SuspendNone)
	child := e.child("a", 3000)
	e.pause("a")
	r := e.m.Tick(context.Background())
	if len(r.Killed) != 1 {
		t.Fatalf("killed %v", r.Killed)
	}
	for _, pid := range []int{w, child} {
		p := e.sim.Proc(pid)
		if p.Alive || !equal(p.Signals, []string{"STOP", "CONT", "TERM"}) {
			t.Fatalf("process %d = %+v", pid, p)
		}
	}
}

// overshootHost makes the worker's re-reserve after a restore overshoot,
// the way a re-reserve on top of resident children did.
type overshootHost struct {
	*sim.Host
	extra int64
	armed bool
}

func (h *overshootHost) Reserve(ctx context.Context, t gpu.Target, mib int64) error {
	if h.armed && mib > 0 {
		mib += h.extra
	}
	return h.Host.Reserve(ctx, t, mib)
}

// TestResumeGraceExcludesTheWorkersReReserve: for resume_grace_s after a
// resume commit the watchdog counts only non-worker processes, so our own
// re-reserve's overshoot neither kills nor flags; after the grace the
// full attribution applies again.
func TestResumeGraceExcludesTheWorkersReReserve(t *testing.T) {
	var h *overshootHost
	e := newEnv(t, true, func(o *gpu.Options, e *env) {
		h = &overshootHost{Host: e.sim, extra: 3000}
		o.Worker = h
	})
	e.lease("a", gpu.SuspendTransparent)
	e.pause("a")
	h.armed = true
	st := e.resume("a")
	if st.ResumeGraceUntil == nil || !st.ResumeGraceUntil.Equal(e.clock.Now().Add(5*time.Second)) {
		t.Fatalf("resume grace until %v, want 5 s after the commit", st.ResumeGraceUntil)
	}
	if got := e.sim.GroupVRAM("g-a"); got <= sliceMiB {
		t.Fatalf("the lease holds %d MiB; the test needs an overshoot", got)
	}
	e.clock.Advance(4 * time.Second)
	if r := e.m.Tick(context.Background()); len(r.Killed) != 0 || len(e.flags.all()) != 0 {
		t.Fatalf("killed %v / flagged %v inside the grace for our own re-reserve", r.Killed, e.flags.all())
	}
	e.clock.Advance(time.Second)
	if r := e.m.Tick(context.Background()); len(r.Killed) != 1 {
		t.Fatalf("after the grace the full attribution applies: killed %v", r.Killed)
	}
}

// TestRunawayChildIsKilledInsideTheResumeGrace: children count in full
// during the grace, so a runaway child is killed and flagged.
func TestRunawayChildIsKilledInsideTheResumeGrace(t *testing.T) {
	e := newEnv(t, true)
	e.lease("a", gpu.SuspendTransparent)
	e.pause("a")
	e.resume("a")
	child := e.child("a", 0)
	if err := e.sim.Alloc(child, sliceMiB+1); err != nil {
		t.Fatal(err)
	}
	r := e.m.Tick(context.Background())
	if len(r.Killed) != 1 {
		t.Fatalf("killed %v, want the runaway", r.Killed)
	}
	f := e.flags.all()
	if len(f) != 1 || !f[0].NonWorkerOnly || f[0].UsedMiB != sliceMiB+1 {
		t.Fatalf("flags = %+v", f)
	}
}

// TestResumeGraceIsConfigurable: TORPOR_GPU_RESUME_GRACE_S sets the
// grace (through Config).
func TestResumeGraceIsConfigurable(t *testing.T) {
	cfg, err := gpu.ConfigFromEnv(func(k string) string {
		if k == gpu.EnvResumeGrace {
			return "30"
		}
		return ""
	})
	if err != nil {
		t.Fatal(err)
	}
	var h *overshootHost
	e := newEnv(t, true, withConfig(func(c *gpu.Config) { *c = cfg }), func(o *gpu.Options, e *env) {
		h = &overshootHost{Host: e.sim, extra: 3000}
		o.Worker = h
	})
	e.lease("a", gpu.SuspendTransparent)
	e.pause("a")
	h.armed = true
	e.resume("a")
	e.clock.Advance(29 * time.Second)
	if r := e.m.Tick(context.Background()); len(r.Killed) != 0 {
		t.Fatalf("killed %v inside a 30 s grace", r.Killed)
	}
	e.clock.Advance(time.Second)
	if r := e.m.Tick(context.Background()); len(r.Killed) != 1 {
		t.Fatalf("killed %v after the grace", r.Killed)
	}
}

// TestNoWatchdogWithoutAHardCap: a host without a hard cap has no VRAM
// reading and no watchdog.
func TestNoWatchdogWithoutAHardCap(t *testing.T) {
	e := newEnv(t, false)
	e.lease("a", gpu.SuspendTransparent)
	e.child("a", 20000)
	r := e.m.Tick(context.Background())
	if len(r.Killed) != 0 || r.Err != nil {
		t.Fatalf("tick = %+v", r)
	}
}

// TestBlindWatchdogIsLoudAndKillsNobody: an unreadable probe makes the
// watchdog blind: an error each tick, an event the first time, no kills.
func TestBlindWatchdogIsLoudAndKillsNobody(t *testing.T) {
	e := newEnv(t, true)
	e.lease("a", gpu.SuspendTransparent)
	e.child("a", 20000)
	e.sim.FailProbe(errors.New("nvml: driver not loaded"))
	for i := 0; i < 2; i++ {
		r := e.m.Tick(context.Background())
		if len(r.Killed) != 0 || !errors.Is(r.Err, gpu.ErrProbeUnavailable) {
			t.Fatalf("tick = %+v", r)
		}
	}
	if n := len(e.eventsOf(gpu.EventWatchdogBlind)); n != 1 {
		t.Fatalf("%d blind events, want 1", n)
	}
}
