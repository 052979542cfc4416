package lifecycle_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/lifecycle"
)

// endStep advances the clock, optionally does something, and says what
// the sandbox must then be.
type endStep struct {
	advance time.Duration
	do      func(e *env, id string)
	want    torpor.State
}

func touch(e *env, id string) { must(e.eng.Touch(ctx, "acme", id)) }

func start(e *env, id string) { must(e.eng.Start(ctx, "acme", id)) }

// TestEndTime drives the end-time rules (E2B's timeout) through hours of
// fake time: an absolute end that activity does not move, its action, a
// pause that stops it, and a resume that renews it.
func TestEndTime(t *testing.T) {
	const s = time.Second
	end := func(after int64, on string) torpor.PolicyRequest {
		return torpor.PolicyRequest{EndAfterSeconds: torpor.Seconds(after), OnEnd: on}
	}
	cases := []struct {
		name  string
		req   torpor.PolicyRequest
		steps []endStep
		cause string
	}{
		{"the end kills by default", end(60, ""),
			[]endStep{{advance: 59 * s, want: torpor.StateRunning}, {advance: s, want: torpor.StateTerminated}}, lifecycle.CauseEnd},
		{"activity does not move the end", end(60, torpor.ActionKill),
			[]endStep{{advance: 30 * s, do: touch, want: torpor.StateRunning}, {advance: 29 * s, do: touch, want: torpor.StateRunning}, {advance: s, want: torpor.StateTerminated}}, lifecycle.CauseEnd},
		{"on_end pause pauses and the paused sandbox stays", end(60, torpor.ActionPause),
			[]endStep{{advance: 60 * s, want: torpor.StatePaused}, {advance: 1000 * time.Hour, want: torpor.StatePaused}}, lifecycle.CauseEnd},
		{"on_end hibernate", end(60, torpor.ActionHibernate),
			[]endStep{{advance: 60 * s, want: torpor.StateHibernated}}, lifecycle.CauseEnd},
		{"a resume renews the end from then", end(60, torpor.ActionPause),
			[]endStep{{advance: 60 * s, want: torpor.StatePaused}, {advance: time.Hour, do: start, want: torpor.StateRunning},
				{advance: 59 * s, want: torpor.StateRunning}, {advance: s, want: torpor.StatePaused}}, lifecycle.CauseEnd},
		{"a start from hibernation renews it too", end(60, torpor.ActionHibernate),
			[]endStep{{advance: 60 * s, want: torpor.StateHibernated}, {advance: time.Hour, do: start, want: torpor.StateRunning},
				{advance: 59 * s, want: torpor.StateRunning}, {advance: s, want: torpor.StateHibernated}}, lifecycle.CauseEnd},
		{"an idle pause first stops the end", torpor.PolicyRequest{EndAfterSeconds: torpor.Seconds(60),
			LifecyclePolicy: policy(torpor.LifecyclePolicy{PauseAfterIdleSeconds: torpor.Seconds(30)})},
			[]endStep{{advance: 30 * s, want: torpor.StatePaused}, {advance: 100 * time.Hour, want: torpor.StatePaused}}, lifecycle.CauseIdle},
		{"the end comes before a later idle timeout", torpor.PolicyRequest{EndAfterSeconds: torpor.Seconds(60), Timeout: torpor.Seconds(600),
			Lifecycle: &torpor.Lifecycle{OnTimeout: torpor.ActionPause}},
			[]endStep{{advance: 60 * s, want: torpor.StateTerminated}}, lifecycle.CauseEnd},
		{"an absolute end_at", torpor.PolicyRequest{EndAt: torpor.At(time.Date(2026, 1, 2, 4, 4, 5, 0, time.UTC))},
			[]endStep{{advance: time.Hour - s, want: torpor.StateRunning}, {advance: s, want: torpor.StateTerminated}}, lifecycle.CauseEnd},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t)
			sb := e.create(torpor.CreateRequest{PolicyRequest: c.req})
			for i, st := range c.steps {
				e.clock.Advance(st.advance)
				if st.do != nil {
					st.do(e, sb.ID)
				}
				if got := settle(e, sb.ID, st.want); got.State != st.want {
					t.Fatalf("step %d (+%v): %s, want %s", i, st.advance, got.State, st.want)
				}
			}
			evs, _ := e.eng.Events(ctx, "acme", torpor.EventFilter{SandboxID: sb.ID})
			if last := evs[len(evs)-1]; last.Attrs["cause"] != c.cause {
				t.Fatalf("last event %s has cause %q, want %q", last.Type, last.Attrs["cause"], c.cause)
			}
		})
	}
}

func TestEndBusyOperationDoesNotDelayIt(t *testing.T) {
	e := newEnv(t)
	sb := e.create(torpor.CreateRequest{PolicyRequest: torpor.PolicyRequest{EndAfterSeconds: torpor.Seconds(60)}})
	release := make(chan struct{})
	started := make(chan struct{})
	e.host.ExecFunc = func(_ context.Context, id string, req torpor.ExecRequest) (torpor.ExecResult, error) {
		close(started)
		<-release
		return torpor.ExecResult{}, nil
	}
	go func() { _, _ = e.eng.Exec(ctx, "acme", sb.ID, torpor.ExecRequest{Cmd: []string{"sleep"}}) }()
	<-started
	e.clock.Advance(60 * time.Second)
	got := waitState(e, sb.ID, torpor.StateTerminated)
	close(release)
	if got.State != torpor.StateTerminated {
		t.Fatalf("the end waited for a busy operation: %s", got.State)
	}
}

func TestEndScheduleIsShown(t *testing.T) {
	e := newEnv(t)
	now := e.clock.Now()
	sb := e.create(torpor.CreateRequest{PolicyRequest: torpor.PolicyRequest{EndAfterSeconds: torpor.Seconds(300), OnEnd: torpor.ActionPause}})
	want := now.Add(5 * time.Minute)
	if sb.EndAt == nil || !sb.EndAt.Equal(want) || sb.EndAfterSeconds != 300 || sb.OnEnd != torpor.ActionPause {
		t.Fatalf("end %v after %d on %q", sb.EndAt, sb.EndAfterSeconds, sb.OnEnd)
	}
	if sb.PauseAt == nil || !sb.PauseAt.Equal(want) {
		t.Fatalf("pause_at %v, want %v", sb.PauseAt, want)
	}
	if len(sb.UpcomingEvents) != 1 || sb.UpcomingEvents[0].Cause != lifecycle.CauseEnd || sb.UpcomingEvents[0].Action != torpor.ActionPause {
		t.Fatalf("upcoming events: %+v", sb.UpcomingEvents)
	}
	// Paused, its end does not run: nothing is scheduled.
	must(e.eng.Pause(ctx, "acme", sb.ID, ""))
	if got := e.get(sb.ID); got.PauseAt != nil || got.KillAt != nil || len(got.UpcomingEvents) != 0 {
		t.Fatalf("paused: %+v", got.Schedule)
	}
	// PATCH end_at null removes the end.
	start(e, sb.ID)
	got, err := e.eng.Update(ctx, "acme", sb.ID, torpor.UpdateRequest{PolicyRequest: torpor.PolicyRequest{EndAt: torpor.OptTime{Set: true, Null: true}}})
	if err != nil {
		t.Fatal(err)
	}
	if got.EndAt != nil || got.PauseAt != nil || len(got.UpcomingEvents) != 0 {
		t.Fatalf("after end_at null: end %v, %+v", got.EndAt, got.Schedule)
	}
	e.clock.Advance(100 * time.Hour)
	if got := settle(e, sb.ID, torpor.StateRunning); got.State != torpor.StateRunning {
		t.Fatalf("without an end: %s", got.State)
	}
}

func TestEndSurvivesARestartAndIsReconciled(t *testing.T) {
	e := newEnv(t)
	a := e.create(torpor.CreateRequest{PolicyRequest: torpor.PolicyRequest{EndAfterSeconds: torpor.Seconds(60)}})
	b := e.create(torpor.CreateRequest{PolicyRequest: torpor.PolicyRequest{EndAfterSeconds: torpor.Seconds(600), OnEnd: torpor.ActionPause}})
	e.eng.Close()
	// The daemon is down past a's end.
	e.clock.Advance(120 * time.Second)
	e.eng = nil
	e.restart()
	if got := waitState(e, a.ID, torpor.StateTerminated); got.State != torpor.StateTerminated {
		t.Fatalf("an end that passed while the daemon was down: %s", got.State)
	}
	if got := e.get(b.ID); got.State != torpor.StateRunning || got.PauseAt == nil {
		t.Fatalf("b: %s, %+v", got.State, got.Schedule)
	}
	e.clock.Advance(480 * time.Second)
	if got := settle(e, b.ID, torpor.StatePaused); got.State != torpor.StatePaused {
		t.Fatalf("b after its end: %s", got.State)
	}
}

func TestSetEndAndConnect(t *testing.T) {
	const s = time.Second
	e := newEnv(t)
	sb := e.create(torpor.CreateRequest{PolicyRequest: torpor.PolicyRequest{EndAfterSeconds: torpor.Seconds(300), OnEnd: torpor.ActionPause}})
	now := func() time.Time { return e.clock.Now() }
	endOf := func() time.Time { return *e.get(sb.ID).EndAt }

	cases := []struct {
		name    string
		change  lifecycle.EndChange
		wantEnd func(before time.Time) time.Time
	}{
		{"setTimeout moves it earlier", lifecycle.EndChange{In: 30 * s, Renew: true}, func(time.Time) time.Time { return now().Add(30 * s) }},
		{"setTimeout moves it later", lifecycle.EndChange{In: 900 * s, Renew: true}, func(time.Time) time.Time { return now().Add(900 * s) }},
		{"refresh never moves it earlier", lifecycle.EndChange{In: 15 * s, LaterOnly: true}, func(b time.Time) time.Time { return b }},
		{"refresh moves it later", lifecycle.EndChange{In: 3600 * s, LaterOnly: true}, func(time.Time) time.Time { return now().Add(3600 * s) }},
	}
	for _, c := range cases {
		before := endOf()
		got, err := e.eng.SetEnd(ctx, "acme", sb.ID, c.change)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if want := c.wantEnd(before); !got.EndAt.Equal(want) {
			t.Fatalf("%s: end %v, want %v", c.name, got.EndAt, want)
		}
	}
	if got := e.get(sb.ID); got.EndAfterSeconds != 900 {
		t.Fatalf("the last setTimeout is the run time a resume grants: %d", got.EndAfterSeconds)
	}
	if _, err := e.eng.SetEnd(ctx, "acme", sb.ID, lifecycle.EndChange{In: -s}); !torpor.IsCode(err, torpor.EInvalid) {
		t.Fatalf("negative: %v", err)
	}
	// Paused: its end does not run, so setting it is a conflict.
	must(e.eng.Pause(ctx, "acme", sb.ID, ""))
	if _, err := e.eng.SetEnd(ctx, "acme", sb.ID, lifecycle.EndChange{In: 60 * s}); !torpor.IsCode(err, torpor.EConflict) {
		t.Fatalf("set end of a paused sandbox: %v", err)
	}
	// Connect resumes it from memory with its end at now + d.
	e.clock.Advance(time.Hour)
	got, resumed, err := e.eng.Connect(ctx, "acme", sb.ID, 120*s)
	if err != nil || !resumed || got.State != torpor.StateRunning || got.Boots != 1 {
		t.Fatalf("connect of paused: resumed %v, %v, %+v", resumed, err, got)
	}
	if !got.EndAt.Equal(now().Add(120*s)) || got.EndAfterSeconds != 120 {
		t.Fatalf("connect: end %v after %d", got.EndAt, got.EndAfterSeconds)
	}
	// Connect of a running one only extends.
	got, resumed, err = e.eng.Connect(ctx, "acme", sb.ID, 10*s)
	if err != nil || resumed || !got.EndAt.Equal(now().Add(120*s)) {
		t.Fatalf("connect of running with a shorter timeout: resumed %v, %v, end %v", resumed, err, got.EndAt)
	}
	// Connect of a hibernated one boots it on its disk.
	must(e.eng.Hibernate(ctx, "acme", sb.ID))
	got, resumed, err = e.eng.Connect(ctx, "acme", sb.ID, 60*s)
	if err != nil || !resumed || got.State != torpor.StateRunning || got.Boots != 2 || !got.EndAt.Equal(now().Add(60*s)) {
		t.Fatalf("connect of hibernated: resumed %v, %v, %+v", resumed, err, got)
	}
	e.clock.Advance(60 * s)
	if got := settle(e, sb.ID, torpor.StatePaused); got.State != torpor.StatePaused {
		t.Fatalf("after the connect's end: %s", got.State)
	}
	// Another tenant's sandbox is not found; a deleted one is gone.
	if _, _, err := e.eng.Connect(ctx, "other", sb.ID, 60*s); !torpor.IsCode(err, torpor.ENotFound) {
		t.Fatalf("other tenant: %v", err)
	}
	must(e.eng.Delete(ctx, "acme", sb.ID))
	if _, err := e.eng.SetEnd(ctx, "acme", sb.ID, lifecycle.EndChange{In: s}); !torpor.IsCode(err, torpor.EGone) {
		t.Fatalf("deleted: %v", err)
	}
}

func TestEndValidation(t *testing.T) {
	e := newEnv(t)
	cases := []struct {
		name  string
		req   torpor.PolicyRequest
		param string
	}{
		{"unknown on_end", torpor.PolicyRequest{OnEnd: "explode"}, "on_end"},
		{"zero end_after_seconds", torpor.PolicyRequest{EndAfterSeconds: torpor.Seconds(0)}, "end_after_seconds"},
		{"negative end_after_seconds", torpor.PolicyRequest{EndAfterSeconds: torpor.Seconds(-5)}, "end_after_seconds"},
		{"too long", torpor.PolicyRequest{EndAfterSeconds: torpor.Seconds(torpor.MaxPolicySeconds + 1)}, "end_after_seconds"},
		{"year one", torpor.PolicyRequest{EndAt: torpor.At(time.Time{})}, "end_at"},
	}
	for _, c := range cases {
		_, err := e.eng.Create(ctx, "acme", torpor.CreateRequest{Template: "base", PolicyRequest: c.req})
		var te *torpor.Error
		if !torpor.IsCode(err, torpor.EInvalid) || !errors.As(err, &te) || te.Param != c.param {
			t.Errorf("%s: %v, want invalid %s", c.name, err, c.param)
		}
	}
	if sbs, _ := e.eng.List(ctx, "acme", torpor.SandboxFilter{IncludeTerminated: true}); len(sbs) != 0 {
		t.Fatalf("refused creates made %d sandboxes", len(sbs))
	}
}
