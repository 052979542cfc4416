package gpu_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/gpu"
)

// pausePath stands in for the daemon's POST /pause path: it counts calls
// and ends in Manager.Pause with the context it was given.
type pausePath struct {
	mu     sync.Mutex
	calls  []string
	before func(id string)
}

func (p *pausePath) opt() envOpt {
	return withPause(func(m func() *gpu.Manager) func(ctx context.Context, id string) error {
		return func(ctx context.Context, id string) error {
			p.mu.Lock()
			p.calls = append(p.calls, id)
			before := p.before
			p.mu.Unlock()
			if before != nil {
				before(id)
			}
			_, err := m().Pause(ctx, id)
			return err
		}
	})
}

func (p *pausePath) count() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.calls)
}

// TestIdleSweepPausesThroughThePausePath: a resident lease idle for its
// timeout is paused by the tick, through the same path as POST /pause,
// and counted in auto_paused.
func TestIdleSweepPausesThroughThePausePath(t *testing.T) {
	p := &pausePath{}
	e := newEnv(t, false, p.opt())
	e.lease("a", gpu.SuspendTransparent, idleTimeout(600))
	e.clock.Advance(599 * time.Second)
	if r := e.m.Tick(context.Background()); len(r.AutoPaused) != 0 || p.count() != 0 {
		t.Fatalf("paused %v before its timeout", r.AutoPaused)
	}
	e.clock.Advance(time.Second)
	r := e.m.Tick(context.Background())
	if len(r.AutoPaused) != 1 || p.count() != 1 {
		t.Fatalf("tick = %+v, pause path calls %d", r, p.count())
	}
	st := e.status("a")
	if !st.Spilled || st.Meters.AutoPaused != 1 || st.Meters.IdleTimeoutS != 600 {
		t.Fatalf("status = %+v", st)
	}
	if len(e.eventsOf(gpu.EventAutoPaused)) != 1 {
		t.Fatal("no auto-pause event")
	}
	// A paused lease is not swept again.
	e.clock.Advance(time.Hour)
	e.m.Tick(context.Background())
	if p.count() != 1 {
		t.Fatalf("the sweep paused a paused lease: %d calls", p.count())
	}
	// A manual pause does not count as an auto-pause.
	e.resume("a")
	e.pause("a")
	if st := e.status("a"); st.Meters.AutoPaused != 1 {
		t.Fatalf("auto_paused = %d after a manual pause", st.Meters.AutoPaused)
	}
}

// TestIdleSweepFollowsTheManualVerbsRules: the sweep's pause is the
// manual one: on a hard-cap host with non-worker VRAM it is freeze-only
// and billed; exec on the auto-paused lease thaws it.
func TestIdleSweepFollowsTheManualVerbsRules(t *testing.T) {
	e := newEnv(t, true)
	e.lease("a", gpu.SuspendTransparent, idleTimeout(60))
	e.jobChild("a", 1024)
	e.clock.Advance(time.Minute)
	e.m.Tick(context.Background())
	st := e.status("a")
	if !st.Frozen || !st.FreezeOnly || st.FreezeReason != gpu.FreezeReasonNonWorkerVRAM {
		t.Fatalf("auto-paused status = %+v, want freeze-only", st)
	}
	e.clock.Advance(time.Minute)
	if m := e.status("a").Meters; !near(m.FrozenBilledS, 60) || !near(m.BilledS, 120) {
		t.Fatalf("meters = %+v", m)
	}
	e.job("a", time.Second)
	if st := e.status("a"); st.Frozen {
		t.Fatal("exec did not thaw the auto-paused lease")
	}
}

// TestIdleSweepRacingAnExecIsRefusedAndRetriedNextTick: a sweep whose
// pause meets a job in flight is refused like a manual pause, and the
// next tick tries again.
func TestIdleSweepRacingAnExecIsRefusedAndRetriedNextTick(t *testing.T) {
	p := &pausePath{}
	var job *gpu.Job
	e := newEnv(t, false, p.opt())
	p.before = func(id string) {
		if job == nil {
			var err error
			if job, err = e.m.BeginJob(context.Background(), id); err != nil {
				t.Error(err)
			}
		}
	}
	e.lease("a", gpu.SuspendNone, idleTimeout(60))
	e.clock.Advance(time.Minute)
	r := e.m.Tick(context.Background())
	if len(r.AutoPaused) != 0 || r.Refused["a"] == nil {
		t.Fatalf("tick = %+v, want the pause refused", r)
	}
	wantCode(t, r.Refused["a"], torpor.EConflict, "busy")
	if st := e.status("a"); st.Frozen || st.Meters.AutoPaused != 0 {
		t.Fatalf("status = %+v", st)
	}
	if err := job.End(context.Background()); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Minute)
	if r := e.m.Tick(context.Background()); len(r.AutoPaused) != 1 {
		t.Fatalf("the next tick did not pause: %+v", r)
	}
}

// TestIdleSweepSkipsWhatItMustNotPause: a timeout of 0, a busy lease, a
// frozen or spilled one, and everything under the kill switch
// (TORPOR_GPU_IDLE_AUTOPAUSE=0) are left alone.
func TestIdleSweepSkipsWhatItMustNotPause(t *testing.T) {
	cases := []struct {
		name  string
		setup func(e *env)
		off   bool
	}{
		{"timeout 0 disables", func(e *env) { e.lease("a", gpu.SuspendNone, idleTimeout(0)) }, false},
		{"busy lease", func(e *env) {
			e.lease("a", gpu.SuspendNone, idleTimeout(60))
			if _, err := e.m.BeginJob(context.Background(), "a"); err != nil {
				e.t.Fatal(err)
			}
		}, false},
		{"already frozen", func(e *env) { e.lease("a", gpu.SuspendNone, idleTimeout(60)); e.pause("a") }, false},
		{"already spilled", func(e *env) { e.lease("a", gpu.SuspendTransparent, idleTimeout(60)); e.pause("a") }, false},
		{"kill switch", func(e *env) { e.lease("a", gpu.SuspendNone, idleTimeout(60)) }, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			p := &pausePath{}
			e := newEnv(t, false, p.opt(), withConfig(func(cfg *gpu.Config) { cfg.IdleAutoPause = !c.off }))
			c.setup(e)
			e.clock.Advance(24 * time.Hour)
			if r := e.m.Tick(context.Background()); len(r.AutoPaused) != 0 || p.count() != 0 {
				t.Fatalf("tick = %+v, pause calls %d", r, p.count())
			}
		})
	}
}

// TestIdleClockRestartsOnActivity: the last activity is the create, a
// job's end, a resume or a thaw.
func TestIdleClockRestartsOnActivity(t *testing.T) {
	cases := []struct {
		name     string
		mode     gpu.SuspendMode
		activity func(e *env)
	}{
		{"job end", gpu.SuspendNone, func(e *env) { e.job("a", 10*time.Second) }},
		{"thaw", gpu.SuspendNone, func(e *env) { e.pause("a"); e.clock.Advance(10 * time.Second); e.resume("a") }},
		{"resume", gpu.SuspendTransparent, func(e *env) { e.pause("a"); e.clock.Advance(10 * time.Second); e.resume("a") }},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			e := newEnv(t, false)
			e.lease("a", c.mode, idleTimeout(60))
			e.clock.Advance(50 * time.Second)
			c.activity(e)
			at := e.clock.Now()
			if st := e.status("a"); !st.LastActivityAt.Equal(at) {
				t.Fatalf("last activity %v, want %v", st.LastActivityAt, at)
			}
			e.clock.Advance(59 * time.Second)
			if r := e.m.Tick(context.Background()); len(r.AutoPaused) != 0 {
				t.Fatal("paused before the timeout from the last activity")
			}
			e.clock.Advance(time.Second)
			if r := e.m.Tick(context.Background()); len(r.AutoPaused) != 1 {
				t.Fatal("not paused at the timeout from the last activity")
			}
		})
	}
}
