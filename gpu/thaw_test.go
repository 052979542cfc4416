package gpu_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/gpu"
	"github.com/torpor-dev/torpor/gpu/sim"
)

// gatedHost holds the first Thaw after arm() until open().
type gatedHost struct {
	*sim.Host
	mu      sync.Mutex
	armed   bool
	thaws   int
	entered chan struct{}
	gate    chan struct{}
}

func (g *gatedHost) arm() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.armed, g.entered, g.gate = true, make(chan struct{}), make(chan struct{})
}

func (g *gatedHost) open() { close(g.gate) }

func (g *gatedHost) Thaw(ctx context.Context, group string) error {
	g.mu.Lock()
	armed := g.armed
	g.armed = false
	g.thaws++
	entered, gate := g.entered, g.gate
	g.mu.Unlock()
	if armed {
		close(entered)
		<-gate
	}
	return g.Host.Thaw(ctx, group)
}

func (g *gatedHost) count() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.thaws
}

func newGatedEnv(t *testing.T, hardCap bool) (*env, *gatedHost) {
	var g *gatedHost
	e := newEnv(t, hardCap, withHost(func(s *sim.Host) gpu.Host {
		g = &gatedHost{Host: s}
		return g
	}))
	return e, g
}

// settle gives goroutines started just before a chance to reach the
// thaw claim's wait. Nothing is asserted on time: every outcome checked
// holds whether they waited for the commit or came after it.
func settle() { time.Sleep(20 * time.Millisecond) }

type result struct {
	st  gpu.Status
	err error
}

// TestOneThawAtATime: a second resume that finds the thaw in flight waits
// for its commit instead of thawing twice.
func TestOneThawAtATime(t *testing.T) {
	e, g := newGatedEnv(t, false)
	e.lease("a", gpu.SuspendNone)
	e.pause("a")
	g.arm()
	first := make(chan result, 1)
	go func() { st, err := e.m.Resume(context.Background(), "a"); first <- result{st, err} }()
	<-g.entered
	if st := e.status("a"); st.Transition != "thawing" {
		t.Fatalf("transition = %q while the thaw is in flight, want thawing", st.Transition)
	}
	second := make(chan result, 1)
	go func() { st, err := e.m.Resume(context.Background(), "a"); second <- result{st, err} }()
	settle()
	select {
	case r := <-second:
		t.Fatalf("the second resume returned (%+v) before the thaw committed", r)
	default:
	}
	g.open()
	for _, ch := range []chan result{first, second} {
		r := <-ch
		if r.err != nil || r.st.Frozen || r.st.Phase != gpu.PhaseResident {
			t.Fatalf("resume = %+v, %v", r.st, r.err)
		}
	}
	if n := g.count(); n != 1 {
		t.Fatalf("%d thaws, want 1", n)
	}
}

// TestSecondExecDuringThawIsRefusedOnceTheFirstJobHoldsTheLease: after
// waiting for the first exec's thaw, a second exec finds the first job
// holding the lease and is refused.
func TestSecondExecDuringThawIsRefusedOnceTheFirstJobHoldsTheLease(t *testing.T) {
	e, g := newGatedEnv(t, false)
	e.lease("a", gpu.SuspendNone)
	e.pause("a")
	g.arm()
	type jobResult struct {
		j   *gpu.Job
		err error
	}
	first := make(chan jobResult, 1)
	go func() { j, err := e.m.BeginJob(context.Background(), "a"); first <- jobResult{j, err} }()
	<-g.entered
	second := make(chan error, 1)
	go func() { _, err := e.m.BeginJob(context.Background(), "a"); second <- err }()
	settle()
	g.open()
	r := <-first
	if r.err != nil {
		t.Fatal(r.err)
	}
	wantCode(t, <-second, torpor.EConflict, "busy")
	if g.count() != 1 {
		t.Fatalf("%d thaws, want 1", g.count())
	}
	_ = r.j.End(context.Background())
}

// TestPauseDuringThawForAJobIsRefusedLikeABusyLease: a pause that waited
// for an exec's thaw finds the job in flight and is refused as busy.
func TestPauseDuringThawForAJobIsRefusedLikeABusyLease(t *testing.T) {
	e, g := newGatedEnv(t, true)
	e.lease("a", gpu.SuspendTransparent)
	e.child("a", 1024)
	e.pause("a") // freeze-only
	g.arm()
	first := make(chan error, 1)
	var job *gpu.Job
	go func() {
		var err error
		job, err = e.m.BeginJob(context.Background(), "a")
		first <- err
	}()
	<-g.entered
	pause := make(chan error, 1)
	go func() { _, err := e.m.Pause(context.Background(), "a"); pause <- err }()
	settle()
	g.open()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	wantCode(t, <-pause, torpor.EConflict, "busy")
	if st := e.status("a"); st.Frozen || !st.Busy {
		t.Fatalf("status = %+v, want running with the job", st)
	}
	_ = job.End(context.Background())
}

// TestResumeOfLeaseDestroyedMidThawErrors: a resume whose lease is
// destroyed while it thaws fails instead of committing thawed state on
// the dead record, and so does a resume that waited for it.
func TestResumeOfLeaseDestroyedMidThawErrors(t *testing.T) {
	e, g := newGatedEnv(t, false)
	w := e.lease("a", gpu.SuspendNone)
	e.pause("a")
	g.arm()
	first := make(chan error, 1)
	go func() { _, err := e.m.Resume(context.Background(), "a"); first <- err }()
	<-g.entered
	second := make(chan error, 1)
	go func() { _, err := e.m.Resume(context.Background(), "a"); second <- err }()
	settle()
	e.clock.Advance(10 * time.Second)
	dst, err := e.m.Destroy(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	g.open()
	wantCode(t, <-first, torpor.EGone, "destroyed")
	wantCode(t, <-second, torpor.EGone, "destroyed")
	st := e.status("a")
	if st.Phase != gpu.PhaseDestroyed || st.Frozen || st.HoldsSeat {
		t.Fatalf("status = %+v, want destroyed", st)
	}
	e.clock.Advance(time.Hour)
	if got := e.status("a").Meters; got.ResidentS != dst.Meters.ResidentS || got.BilledS != dst.Meters.BilledS {
		t.Fatalf("meters accrue on the destroyed lease: %+v then %+v", dst.Meters, got)
	}
	if e.sim.Proc(w).Alive {
		t.Fatal("the worker survived the destroy")
	}
}
