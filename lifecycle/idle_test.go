package lifecycle_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/lifecycle"
)

func boolp(b bool) *bool { return &b }

func policy(p torpor.LifecyclePolicy) *torpor.LifecyclePolicy { return &p }

// step advances the clock and says what the sandbox must then be.
type step struct {
	advance time.Duration
	touch   bool
	want    torpor.State
}

// TestIdlePolicies drives every policy form through hours of fake time.
func TestIdlePolicies(t *testing.T) {
	const s = time.Second
	cases := []struct {
		name      string
		req       torpor.PolicyRequest
		maxPaused time.Duration
		steps     []step
		cause     string // cause on the last transition's event
	}{
		{"no policy never acts", torpor.PolicyRequest{}, 0,
			[]step{{advance: 100 * time.Hour, want: torpor.StateRunning}}, ""},
		{"pause after idle", torpor.PolicyRequest{LifecyclePolicy: policy(torpor.LifecyclePolicy{PauseAfterIdleSeconds: torpor.Seconds(60)})}, 0,
			[]step{{advance: 59 * s, want: torpor.StateRunning}, {advance: s, want: torpor.StatePaused}, {advance: 100 * time.Hour, want: torpor.StatePaused}}, lifecycle.CauseIdle},
		{"pause then hibernate", torpor.PolicyRequest{LifecyclePolicy: policy(torpor.LifecyclePolicy{PauseAfterIdleSeconds: torpor.Seconds(60), HibernateAfterPausedSeconds: torpor.Seconds(120)})}, 0,
			[]step{{advance: 60 * s, want: torpor.StatePaused}, {advance: 119 * s, want: torpor.StatePaused}, {advance: s, want: torpor.StateHibernated}}, lifecycle.CauseIdle},
		{"pausing off, hibernation on: hibernate when idle", torpor.PolicyRequest{LifecyclePolicy: policy(torpor.LifecyclePolicy{PauseAfterIdleSeconds: torpor.Off(), HibernateAfterPausedSeconds: torpor.Seconds(600)})}, 0,
			[]step{{advance: 599 * s, want: torpor.StateRunning}, {advance: s, want: torpor.StateHibernated}}, lifecycle.CauseIdle},
		{"timeout kills by default", torpor.PolicyRequest{Timeout: torpor.Seconds(30)}, 0,
			[]step{{advance: 30 * s, want: torpor.StateTerminated}}, lifecycle.CauseIdle},
		{"timeout with on_timeout pause never deletes the paused sandbox", torpor.PolicyRequest{Timeout: torpor.Seconds(30), Lifecycle: &torpor.Lifecycle{OnTimeout: torpor.ActionPause}}, 0,
			[]step{{advance: 30 * s, want: torpor.StatePaused}, {advance: 1000 * time.Hour, want: torpor.StatePaused}}, lifecycle.CauseIdle},
		{"timeout with on_timeout hibernate", torpor.PolicyRequest{Timeout: torpor.Seconds(30), Lifecycle: &torpor.Lifecycle{OnTimeout: torpor.ActionHibernate}}, 0,
			[]step{{advance: 30 * s, want: torpor.StateHibernated}}, lifecycle.CauseIdle},
		{"the platform hibernates a sandbox paused too long", torpor.PolicyRequest{Timeout: torpor.Seconds(30), Lifecycle: &torpor.Lifecycle{OnTimeout: torpor.ActionPause}}, 8 * time.Hour,
			[]step{{advance: 30 * s, want: torpor.StatePaused}, {advance: 8*time.Hour - s, want: torpor.StatePaused}, {advance: s, want: torpor.StateHibernated}}, lifecycle.CausePlatform},
		{"the sandbox's own hibernation comes before the platform's", torpor.PolicyRequest{LifecyclePolicy: policy(torpor.LifecyclePolicy{PauseAfterIdleSeconds: torpor.Seconds(10), HibernateAfterPausedSeconds: torpor.Seconds(60)})}, 8 * time.Hour,
			[]step{{advance: 10 * s, want: torpor.StatePaused}, {advance: 60 * s, want: torpor.StateHibernated}}, lifecycle.CauseIdle},
		{"activity resets the idle clock", torpor.PolicyRequest{LifecyclePolicy: policy(torpor.LifecyclePolicy{PauseAfterIdleSeconds: torpor.Seconds(60)})}, 0,
			[]step{{advance: 50 * s, touch: true, want: torpor.StateRunning}, {advance: 59 * s, want: torpor.StateRunning}, {advance: s, want: torpor.StatePaused}}, lifecycle.CauseIdle},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, func(cfg *lifecycle.Config) { cfg.MaxPaused = c.maxPaused })
			sb := e.create(torpor.CreateRequest{PolicyRequest: c.req})
			for i, st := range c.steps {
				e.clock.Advance(st.advance)
				if st.touch {
					must(e.eng.Touch(ctx, "acme", sb.ID))
				}
				got := settle(e, sb.ID, st.want)
				if got.State != st.want {
					t.Fatalf("step %d (+%v): %s, want %s", i, st.advance, got.State, st.want)
				}
			}
			if c.cause != "" {
				evs, _ := e.eng.Events(ctx, "acme", torpor.EventFilter{SandboxID: sb.ID})
				last := evs[len(evs)-1]
				if last.Attrs["cause"] != c.cause {
					t.Fatalf("last event %s has cause %q, want %q", last.Type, last.Attrs["cause"], c.cause)
				}
			}
		})
	}
}

// settle waits for the sandbox to reach want, or to be certain it will not:
// a sandbox whose next deadline lies in the future does not change.
func settle(e *env, id string, want torpor.State) *torpor.Sandbox {
	e.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		sb := e.get(id)
		if sb.State == want && !sb.State.Transitional() && nextDeadlineInFuture(e, sb) {
			return sb
		}
		if time.Now().After(deadline) {
			return sb
		}
		time.Sleep(time.Millisecond)
	}
}

func nextDeadlineInFuture(e *env, sb *torpor.Sandbox) bool {
	now := e.clock.Now()
	for _, at := range []*time.Time{sb.PauseAt, sb.HibernatesAt, sb.KillAt} {
		if at != nil && !at.After(now) {
			return false
		}
	}
	return true
}

func TestAutoResumeCycle(t *testing.T) {
	e := newEnv(t)
	sb := e.create(torpor.CreateRequest{PolicyRequest: torpor.PolicyRequest{
		LifecyclePolicy: policy(torpor.LifecyclePolicy{PauseAfterIdleSeconds: torpor.Seconds(60), HibernateAfterPausedSeconds: torpor.Seconds(600)})}})
	for round := 0; round < 3; round++ {
		e.clock.Advance(60 * time.Second)
		settle(e, sb.ID, torpor.StatePaused)
		if _, err := e.eng.Exec(ctx, "acme", sb.ID, torpor.ExecRequest{Cmd: []string{"true"}}); err != nil {
			t.Fatalf("round %d: exec on a paused sandbox: %v", round, err)
		}
		if got := e.get(sb.ID); got.State != torpor.StateRunning {
			t.Fatalf("round %d: after exec: %s", round, got.State)
		}
	}
	// From hibernated too: the exec boots it again.
	e.clock.Advance(60 * time.Second)
	settle(e, sb.ID, torpor.StatePaused)
	e.clock.Advance(600 * time.Second)
	settle(e, sb.ID, torpor.StateHibernated)
	if _, err := e.eng.Exec(ctx, "acme", sb.ID, torpor.ExecRequest{Cmd: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
	got := e.get(sb.ID)
	if got.State != torpor.StateRunning || got.Boots != 2 {
		t.Fatalf("after exec on hibernated: %s, boots %d", got.State, got.Boots)
	}
	// On the fake clock nothing takes time: 4 idle minutes running, then
	// 600 s frozen before the hibernation, which the exec ended at once.
	m := got.Meters
	if m.RunningS != 240 || m.FrozenS != 600 || m.HibernatedS != 0 || m.ResidentS != 840 || m.BilledS != 840 || m.Cost <= 0 {
		t.Errorf("seconds: %s", m)
	}
	m.RunningS, m.FrozenS, m.HibernatedS, m.ResidentS, m.BilledS, m.Cost = 0, 0, 0, 0, 0, 0
	want := torpor.Meters{Pauses: 4, AutoPaused: 4, Resumes: 4, AutoResumed: 4, Hibernations: 1, AutoHibernated: 1}
	if m != want {
		t.Fatalf("meters %+v, want %+v", got.Meters, want)
	}
	evs, _ := e.eng.Events(ctx, "acme", torpor.EventFilter{SandboxID: sb.ID})
	autos := 0
	for _, ev := range evs {
		if ev.Type == torpor.EventResumed && ev.Attrs["auto"] == "true" {
			autos++
		}
	}
	if autos != 3 {
		t.Fatalf("%d resumed events with auto=true, want 3", autos)
	}
}

func TestAutoResumeOffRefusesWithPaused(t *testing.T) {
	e := newEnv(t)
	sb := e.create(torpor.CreateRequest{PolicyRequest: torpor.PolicyRequest{Lifecycle: &torpor.Lifecycle{AutoResume: boolp(false)}}})
	must(e.eng.Pause(ctx, "acme", sb.ID, ""))
	_, err := e.eng.Exec(ctx, "acme", sb.ID, torpor.ExecRequest{Cmd: []string{"true"}})
	te, ok := err.(*torpor.Error)
	if !ok || te.Code != torpor.EConflict || te.Reason != "paused" {
		t.Fatalf("exec with auto_resume off: %v", err)
	}
	if e.get(sb.ID).State != torpor.StatePaused {
		t.Fatal("the refused exec woke the sandbox")
	}
}

func TestConcurrentCallersShareOneResume(t *testing.T) {
	e := newEnv(t)
	sb := e.create(torpor.CreateRequest{})
	must(e.eng.Pause(ctx, "acme", sb.ID, ""))
	var wg sync.WaitGroup
	errs := make(chan error, 10)
	for range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := e.eng.Exec(ctx, "acme", sb.ID, torpor.ExecRequest{Cmd: []string{"true"}})
			errs <- err
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if m := e.get(sb.ID).Meters; m.Resumes != 1 || m.AutoResumed != 1 {
		t.Fatalf("meters %+v: want exactly one resume", m)
	}
}

// TestSweepLosesToAnOperation: an exec in flight when the deadline passes
// is activity; the sandbox pauses only after it has been idle again.
func TestSweepLosesToAnOperation(t *testing.T) {
	e := newEnv(t)
	release, started := make(chan struct{}), make(chan struct{})
	e.host.ExecFunc = func(ctx context.Context, id string, req torpor.ExecRequest) (torpor.ExecResult, error) {
		close(started)
		<-release
		return torpor.ExecResult{}, nil
	}
	sb := e.create(torpor.CreateRequest{PolicyRequest: torpor.PolicyRequest{LifecyclePolicy: policy(torpor.LifecyclePolicy{PauseAfterIdleSeconds: torpor.Seconds(60)})}})
	done := make(chan error)
	go func() {
		_, err := e.eng.Exec(ctx, "acme", sb.ID, torpor.ExecRequest{Cmd: []string{"long-build"}})
		done <- err
	}()
	<-started
	e.clock.Advance(10 * time.Minute)
	// The sweep fires, sees the operation and reschedules.
	awaitReschedule(t, e, sb.ID)
	if got := e.get(sb.ID); got.State != torpor.StateRunning {
		t.Fatalf("paused under a running exec: %s", got.State)
	}
	close(release)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	end := e.clock.Now()
	if got := e.get(sb.ID); !got.LastActivityAt.Equal(end) || !got.PauseAt.Equal(end.Add(time.Minute)) {
		t.Fatalf("after the exec: last activity %v, pause at %v", got.LastActivityAt, got.PauseAt)
	}
	e.clock.Advance(time.Minute)
	if got := settle(e, sb.ID, torpor.StatePaused); got.State != torpor.StatePaused {
		t.Fatalf("not paused a minute after the exec ended: %s", got.State)
	}
}

func TestScheduleIsShown(t *testing.T) {
	e := newEnv(t)
	sb := e.create(torpor.CreateRequest{PolicyRequest: torpor.PolicyRequest{
		LifecyclePolicy: policy(torpor.LifecyclePolicy{PauseAfterIdleSeconds: torpor.Seconds(600), HibernateAfterPausedSeconds: torpor.Seconds(7200)})}})
	now := e.clock.Now()
	if sb.PauseAt == nil || !sb.PauseAt.Equal(now.Add(10*time.Minute)) {
		t.Fatalf("pause_at %v", sb.PauseAt)
	}
	if sb.HibernatesAt == nil || !sb.HibernatesAt.Equal(now.Add(130*time.Minute)) {
		t.Fatalf("hibernates_at %v", sb.HibernatesAt)
	}
	if len(sb.UpcomingEvents) != 1 || sb.UpcomingEvents[0].Action != torpor.ActionPause {
		t.Fatalf("upcoming events within the hour: %+v", sb.UpcomingEvents)
	}
	// PATCH turns pausing off: nothing is scheduled any more.
	got, err := e.eng.Update(ctx, "acme", sb.ID, torpor.UpdateRequest{PolicyRequest: torpor.PolicyRequest{
		LifecyclePolicy: &torpor.LifecyclePolicy{PauseAfterIdleSeconds: torpor.Off(), HibernateAfterPausedSeconds: torpor.Off()}}})
	if err != nil {
		t.Fatal(err)
	}
	if got.PauseAt != nil || got.HibernatesAt != nil || len(got.UpcomingEvents) != 0 {
		t.Fatalf("after turning the policy off: %+v", got.Schedule)
	}
}

func TestPolicySurvivesARestart(t *testing.T) {
	e := newEnv(t)
	sb := e.create(torpor.CreateRequest{PolicyRequest: torpor.PolicyRequest{Timeout: torpor.Seconds(30), Lifecycle: &torpor.Lifecycle{OnTimeout: torpor.ActionPause}}})
	e.restart()
	e.clock.Advance(30 * time.Second)
	if got := settle(e, sb.ID, torpor.StatePaused); got.State != torpor.StatePaused {
		t.Fatalf("after a restart the policy did not act: %s", got.State)
	}
}

func TestPolicyValidation(t *testing.T) {
	e := newEnv(t)
	cases := []struct {
		name  string
		req   torpor.PolicyRequest
		param string
	}{
		{"negative timeout", torpor.PolicyRequest{Timeout: torpor.Seconds(-1)}, "timeout"},
		{"absurd pause", torpor.PolicyRequest{LifecyclePolicy: policy(torpor.LifecyclePolicy{PauseAfterIdleSeconds: torpor.Seconds(1 << 40)})}, "lifecycle_policy.pause_after_idle_seconds"},
		{"zero hibernate", torpor.PolicyRequest{LifecyclePolicy: policy(torpor.LifecyclePolicy{HibernateAfterPausedSeconds: torpor.Seconds(0)})}, "lifecycle_policy.hibernate_after_paused_seconds"},
		{"negative connection idle", torpor.PolicyRequest{LifecyclePolicy: policy(torpor.LifecyclePolicy{ConnectionIdleSeconds: torpor.Seconds(-5)})}, "lifecycle_policy.connection_idle_seconds"},
		{"unknown on_timeout", torpor.PolicyRequest{Timeout: torpor.Seconds(5), Lifecycle: &torpor.Lifecycle{OnTimeout: "explode"}}, "lifecycle.on_timeout"},
		{"on_timeout without timeout", torpor.PolicyRequest{Lifecycle: &torpor.Lifecycle{OnTimeout: torpor.ActionPause}}, "lifecycle.on_timeout"},
		{"both idle forms", torpor.PolicyRequest{Timeout: torpor.Seconds(5), LifecyclePolicy: policy(torpor.LifecyclePolicy{PauseAfterIdleSeconds: torpor.Seconds(5)})}, "lifecycle_policy.pause_after_idle_seconds"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := e.eng.Create(ctx, "acme", torpor.CreateRequest{Template: "base", PolicyRequest: c.req})
			te, ok := err.(*torpor.Error)
			if !ok || te.Code != torpor.EInvalid || te.Param != c.param {
				t.Fatalf("got %v, want invalid_argument on %s", err, c.param)
			}
		})
	}
}

func TestCapacity(t *testing.T) {
	e := newEnv(t, func(cfg *lifecycle.Config) {
		cfg.Capacity = lifecycle.Capacity{VCPUs: 2, MemoryMiB: 1024, PausedReleaseRatio: 0.5}
	})
	one := &torpor.Resources{VCPUs: 1, MemoryMiB: 512}
	a := e.create(torpor.CreateRequest{Resources: one})
	b := e.create(torpor.CreateRequest{Resources: one})
	full := func(err error) bool {
		te, ok := err.(*torpor.Error)
		return ok && te.Code == torpor.EConflict && te.Reason == "capacity" && te.RetryAfter > 0
	}
	_, err := e.eng.Create(ctx, "acme", torpor.CreateRequest{Template: "base", Resources: one})
	if !full(err) {
		t.Fatalf("third create on a full node: %v", err)
	}
	if list, _ := e.eng.List(ctx, "acme", torpor.SandboxFilter{IncludeTerminated: true}); len(list) != 2 {
		t.Fatalf("a refused create left a sandbox: %d", len(list))
	}
	// A paused sandbox gives back half: one half-size sandbox fits.
	must(e.eng.Pause(ctx, "acme", a.ID, ""))
	half := e.create(torpor.CreateRequest{Resources: &torpor.Resources{VCPUs: 0.5, MemoryMiB: 256}})
	// Now a's resume does not fit, and a stays paused.
	if _, err := e.eng.Start(ctx, "acme", a.ID); !full(err) {
		t.Fatalf("resume on a full node: %v", err)
	}
	if got := e.get(a.ID); got.State != torpor.StatePaused || e.host.State(a.ID) != torpor.InstanceFrozen {
		t.Fatalf("a refused resume changed the sandbox: %s", got.State)
	}
	// Hibernating b frees its share: a resumes.
	must(e.eng.Hibernate(ctx, "acme", b.ID))
	must(e.eng.Start(ctx, "acme", a.ID))
	// Deleting frees too; the capacity survives a restart.
	must(e.eng.Delete(ctx, "acme", half.ID))
	e.restart()
	if _, err := e.eng.Start(ctx, "acme", b.ID); err != nil {
		t.Fatalf("start of b after a restart: %v", err)
	}
	if _, err := e.eng.Create(ctx, "acme", torpor.CreateRequest{Template: "base", Resources: one}); !full(err) {
		t.Fatalf("after the restart the ledger forgot what runs: %v", err)
	}
}

// TestCPUUseCountsAsActivity: with cpu activity on, a sandbox busy
// computing is not paused under its work; once it stops, it is.
func TestCPUUseCountsAsActivity(t *testing.T) {
	e := newEnv(t, func(cfg *lifecycle.Config) { cfg.CPUActivity = 0.5 })
	sb := e.create(torpor.CreateRequest{PolicyRequest: torpor.PolicyRequest{
		LifecyclePolicy: policy(torpor.LifecyclePolicy{PauseAfterIdleSeconds: torpor.Seconds(60)})}})
	waitDeadline := func(after time.Time) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
			if at, ok := e.eng.NextDeadline(sb.ID); ok && at.After(after) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatal("the sweep did not reschedule")
			}
		}
	}
	e.clock.Advance(60 * time.Second) // idle deadline: first CPU sample
	waitDeadline(e.clock.Now())
	e.host.AddCPU(sb.ID, 20*time.Second) // 20 s of CPU in the next 30 s
	e.clock.Advance(30 * time.Second)
	waitDeadline(e.clock.Now())
	if got := e.get(sb.ID); got.State != torpor.StateRunning || !got.LastActivityAt.Equal(e.clock.Now()) {
		t.Fatalf("busy computing: %s, last activity %v", got.State, got.LastActivityAt)
	}
	e.clock.Advance(60 * time.Second) // idle now: no CPU since the last sample
	if got := settle(e, sb.ID, torpor.StatePaused); got.State != torpor.StatePaused {
		t.Fatalf("idle after computing: %s", got.State)
	}
}

// TestRecordActivity is how the port proxy reports traffic: it restarts the
// idle clock of a running sandbox and leaves others alone.
func TestRecordActivity(t *testing.T) {
	e := newEnv(t)
	sb := e.create(torpor.CreateRequest{PolicyRequest: torpor.PolicyRequest{
		LifecyclePolicy: policy(torpor.LifecyclePolicy{PauseAfterIdleSeconds: torpor.Seconds(60)})}})
	e.clock.Advance(50 * time.Second)
	if err := e.eng.RecordActivity(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if got := e.get(sb.ID); !got.PauseAt.Equal(e.clock.Now().Add(time.Minute)) {
		t.Fatalf("pause_at %v after traffic at %v", got.PauseAt, e.clock.Now())
	}
	must(e.eng.Pause(ctx, "acme", sb.ID, ""))
	if err := e.eng.RecordActivity(ctx, sb.ID); err != nil || e.get(sb.ID).State != torpor.StatePaused {
		t.Fatalf("traffic to a paused sandbox: %v %s", err, e.get(sb.ID).State)
	}
}

// TestSweepLosesToARequestWaitingForItsAnswer: a proxied request under way
// (its answer not begun) keeps its sandbox from an idle pause; once it
// ended, the idle clock starts from its end.
func TestSweepLosesToARequestWaitingForItsAnswer(t *testing.T) {
	e := newEnv(t)
	sb := e.create(torpor.CreateRequest{PolicyRequest: torpor.PolicyRequest{LifecyclePolicy: policy(torpor.LifecyclePolicy{PauseAfterIdleSeconds: torpor.Seconds(60)})}})
	e.eng.RequestStarted(sb.ID)
	e.clock.Advance(10 * time.Minute)
	awaitReschedule(t, e, sb.ID)
	if got := e.get(sb.ID); got.State != torpor.StateRunning {
		t.Fatalf("paused under a request waiting for its answer: %s", got.State)
	}
	e.eng.RequestEnded(sb.ID)
	e.clock.Advance(time.Minute)
	if got := settle(e, sb.ID, torpor.StatePaused); got.State != torpor.StatePaused {
		t.Fatalf("not paused a minute after the request's answer began: %s", got.State)
	}
}

// TestARequestAsThePauseBeginsStopsIt: a request admitted after the idle
// engine looked for traffic but before the sandbox was marked pausing
// (here: while its pause hook runs) keeps it running; it is not frozen
// under the request.
func TestARequestAsThePauseBeginsStopsIt(t *testing.T) {
	e := newEnv(t)
	var id string
	e.host.ExecFunc = func(ctx context.Context, sid string, req torpor.ExecRequest) (torpor.ExecResult, error) {
		e.eng.RequestStarted(id) // the proxy admits a request now
		return torpor.ExecResult{}, nil
	}
	sb := e.create(torpor.CreateRequest{
		PolicyRequest: torpor.PolicyRequest{LifecyclePolicy: policy(torpor.LifecyclePolicy{PauseAfterIdleSeconds: torpor.Seconds(60)})},
		Hooks:         []torpor.Hook{{Type: torpor.HookScript, On: torpor.HookOnPause, Path: "/bin/flush", Wait: true}}})
	id = sb.ID
	e.clock.Advance(2 * time.Minute)
	awaitReschedule(t, e, sb.ID)
	if got := e.get(sb.ID); got.State != torpor.StateRunning || e.host.State(sb.ID) != torpor.InstanceRunning {
		t.Fatalf("after a request came as the pause began: %s, instance %s", got.State, e.host.State(sb.ID))
	}
	e.eng.RequestEnded(sb.ID)
}

// awaitReschedule waits until the sweep that was due has run and set the
// sandbox's next deadline in the future.
func awaitReschedule(t *testing.T, e *env, id string) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(time.Millisecond) {
		if at, ok := e.eng.NextDeadline(id); ok && at.After(e.clock.Now()) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the sweep did not reschedule")
		}
	}
}
