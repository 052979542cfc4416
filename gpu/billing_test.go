package gpu_test

import (
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/gpu"
)

// TestNonePauseIsBilledInFull: a frozen none lease keeps accruing
// billed_s == resident_s through the freeze.
func TestNonePauseIsBilledInFull(t *testing.T) {
	e := newEnv(t, false)
	e.lease("a", gpu.SuspendNone)
	e.clock.Advance(10 * time.Second)
	e.pause("a")
	e.clock.Advance(100 * time.Second)
	mid := e.status("a").Meters
	wantSeconds(t, "billed_s mid-freeze", mid.BilledS, 110)
	wantSeconds(t, "resident_s mid-freeze", mid.ResidentS, 110)
	e.resume("a")
	e.clock.Advance(5 * time.Second)
	m := e.status("a").Meters
	wantSeconds(t, "resident_s", m.ResidentS, 115)
	wantSeconds(t, "billed_s", m.BilledS, 115)
	wantSeconds(t, "frozen_s", m.FrozenS, 100)
	wantSeconds(t, "running_s", m.RunningS, 15)
	wantSeconds(t, "frozen_billed_s", m.FrozenBilledS, 0)
	if m.Freezes != 1 {
		t.Fatalf("freezes = %d", m.Freezes)
	}
}

// TestFreezeOnlyBillsOnlyItsFrozenIntervals: a freeze-only transparent
// suspend bills its frozen intervals in full (frozen_billed_s); the
// freeze_only flag clears on thaw, so the rest of the residency bills as
// a transparent lease's and is not reclassified.
func TestFreezeOnlyBillsOnlyItsFrozenIntervals(t *testing.T) {
	e := newEnv(t, true)
	e.lease("a", gpu.SuspendTransparent)
	e.child("a", 1024)
	e.clock.Advance(10 * time.Second)
	if st := e.pause("a"); !st.FreezeOnly {
		t.Fatal("want freeze-only")
	}
	e.clock.Advance(100 * time.Second)
	st := e.resume("a")
	if st.FreezeOnly || st.FreezeReason != "" {
		t.Fatalf("freeze_only %v / reason %q after the thaw", st.FreezeOnly, st.FreezeReason)
	}
	e.job("a", 30*time.Second)
	e.clock.Advance(20 * time.Second)
	e.pause("a")
	e.clock.Advance(20 * time.Second)
	e.resume("a")
	e.clock.Advance(7 * time.Second)
	m := e.status("a").Meters
	wantSeconds(t, "frozen_billed_s", m.FrozenBilledS, 120)
	wantSeconds(t, "frozen_s", m.FrozenS, 120)
	wantSeconds(t, "busy_s", m.BusyS, 30)
	wantSeconds(t, "idle_s", m.IdleS, 37)
	wantSeconds(t, "billed_s", m.BilledS, 187)
	wantSeconds(t, "resident_s", m.ResidentS, 187)
	if m.Freezes != 2 {
		t.Fatalf("freezes = %d", m.Freezes)
	}
}

// TestSettledFreezeOnlyIntervalsAreBilledBusyRows: a settled freeze-only
// interval is saved as a billed busy usage row, so a restart cannot make
// it free; a none pause's residency gets the same treatment.
func TestSettledFreezeOnlyIntervalsAreBilledBusyRows(t *testing.T) {
	for _, c := range []struct {
		name      string
		hardCap   bool
		mode      gpu.SuspendMode
		wantCause string
	}{
		{"freeze-only", true, gpu.SuspendTransparent, gpu.CauseFreezeOnly},
		{"none", false, gpu.SuspendNone, gpu.CauseFrozenNone},
	} {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, c.hardCap)
			e.lease("a", c.mode)
			e.child("a", 1024)
			e.pause("a")
			pausedAt := e.clock.Now()
			e.clock.Advance(90 * time.Second)
			e.resume("a")
			var found []gpu.UsageRow
			for _, r := range e.store.Rows("a") {
				if r.Cause == c.wantCause {
					found = append(found, r)
				}
			}
			if len(found) != 1 {
				t.Fatalf("rows %+v, want one %s row", e.store.Rows("a"), c.wantCause)
			}
			r := found[0]
			if r.Kind != gpu.RowBusy || !r.Billed || !near(r.Seconds, 90) || !r.Start.Equal(pausedAt) {
				t.Fatalf("row = %+v, want a billed busy row of 90 s", r)
			}
		})
	}
}

// TestSpilledLeaseBillsZeroWhilePaused: a spilled transparent lease is
// not billed while it is paused.
func TestSpilledLeaseBillsZeroWhilePaused(t *testing.T) {
	e := newEnv(t, false)
	e.lease("a", gpu.SuspendTransparent)
	e.clock.Advance(10 * time.Second)
	e.pause("a")
	e.clock.Advance(1000 * time.Second)
	m := e.status("a").Meters
	wantSeconds(t, "billed_s", m.BilledS, 10)
	wantSeconds(t, "suspended_s", m.SuspendedS, 1000)
	wantSeconds(t, "resident_s", m.ResidentS, 10)
	e.resume("a")
	for _, r := range e.store.Rows("a") {
		if r.Kind == gpu.RowSuspended && r.Billed {
			t.Fatalf("a suspended row is billed: %+v", r)
		}
	}
}

// TestResumeTimeIsBilled: restoring and re-reserving is billed as resume
// seconds and settles as the resume component.
func TestResumeTimeIsBilled(t *testing.T) {
	e, h := newHookEnv(t, false)
	e.lease("a", gpu.SuspendTransparent)
	e.pause("a")
	e.clock.Advance(50 * time.Second)
	h.afterRestore = func() { e.clock.Advance(3 * time.Second) }
	e.resume("a")
	m := e.status("a").Meters
	wantSeconds(t, "resume_s", m.ResumeS, 3)
	wantSeconds(t, "billed_s", m.BilledS, 3)
	c := m.Counters()
	wantSeconds(t, "resume counter", c.Resume, 3)
	wantSeconds(t, "busy counter", c.Busy, 0)
}

// TestUsageRowsCoverTheLeaseAndAddUpToItsMeters: a lease's rows leave no
// gap and no overlap from create to destroy, and the billed ones add up
// to billed_s.
func TestUsageRowsCoverTheLeaseAndAddUpToItsMeters(t *testing.T) {
	e, h := newHookEnv(t, true)
	e.lease("a", gpu.SuspendTransparent)
	e.clock.Advance(3 * time.Second)
	e.job("a", 4*time.Second)
	e.pause("a") // spill
	e.clock.Advance(30 * time.Second)
	h.afterRestore = func() { e.clock.Advance(2 * time.Second) }
	e.job("a", 5*time.Second) // resumes first
	child := e.child("a", 512)
	e.pause("a") // freeze-only
	e.clock.Advance(40 * time.Second)
	e.resume("a")
	e.sim.Exit(child)
	e.clock.Advance(3 * time.Minute)
	e.m.Tick(context.Background()) // cuts the long idle interval
	e.clock.Advance(6 * time.Second)
	st, err := e.m.Destroy(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	rows := e.store.Rows("a")
	var billed, suspended float64
	at := t0
	for _, r := range rows {
		if !r.Start.Equal(at) {
			t.Fatalf("row %+v starts at %v, want %v (gap or overlap)", r, r.Start, at)
		}
		at = r.End
		if r.Billed {
			billed += r.Seconds
		}
		if r.Kind == gpu.RowSuspended {
			suspended += r.Seconds
		}
	}
	if !at.Equal(e.clock.Now()) {
		t.Fatalf("rows end at %v, the destroy was at %v", at, e.clock.Now())
	}
	wantSeconds(t, "billed rows", billed, st.Meters.BilledS)
	wantSeconds(t, "suspended rows", suspended, st.Meters.SuspendedS)
	wantSeconds(t, "billed_s", st.Meters.BilledS, 3+4+2+5+40+180+6)
}

// TestTickCutsLongIntervalsIntoSavedRows: an interval open longer than
// RowInterval is settled by the tick, so a crash loses at most that much.
func TestTickCutsLongIntervalsIntoSavedRows(t *testing.T) {
	e := newEnv(t, true)
	e.lease("a", gpu.SuspendNone)
	e.pause("a")
	e.clock.Advance(3 * time.Minute)
	e.m.Tick(context.Background())
	var billed float64
	for _, r := range e.store.Rows("a") {
		billed += r.Seconds
	}
	wantSeconds(t, "saved billed seconds", billed, 180)
	if rec := e.store.Record("a"); !rec.Seg.Start.Equal(e.clock.Now()) || !near(rec.Meters.BilledS, 180) {
		t.Fatalf("record = %+v", rec)
	}
}

// TestMetersShowIdleTimeoutAndAutoPaused: the meters of GET
// /v1/sandboxes/{id} carry idle_timeout_s and auto_paused next to the
// billing meters.
func TestMetersShowIdleTimeoutAndAutoPaused(t *testing.T) {
	e := newEnv(t, false)
	e.lease("a", gpu.SuspendTransparent, idleTimeout(600))
	b, err := json.Marshal(e.status("a").Meters)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	for _, k := range []string{"idle_timeout_s", "auto_paused", "resident_s", "billed_s", "frozen_s", "freezes",
		"frozen_billed_s", "running_s", "busy_s", "suspend_mode"} {
		if _, ok := m[k]; !ok {
			t.Fatalf("meters JSON %s lacks %s", b, k)
		}
	}
	if m["idle_timeout_s"] != float64(600) {
		t.Fatalf("idle_timeout_s = %v", m["idle_timeout_s"])
	}
}

// TestRestoredDeadFreezeOnlyIntervalSettlesAtLastSignOfLife: after a
// restart, a lease whose processes are gone restores dead; its open
// freeze-only interval settles at the previous process's last sign of
// life as a billed busy row and closes: it neither accrues on the dead
// record nor lands later as one inflated row when the lease is destroyed.
func TestRestoredDeadFreezeOnlyIntervalSettlesAtLastSignOfLife(t *testing.T) {
	e := newEnv(t, true)
	w := e.lease("a", gpu.SuspendTransparent)
	child := e.child("a", 1024)
	e.clock.Advance(10 * time.Second)
	e.pause("a") // freeze-only
	pausedAt := e.clock.Now()
	rec := e.store.Record("a")
	if rec.Seg.Kind != "frozen" || !rec.Seg.FreezeOnly {
		t.Fatalf("saved segment = %+v, want an open freeze-only interval", rec.Seg)
	}
	// The daemon last saw the lease alive 70 s into the freeze (its
	// MarkSeen), then the host went down with the lease.
	rec.LastSeen = pausedAt.Add(70 * time.Second)
	e.sim.Exit(w)
	e.sim.Exit(child)

	e2 := restart(t, e, time.Hour)
	st, err := e2.m.Adopt(context.Background(), rec)
	if err != nil {
		t.Fatal(err)
	}
	if st.Phase != gpu.PhaseDead || st.DeadReason != gpu.DeadRestoredDead || st.Frozen || st.HoldsSeat {
		t.Fatalf("adopted = %+v, want restored dead", st)
	}
	rows := e2.store.Rows("a")
	if len(rows) != 1 {
		t.Fatalf("rows = %+v, want the settled interval", rows)
	}
	r := rows[0]
	if r.Kind != gpu.RowBusy || r.Cause != gpu.CauseFreezeOnly || !r.Billed ||
		!r.Start.Equal(pausedAt) || !r.End.Equal(rec.LastSeen) {
		t.Fatalf("row = %+v, want billed busy from the pause to the last sign of life", r)
	}
	wantSeconds(t, "frozen_billed_s", st.Meters.FrozenBilledS, 70)
	e2.clock.Advance(24 * time.Hour)
	if m := e2.status("a").Meters; !near(m.BilledS, st.Meters.BilledS) {
		t.Fatalf("the dead lease accrues: %v then %v", st.Meters.BilledS, m.BilledS)
	}
	if _, err := e2.m.Destroy(context.Background(), "a"); err != nil {
		t.Fatal(err)
	}
	if n := len(e2.store.Rows("a")); n != 1 {
		t.Fatalf("the destroy flushed %d more rows", n-1)
	}
}

// TestPurgeDropsAnOpenInterval: a purge forgets the lease without billing
// its open interval.
func TestPurgeDropsAnOpenInterval(t *testing.T) {
	e := newEnv(t, true)
	e.lease("a", gpu.SuspendTransparent)
	e.child("a", 1024)
	e.pause("a")
	before := len(e.store.Rows("a"))
	e.clock.Advance(time.Hour)
	if err := e.m.Purge("a"); err != nil {
		t.Fatal(err)
	}
	e.m.Tick(context.Background())
	if n := len(e.store.Rows("a")); n != before {
		t.Fatalf("the purge wrote %d rows", n-before)
	}
	if _, err := e.m.Status("a"); err == nil {
		t.Fatal("the purged lease is still there")
	}
}

// TestAdoptedLiveLeaseContinuesItsInterval: a lease whose worker is alive
// after a restart continues where its record left it: a frozen lease
// stays frozen and its seat held through the downtime is billed.
func TestAdoptedLiveLeaseContinuesItsInterval(t *testing.T) {
	e := newEnv(t, false)
	e.lease("a", gpu.SuspendNone)
	e.clock.Advance(10 * time.Second)
	e.pause("a")
	rec := e.store.Record("a")
	e2 := restart(t, e, 50*time.Second)
	st, err := e2.m.Adopt(context.Background(), rec)
	if err != nil {
		t.Fatal(err)
	}
	if !st.Frozen {
		t.Fatalf("adopted = %+v, want frozen", st)
	}
	wantSeconds(t, "billed_s", st.Meters.BilledS, 60)
	e2.resume("a")
	if p := e2.sim.Proc(rec.Spec.WorkerPID); p.Stopped {
		t.Fatal("worker still stopped")
	}
}

// TestAdoptRollsBackATransitionTheCrashInterrupted: a lease saved in the
// middle of a spill comes back resident and running.
func TestAdoptRollsBackATransitionTheCrashInterrupted(t *testing.T) {
	e := newEnv(t, false)
	w := e.lease("a", gpu.SuspendTransparent)
	rec := e.store.Record("a")
	rec.Op = "pausing"
	// The crash came after the checkpoint and the freeze.
	ctx := context.Background()
	if err := e.sim.Checkpoint(ctx, w); err != nil {
		t.Fatal(err)
	}
	if err := e.sim.Freeze(ctx, "g-a"); err != nil {
		t.Fatal(err)
	}
	e2 := restart(t, e, time.Second)
	st, err := e2.m.Adopt(ctx, rec)
	if err != nil {
		t.Fatal(err)
	}
	p := e2.sim.Proc(w)
	if st.Phase != gpu.PhaseResident || st.Frozen || p.Stopped || p.Checkpointed || p.VRAMMiB != sliceMiB {
		t.Fatalf("adopted %+v, worker %+v", st, p)
	}
}

// TestWorkerExitMarksTheLeaseDeadAtItsLastSignOfLife: a worker found gone
// by the tick ends the lease's interval where it was last seen.
func TestWorkerExitMarksTheLeaseDeadAtItsLastSignOfLife(t *testing.T) {
	e := newEnv(t, true)
	w := e.lease("a", gpu.SuspendNone)
	e.clock.Advance(30 * time.Second)
	e.m.Tick(context.Background())
	e.sim.Exit(w)
	e.clock.Advance(30 * time.Second)
	r := e.m.Tick(context.Background())
	if len(r.Dead) != 1 {
		t.Fatalf("dead = %v", r.Dead)
	}
	st := e.status("a")
	if st.Phase != gpu.PhaseDead || st.DeadReason != gpu.DeadWorkerExited {
		t.Fatalf("status = %+v", st)
	}
	wantSeconds(t, "billed_s", st.Meters.BilledS, 30)
}

// restart returns a new manager on the same host, later by d. Its store
// is new, so a test sees the rows the new manager writes.
func restart(t *testing.T, e *env, d time.Duration) *env {
	t.Helper()
	e.clock.Advance(d)
	e2 := &env{t: t, sim: e.sim, clock: e.clock, store: &memStore{records: map[string]gpu.Record{}}, flags: &flagRec{}}
	m, err := gpu.NewManager(gpu.Options{Host: e.sim, Worker: e.sim, Clock: e.clock, Config: gpu.DefaultConfig(),
		Store: e2.store, Flagger: e2.flags})
	if err != nil {
		t.Fatal(err)
	}
	e2.m = m
	return e2
}
