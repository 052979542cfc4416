package lifecycle_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/lifecycle"
)

// writeCounter counts the sandbox writes that reach the store.
type writeCounter struct {
	torpor.Store
	writes *atomic.Int64
}

func (w writeCounter) UpdateSandboxUsage(ctx context.Context, sb *torpor.Sandbox, usage []torpor.UsageRecord, events ...torpor.Event) error {
	w.writes.Add(1)
	return w.Store.UpdateSandboxUsage(ctx, sb, usage, events...)
}

// TestExecActivityIsNotAWrite: an exec's activity is noted in memory, not
// stored with a write of its own: fifty execs at one instant cost at most
// the one write of a traffic flush (none before the change: one each).
// The activity shows at once all the same, in the sandbox's record and its
// schedule, and the idle pause waits for it.
func TestExecActivityIsNotAWrite(t *testing.T) {
	var writes atomic.Int64
	e := newEnv(t, func(c *lifecycle.Config) { c.Store = writeCounter{c.Store, &writes} })
	sb := e.create(torpor.CreateRequest{PolicyRequest: torpor.PolicyRequest{
		LifecyclePolicy: policy(torpor.LifecyclePolicy{PauseAfterIdleSeconds: torpor.Seconds(60)})}})
	e.clock.Advance(50 * time.Second)
	before := writes.Load()
	for i := 0; i < 50; i++ {
		if _, err := e.eng.Exec(ctx, "acme", sb.ID, torpor.ExecRequest{Cmd: []string{"true"}}); err != nil {
			t.Fatal(err)
		}
	}
	if n := writes.Load() - before; n > 1 {
		t.Errorf("50 execs wrote the sandbox %d times, want at most the one of a traffic flush", n)
	}
	now := e.clock.Now()
	if got := e.get(sb.ID); !got.LastActivityAt.Equal(now) || got.PauseAt == nil || !got.PauseAt.Equal(now.Add(time.Minute)) {
		t.Fatalf("after the execs: last activity %v, pause at %v; want %v and a minute later", got.LastActivityAt, got.PauseAt, now)
	}
	// The deadline the store knew of passes: the sweep finds the activity
	// and waits for the one after it.
	e.clock.Advance(10 * time.Second)
	awaitReschedule(t, e, sb.ID)
	if got := e.get(sb.ID); got.State != torpor.StateRunning {
		t.Fatalf("paused ten seconds after an exec with a minute's idle timeout: %s", got.State)
	}
	e.clock.Advance(50 * time.Second)
	if got := settle(e, sb.ID, torpor.StatePaused); got.State != torpor.StatePaused {
		t.Fatalf("not paused a minute after the execs: %s", got.State)
	}
}

// TestRestartCountsAsActivity: a daemon's start counts as activity for
// every sandbox it finds running, so that activity noted in memory and
// lost with the daemon can put an idle pause off but never bring one
// early.
func TestRestartCountsAsActivity(t *testing.T) {
	e := newEnv(t)
	sb := e.create(torpor.CreateRequest{PolicyRequest: torpor.PolicyRequest{
		LifecyclePolicy: policy(torpor.LifecyclePolicy{PauseAfterIdleSeconds: torpor.Seconds(60)})}})
	e.clock.Advance(50 * time.Second)
	e.restart()
	now := e.clock.Now()
	stored, err := e.store.GetSandbox(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !stored.LastActivityAt.Equal(now) {
		t.Fatalf("stored last activity after a restart %v, want the restart's %v", stored.LastActivityAt, now)
	}
	e.clock.Advance(59 * time.Second)
	if got := settle(e, sb.ID, torpor.StateRunning); got.State != torpor.StateRunning {
		t.Fatalf("paused 59 s after a restart: %s", got.State)
	}
	e.clock.Advance(time.Second)
	if got := settle(e, sb.ID, torpor.StatePaused); got.State != torpor.StatePaused {
		t.Fatalf("not paused a minute after the restart: %s", got.State)
	}
}
