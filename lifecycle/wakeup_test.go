package lifecycle_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/lifecycle"
)

// nightly makes the fake host answer every exec as a nightly job: it
// prints a line and exits with code, and counts its runs.
func nightly(e *env, code int) *atomic.Int32 {
	var runs atomic.Int32
	e.host.ExecFunc = func(ctx context.Context, id string, req torpor.ExecRequest) (torpor.ExecResult, error) {
		n := runs.Add(1)
		if req.Stdout != nil {
			fmt.Fprintf(req.Stdout, "run %d of %v\n", n, req.Cmd)
		}
		return torpor.ExecResult{ExitCode: code}, nil
	}
	return &runs
}

// waitWakeup waits until the sandbox's only wake-up has a finished run
// numbered runs.
func waitWakeup(e *env, id string, runs int64) *torpor.Sandbox {
	e.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		sb := e.get(id)
		if len(sb.Wakeups) == 1 {
			w := sb.Wakeups[0]
			if w.Runs == runs && w.LastResult != nil && w.LastResult.Status != torpor.WakeupRunning {
				return sb
			}
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("the wake-up did not finish run %d: %+v", runs, sb.Wakeups)
		}
		time.Sleep(time.Millisecond)
	}
}

func eventsOf(e *env, id string) []torpor.Event {
	e.t.Helper()
	evs, err := e.eng.Events(ctx, "acme", torpor.EventFilter{SandboxID: id})
	if err != nil {
		e.t.Fatal(err)
	}
	return evs
}

func findEvent(evs []torpor.Event, typ string, attrs ...string) *torpor.Event {
	for i := range evs {
		ev := &evs[i]
		if ev.Type != typ {
			continue
		}
		ok := true
		for j := 0; j+1 < len(attrs); j += 2 {
			ok = ok && ev.Attrs[attrs[j]] == attrs[j+1]
		}
		if ok {
			return ev
		}
	}
	return nil
}

// TestWakeupCronWakesAHibernatedSandbox: a hibernated sandbox is booted at
// its cron time (cause wake_up), runs the command, keeps the result, and
// sleeps again by its own idle policy; the wake-up moves to the next day.
func TestWakeupCronWakesAHibernatedSandbox(t *testing.T) {
	e := newEnv(t) // the clock starts at 2026-01-02 03:04:05 UTC
	runs := nightly(e, 3)
	sb := e.create(torpor.CreateRequest{
		PolicyRequest: torpor.PolicyRequest{LifecyclePolicy: policy(torpor.LifecyclePolicy{
			PauseAfterIdleSeconds: torpor.Seconds(60), HibernateAfterPausedSeconds: torpor.Seconds(120)})},
		Wakeups: []torpor.WakeupSpec{{WakeSchedule: "0 5 * * *", TimeZone: "Europe/Paris", Cmd: []string{"./nightly.sh"}, TimeoutSeconds: 60}},
	})
	due := time.Date(2026, 1, 2, 4, 0, 0, 0, time.UTC) // 05:00 in Paris
	if len(sb.Wakeups) != 1 || sb.Wakeups[0].NextAt == nil || !sb.Wakeups[0].NextAt.Equal(due) {
		t.Fatalf("wake-ups %+v", sb.Wakeups)
	}
	var up *torpor.ScheduledEvent
	for i, ev := range sb.UpcomingEvents {
		if ev.Action == torpor.ActionWake {
			up = &sb.UpcomingEvents[i]
		}
	}
	if up == nil || !up.At.Equal(due) || up.Cause != lifecycle.CauseWakeup || up.Wakeup != sb.Wakeups[0].ID {
		t.Fatalf("upcoming events %+v", sb.UpcomingEvents)
	}

	e.clock.Advance(60 * time.Second)
	settle(e, sb.ID, torpor.StatePaused)
	e.clock.Advance(120 * time.Second)
	settle(e, sb.ID, torpor.StateHibernated)
	if runs.Load() != 0 {
		t.Fatal("the command ran before its time")
	}

	e.clock.Advance(due.Sub(e.clock.Now()))
	got := waitWakeup(e, sb.ID, 1)
	r := got.Wakeups[0].LastResult
	if got.State != torpor.StateRunning || got.Boots != 2 || runs.Load() != 1 {
		t.Fatalf("after the wake-up: %s, boots %d, runs %d", got.State, got.Boots, runs.Load())
	}
	if r.Status != torpor.WakeupDone || r.ExitCode == nil || *r.ExitCode != 3 || r.Output != "run 1 of [./nightly.sh]\n" ||
		r.Late || r.Missed != 0 || r.WokeFrom != torpor.StateHibernated || !r.DueAt.Equal(due) || r.FinishedAt == nil {
		t.Fatalf("result %+v", r)
	}
	if next := got.Wakeups[0].NextAt; next == nil || !next.Equal(due.Add(24*time.Hour)) {
		t.Fatalf("next %v, want the next day", next)
	}
	evs := eventsOf(e, sb.ID)
	if findEvent(evs, torpor.EventStarted, "cause", lifecycle.CauseWakeup) == nil ||
		findEvent(evs, lifecycle.EventWakeup, "woke_from", "hibernated", "late", "false") == nil ||
		findEvent(evs, lifecycle.EventWakeupDone, "exit_code", "3", "output", "run 1 of [./nightly.sh]\n") == nil {
		t.Fatalf("events %+v", evs)
	}

	// And it sleeps again by its policy: paused a minute after the
	// command, as after any activity.
	e.clock.Advance(59 * time.Second)
	if s := settle(e, sb.ID, torpor.StateRunning); s.State != torpor.StateRunning {
		t.Fatalf("paused early: %s", s.State)
	}
	e.clock.Advance(time.Second)
	if s := settle(e, sb.ID, torpor.StatePaused); s.State != torpor.StatePaused {
		t.Fatalf("after the wake-up and a minute idle: %s", s.State)
	}
	if ev := eventsOf(e, sb.ID); ev[len(ev)-1].Type != torpor.EventPaused || ev[len(ev)-1].Attrs["cause"] != lifecycle.CauseIdle {
		t.Fatalf("last event %+v", ev[len(ev)-1])
	}
	// Its running time is metered as any other's.
	if m := e.get(sb.ID).Meters; m.RunningS < 60 {
		t.Fatalf("running seconds %v", m.RunningS)
	}
}

// TestWakeupRunningAndPaused: a running sandbox just runs the command; a
// paused one is thawed for it; a wake-up without a command only wakes.
func TestWakeupRunningAndPaused(t *testing.T) {
	e := newEnv(t)
	runs := nightly(e, 0)
	at := e.clock.Now().Add(10 * time.Minute)
	sb := e.create(torpor.CreateRequest{Wakeups: []torpor.WakeupSpec{{WakeAt: &at, Cmd: []string{"date"}}}})
	e.clock.Advance(10 * time.Minute)
	got := waitWakeup(e, sb.ID, 1)
	if r := got.Wakeups[0].LastResult; r.WokeFrom != "" || runs.Load() != 1 || got.Wakeups[0].NextAt != nil || got.State != torpor.StateRunning {
		t.Fatalf("a running sandbox's wake-up: %+v, runs %d", got.Wakeups[0], runs.Load())
	}
	if len(e.get(sb.ID).UpcomingEvents) != 0 {
		t.Fatal("a one-off that came is still upcoming")
	}

	at = e.clock.Now().Add(10 * time.Minute)
	must(e.eng.SetWakeups(ctx, "acme", sb.ID, []torpor.WakeupSpec{{WakeAt: &at}}))
	must(e.eng.Pause(ctx, "acme", sb.ID, ""))
	e.clock.Advance(10 * time.Minute)
	got = waitWakeup(e, sb.ID, 1)
	if r := got.Wakeups[0].LastResult; r.WokeFrom != torpor.StatePaused || r.Status != torpor.WakeupDone || r.ExitCode != nil || got.State != torpor.StateRunning || runs.Load() != 1 {
		t.Fatalf("a paused sandbox's wake-up without a command: %s %+v", got.State, r)
	}
	if findEvent(eventsOf(e, sb.ID), torpor.EventResumed, "cause", lifecycle.CauseWakeup) == nil {
		t.Fatal("no resume with cause wake_up")
	}
}

// TestWakeupMissedRunsOnceAfterRestart: a daemon down past two times of a
// recurring wake-up runs it once when it is back, marked late, and moves
// on to the next time.
func TestWakeupMissedRunsOnceAfterRestart(t *testing.T) {
	e := newEnv(t)
	runs := nightly(e, 0)
	sb := e.create(torpor.CreateRequest{Wakeups: []torpor.WakeupSpec{{WakeSchedule: "0 4 * * *", Cmd: []string{"./nightly.sh"}}}})
	must(e.eng.Hibernate(ctx, "acme", sb.ID))
	e.eng.Close()
	// Down from 03:04 on the 2nd to 05:04 on the 3rd: the 04:00s of both
	// days pass.
	e.clock.Advance(26 * time.Hour)
	e.restart()
	got := waitWakeup(e, sb.ID, 1)
	r := got.Wakeups[0].LastResult
	if !r.Late || r.Missed != 1 || !r.DueAt.Equal(time.Date(2026, 1, 2, 4, 0, 0, 0, time.UTC)) || r.WokeFrom != torpor.StateHibernated {
		t.Fatalf("result %+v", r)
	}
	if next := got.Wakeups[0].NextAt; next == nil || !next.Equal(time.Date(2026, 1, 4, 4, 0, 0, 0, time.UTC)) {
		t.Fatalf("next %v", next)
	}
	time.Sleep(50 * time.Millisecond)
	if n := runs.Load(); n != 1 {
		t.Fatalf("the command ran %d times", n)
	}
	// A restart now does not run it again.
	e.restart()
	time.Sleep(50 * time.Millisecond)
	if n := runs.Load(); n != 1 || e.get(sb.ID).Wakeups[0].Runs != 1 {
		t.Fatalf("after another restart the command ran %d times", n)
	}
}

// TestWakeupInterruptedIsNotRunAgain: a daemon that stops while the
// command runs leaves the run interrupted, never run twice.
func TestWakeupInterruptedIsNotRunAgain(t *testing.T) {
	e := newEnv(t)
	var runs atomic.Int32
	e.host.ExecFunc = func(ctx context.Context, id string, req torpor.ExecRequest) (torpor.ExecResult, error) {
		runs.Add(1)
		<-ctx.Done()
		return torpor.ExecResult{}, ctx.Err()
	}
	at := e.clock.Now().Add(time.Minute)
	sb := e.create(torpor.CreateRequest{Wakeups: []torpor.WakeupSpec{{WakeAt: &at, Cmd: []string{"sleep", "1000"}}}})
	e.clock.Advance(time.Minute)
	deadline := time.Now().Add(5 * time.Second)
	for runs.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the command did not start")
		}
		time.Sleep(time.Millisecond)
	}
	e.restart()
	got := e.get(sb.ID)
	if r := got.Wakeups[0].LastResult; r.Status != torpor.WakeupInterrupted || runs.Load() != 1 {
		t.Fatalf("after a restart mid-run: %+v, runs %d", r, runs.Load())
	}
}

// TestWakeupWaitsForCapacity: a wake-up whose sandbox does not fit waits,
// says so, and runs once there is room.
func TestWakeupWaitsForCapacity(t *testing.T) {
	e := newEnv(t, func(cfg *lifecycle.Config) { cfg.Capacity = lifecycle.Capacity{MemoryMiB: 512} })
	runs := nightly(e, 0)
	at := e.clock.Now().Add(time.Hour)
	sb := e.create(torpor.CreateRequest{Wakeups: []torpor.WakeupSpec{{WakeAt: &at, Cmd: []string{"true"}}}})
	must(e.eng.Hibernate(ctx, "acme", sb.ID))
	other := e.create(torpor.CreateRequest{})
	e.clock.Advance(time.Hour)
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := e.get(sb.ID)
		if w := got.Wakeups[0]; w.Waiting == "capacity" && w.RetryAt != nil {
			if got.State != torpor.StateHibernated || w.Runs != 0 {
				t.Fatalf("a waiting wake-up: %s %+v", got.State, w)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the wake-up does not wait: %+v", got.Wakeups[0])
		}
		time.Sleep(time.Millisecond)
	}
	if findEvent(eventsOf(e, sb.ID), lifecycle.EventWakeupWaiting, "reason", "capacity") == nil {
		t.Fatal("no wakeup_waiting event")
	}
	must(e.eng.Delete(ctx, "acme", other.ID))
	e.clock.Advance(15 * time.Second)
	got := waitWakeup(e, sb.ID, 1)
	if r := got.Wakeups[0].LastResult; r.Status != torpor.WakeupDone || r.Late || runs.Load() != 1 || got.Wakeups[0].Waiting != "" {
		t.Fatalf("after room was made: %+v", got.Wakeups[0])
	}
}

// TestWakeupsChangeAndValidate: wake-ups are set, added, removed and
// cleared; bad ones are refused naming the field and change nothing.
func TestWakeupsChangeAndValidate(t *testing.T) {
	e := newEnv(t)
	past := e.clock.Now().Add(-time.Minute)
	if _, err := e.eng.Create(ctx, "acme", torpor.CreateRequest{Template: "base", Wakeups: []torpor.WakeupSpec{{WakeAt: &past}}}); !isInvalid(err, "wakeups[0].wake_at") {
		t.Fatalf("create with a past wake_at: %v", err)
	}
	sb := e.create(torpor.CreateRequest{})
	if _, err := e.eng.AddWakeup(ctx, "acme", sb.ID, torpor.WakeupSpec{WakeSchedule: "@daily", TimeZone: "Nowhere/Land"}); !isInvalid(err, "time_zone") {
		t.Fatalf("unknown zone: %v", err)
	}
	for range torpor.MaxWakeups {
		must(e.eng.AddWakeup(ctx, "acme", sb.ID, torpor.WakeupSpec{WakeSchedule: "@hourly"}))
	}
	if _, err := e.eng.AddWakeup(ctx, "acme", sb.ID, torpor.WakeupSpec{WakeSchedule: "@hourly"}); !isInvalid(err, "wakeups") {
		t.Fatalf("one too many: %v", err)
	}
	got := e.get(sb.ID)
	must(e.eng.RemoveWakeup(ctx, "acme", sb.ID, got.Wakeups[0].ID))
	if n := len(e.get(sb.ID).Wakeups); n != torpor.MaxWakeups-1 {
		t.Fatalf("%d wake-ups after a removal", n)
	}
	if _, err := e.eng.RemoveWakeup(ctx, "acme", sb.ID, "wk_nope"); err == nil || !torpor.IsCode(err, torpor.ENotFound) {
		t.Fatalf("removing an unknown wake-up: %v", err)
	}
	cleared, err := e.eng.SetWakeups(ctx, "acme", sb.ID, nil)
	if err != nil || len(cleared.Wakeups) != 0 {
		t.Fatalf("cleared: %v %+v", err, cleared)
	}
	if next, ok := e.eng.NextDeadline(sb.ID); ok {
		t.Fatalf("a deadline at %s is left with no policy and no wake-ups", next)
	}
}

func isInvalid(err error, param string) bool {
	var te *torpor.Error
	return errors.As(err, &te) && te.Code == torpor.EInvalid && te.Param == param
}
