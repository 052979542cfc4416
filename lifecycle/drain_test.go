package lifecycle_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/lifecycle"
)

// blockingExec makes the fake's exec announce itself on started and wait
// for release (at the test's end if nothing releases it sooner), then
// write "out" to its stdout and return fail; returned is closed once it
// has.
type blockingExec struct {
	started, returned chan struct{}
	release           func()
}

func newBlockingExec(t *testing.T, e *env, fail error) *blockingExec {
	released := make(chan struct{})
	var once sync.Once
	b := &blockingExec{started: make(chan struct{}), returned: make(chan struct{}),
		release: func() { once.Do(func() { close(released) }) }}
	e.host.ExecFunc = func(ctx context.Context, id string, req torpor.ExecRequest) (torpor.ExecResult, error) {
		close(b.started)
		<-released
		defer close(b.returned)
		if req.Stdout != nil {
			io.WriteString(req.Stdout, "out")
		}
		return torpor.ExecResult{}, fail
	}
	t.Cleanup(b.release)
	return b
}

// execAsync runs an exec in the background; its outcome comes on the
// channel.
func execAsync(e *env, id string, stdout io.Writer) <-chan error {
	ch := make(chan error, 1)
	go func() {
		_, err := e.eng.Exec(ctx, "acme", id, torpor.ExecRequest{Cmd: []string{"build"}, Stdout: stdout})
		ch <- err
	}()
	return ch
}

func verbAsync(fn func() (*torpor.Sandbox, error)) <-chan error {
	ch := make(chan error, 1)
	go func() { _, err := fn(); ch <- err }()
	return ch
}

// await returns what ch brings, failing the test when nothing comes
// within a few seconds: the call hangs.
func await(t *testing.T, ch <-chan error, what string) error {
	t.Helper()
	select {
	case err := <-ch:
		return err
	case <-time.After(5 * time.Second):
		t.Fatalf("%s did not return", what)
		return nil
	}
}

// notYet fails the test when ch brings something within a moment.
func notYet(t *testing.T, ch <-chan error, what string) {
	t.Helper()
	select {
	case err := <-ch:
		t.Fatalf("%s returned (%v) while an exec was in flight", what, err)
	case <-time.After(50 * time.Millisecond):
	}
}

// awaitDrain waits until a drain has armed its timer on the engine's
// clock (one more timer than base).
func awaitDrain(t *testing.T, e *env, base int) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); e.clock.Pending() <= base; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no drain is waiting")
		}
	}
}

// wantConflict checks that err is a conflict carrying one of states.
func wantConflict(t *testing.T, err error, states ...torpor.State) *torpor.Error {
	t.Helper()
	var te *torpor.Error
	if !errors.As(err, &te) || te.Code != torpor.EConflict {
		t.Fatalf("got %v, want a conflict", err)
	}
	for _, s := range states {
		if te.State == s {
			return te
		}
	}
	t.Fatalf("conflict with state %q, want one of %v: %v", te.State, states, err)
	return nil
}

// TestPauseWaitsForAnExecInFlight: a pause that comes while an exec runs
// waits for it; the exec succeeds with its output, then the sandbox is
// paused.
func TestPauseWaitsForAnExecInFlight(t *testing.T) {
	e := newEnv(t)
	ex := newBlockingExec(t, e, nil)
	sb := e.create(torpor.CreateRequest{})
	var out bytes.Buffer
	execDone := execAsync(e, sb.ID, &out)
	<-ex.started
	paused := verbAsync(func() (*torpor.Sandbox, error) { return e.eng.Pause(ctx, "acme", sb.ID, "") })
	notYet(t, paused, "the pause")
	if st := e.host.State(sb.ID); st != torpor.InstanceRunning {
		t.Fatalf("instance %s under an exec in flight", st)
	}
	ex.release()
	if err := await(t, execDone, "the exec"); err != nil || out.String() != "out" {
		t.Fatalf("exec: %v, stdout %q", err, out.String())
	}
	if err := await(t, paused, "the pause"); err != nil {
		t.Fatal(err)
	}
	if got := e.get(sb.ID); got.State != torpor.StatePaused || e.host.State(sb.ID) != torpor.InstanceFrozen {
		t.Fatalf("after the pause: %s, instance %s", got.State, e.host.State(sb.ID))
	}
}

// TestExecPastTheDrainTimeoutIsFrozenAndAnswered: an exec that outlasts
// the drain timeout is frozen with the sandbox, and its request is
// answered at once with a conflict saying the sandbox is paused; the
// command's later output goes nowhere.
func TestExecPastTheDrainTimeoutIsFrozenAndAnswered(t *testing.T) {
	e := newEnv(t)
	ex := newBlockingExec(t, e, nil)
	sb := e.create(torpor.CreateRequest{})
	var out bytes.Buffer
	var outMu sync.Mutex
	execDone := execAsync(e, sb.ID, lockedWriter{&outMu, &out})
	<-ex.started
	base := e.clock.Pending()
	before := e.clock.Now()
	paused := verbAsync(func() (*torpor.Sandbox, error) { return e.eng.Pause(ctx, "acme", sb.ID, "") })
	awaitDrain(t, e, base)
	notYet(t, paused, "the pause")
	e.clock.Advance(lifecycle.DefaultDrainTimeout)
	if err := await(t, paused, "the pause"); err != nil {
		t.Fatal(err)
	}
	got := e.get(sb.ID)
	if got.State != torpor.StatePaused || e.host.State(sb.ID) != torpor.InstanceFrozen || got.StateSince.Sub(before) < lifecycle.DefaultDrainTimeout {
		t.Fatalf("after the pause: %s since %v (asked at %v), instance %s", got.State, got.StateSince, before, e.host.State(sb.ID))
	}
	te := wantConflict(t, await(t, execDone, "the exec"), torpor.StatePaused)
	if te.Reason != "paused" || !strings.Contains(te.Message, "goes on when the sandbox resumes") {
		t.Fatalf("conflict %+v", te)
	}
	// The command goes on; what it writes no longer reaches the caller.
	ex.release()
	<-ex.returned
	outMu.Lock()
	defer outMu.Unlock()
	if out.Len() != 0 {
		t.Fatalf("a detached command wrote %q to the caller", out.String())
	}
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// TestFreezeThatNeverReturnsFailsThePause: a freeze that does not come
// back within its deadline fails the pause cleanly: the sandbox runs,
// pause_failed says why, and the next verb is not held up. When the
// freeze does come back at last, the instance is thawed again.
func TestFreezeThatNeverReturnsFailsThePause(t *testing.T) {
	var logs syncLog
	e := newEnv(t, func(c *lifecycle.Config) {
		c.Deadlines.Freeze = 50 * time.Millisecond
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	sb := e.create(torpor.CreateRequest{})
	release := make(chan struct{})
	var once sync.Once
	var stuck atomic.Bool
	stuck.Store(true)
	e.host.FreezeHook = func(context.Context, string) error {
		if stuck.Swap(false) {
			<-release // ignores its context, as a hung runtime would
		}
		return nil
	}
	t.Cleanup(func() { once.Do(func() { close(release) }) })
	err := await(t, verbAsync(func() (*torpor.Sandbox, error) { return e.eng.Pause(ctx, "acme", sb.ID, "") }), "the pause")
	var te *torpor.Error
	if !errors.As(err, &te) || te.Code != torpor.EUnavailable || te.RetryAfter == 0 || !strings.Contains(te.Message, "the freeze did not finish within 50ms") {
		t.Fatalf("pause: %v, want unavailable saying the freeze did not finish", err)
	}
	if got := e.get(sb.ID); got.State != torpor.StateRunning || e.host.State(sb.ID) != torpor.InstanceRunning {
		t.Fatalf("after the failed pause: %s, instance %s", got.State, e.host.State(sb.ID))
	}
	evs, err := e.eng.Events(ctx, "acme", torpor.EventFilter{SandboxID: sb.ID})
	if err != nil {
		t.Fatal(err)
	}
	var reason string
	for _, ev := range evs {
		if ev.Type == "sandbox.pause_failed" {
			reason = ev.Attrs["error"]
		}
	}
	if !strings.Contains(reason, "the freeze did not finish within 50ms") {
		t.Fatalf("pause_failed says %q", reason)
	}
	if err := await(t, execAsync(e, sb.ID, nil), "an exec after the failed pause"); err != nil {
		t.Fatal(err)
	}
	// The hung freeze comes back after all, freezing the instance; the
	// engine, which recorded it running, thaws it.
	once.Do(func() { close(release) })
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(logs.String(), "came back late"); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the late freeze was not noticed:\n%s", logs.String())
		}
	}
	for deadline := time.Now().Add(5 * time.Second); e.host.State(sb.ID) != torpor.InstanceRunning; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the instance a late freeze froze stays %s", e.host.State(sb.ID))
		}
	}
	if got, err := e.eng.Pause(ctx, "acme", sb.ID, ""); err != nil || got.State != torpor.StatePaused {
		t.Fatalf("pause after all: %v %v", got, err)
	}
}

type syncLog struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *syncLog) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *syncLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// errDidNotReport is what runc answers for an exec whose instance was
// frozen or stopped under it.
var errDidNotReport = errors.New("runc: exec: the command did not report (runc exit status 255)")

// TestExecFailingAfterAHibernateIsAConflict: an exec whose runtime call
// fails once a hibernation raced it is a conflict with the sandbox's
// state, not an internal error.
func TestExecFailingAfterAHibernateIsAConflict(t *testing.T) {
	e := newEnv(t)
	ex := newBlockingExec(t, e, errDidNotReport)
	sb := e.create(torpor.CreateRequest{})
	execDone := execAsync(e, sb.ID, nil)
	<-ex.started
	hibernated := verbAsync(func() (*torpor.Sandbox, error) { return e.eng.Hibernate(ctx, "acme", sb.ID) })
	for deadline := time.Now().Add(5 * time.Second); e.get(sb.ID).State != torpor.StateHibernated; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the hibernation did not finish")
		}
		e.clock.Advance(lifecycle.DefaultDrainTimeout)
	}
	if err := await(t, hibernated, "the hibernation"); err != nil {
		t.Fatal(err)
	}
	ex.release() // the command ends as its instance did
	wantConflict(t, await(t, execDone, "the exec"), torpor.StateHibernating, torpor.StateHibernated)
}

// TestExecFailingAsThePauseFreezesIsAConflict: an exec that the freeze
// makes fail (runc cannot run or report a command in a freezing
// instance) is a conflict with the sandbox's state, not an internal
// error.
func TestExecFailingAsThePauseFreezesIsAConflict(t *testing.T) {
	e := newEnv(t)
	ex := newBlockingExec(t, e, errDidNotReport)
	sb := e.create(torpor.CreateRequest{})
	execDone := execAsync(e, sb.ID, nil)
	<-ex.started
	execErr := errors.New("the exec did not return while the instance froze")
	e.host.FreezeHook = func(context.Context, string) error {
		ex.release()
		select {
		case execErr = <-execDone:
		case <-time.After(5 * time.Second):
		}
		return nil
	}
	base := e.clock.Pending()
	paused := verbAsync(func() (*torpor.Sandbox, error) { return e.eng.Pause(ctx, "acme", sb.ID, "") })
	awaitDrain(t, e, base)
	e.clock.Advance(lifecycle.DefaultDrainTimeout)
	if err := await(t, paused, "the pause"); err != nil {
		t.Fatal(err)
	}
	wantConflict(t, execErr, torpor.StatePausing)
}

// A pause by freeze stores no pausing state, yet while the freeze is under
// way the sandbox shows as pausing and the change is announced, so that
// the proxy stops sending requests into it (they wait for the pause and
// wake it instead).
func TestAFreezeUnderWayShowsAsPausing(t *testing.T) {
	e := newEnv(t)
	sb := e.create(torpor.CreateRequest{})
	inFreeze, release := make(chan struct{}), make(chan struct{})
	e.host.FreezeHook = func(context.Context, string) error {
		close(inFreeze)
		<-release
		return nil
	}
	changed := e.eng.EventsChanged()
	paused := verbAsync(func() (*torpor.Sandbox, error) { return e.eng.Pause(ctx, "acme", sb.ID, "") })
	<-inFreeze
	select {
	case <-changed:
	default:
		close(release)
		t.Fatal("the pause was not announced before the freeze")
	}
	got, err := e.eng.Lookup(ctx, sb.ID)
	if err != nil || got.State != torpor.StatePausing {
		close(release)
		t.Fatalf("during the freeze: %v, %v; want pausing", got, err)
	}
	close(release)
	if err := await(t, paused, "the pause"); err != nil {
		t.Fatal(err)
	}
	if got := e.get(sb.ID); got.State != torpor.StatePaused {
		t.Fatalf("after the pause: %s", got.State)
	}
}

// TestStopsWaitForAProxiedRequestUnderWay: a pause, hibernation or
// restart of a running sandbox waits for a proxied request the proxy let
// through (under way until its answer begins) before it stops the
// instance, so the request is not cut; past the drain timeout it goes on.
func TestStopsWaitForAProxiedRequestUnderWay(t *testing.T) {
	for _, v := range []struct {
		name string
		verb func(e *env, id string) (*torpor.Sandbox, error)
		want torpor.State
	}{
		{"pause", func(e *env, id string) (*torpor.Sandbox, error) { return e.eng.Pause(ctx, "acme", id, "") }, torpor.StatePaused},
		{"hibernate", func(e *env, id string) (*torpor.Sandbox, error) { return e.eng.Hibernate(ctx, "acme", id) }, torpor.StateHibernated},
		{"restart", func(e *env, id string) (*torpor.Sandbox, error) { return e.eng.Restart(ctx, "acme", id) }, torpor.StateRunning},
	} {
		t.Run(v.name, func(t *testing.T) {
			e := newEnv(t)
			sb := e.create(torpor.CreateRequest{})
			handle := e.get(sb.ID).Handle
			e.eng.RequestStarted(sb.ID)
			done := verbAsync(func() (*torpor.Sandbox, error) { return v.verb(e, sb.ID) })
			notYet(t, done, "the "+v.name)
			if st := e.host.State(sb.ID); st != torpor.InstanceRunning {
				t.Fatalf("instance %s under a proxied request", st)
			}
			e.eng.RequestEnded(sb.ID)
			if err := await(t, done, "the "+v.name); err != nil {
				t.Fatal(err)
			}
			got := e.get(sb.ID)
			if got.State != v.want || (v.name == "restart" && got.Handle == handle) {
				t.Fatalf("after the %s: %s (handle %s, was %s)", v.name, got.State, got.Handle, handle)
			}

			// A request that never gets its answer holds it no longer than
			// the drain timeout.
			if v.name != "pause" {
				return
			}
			if _, err := e.eng.Start(ctx, "acme", sb.ID); err != nil {
				t.Fatal(err)
			}
			base := e.clock.Pending()
			e.eng.RequestStarted(sb.ID)
			done = verbAsync(func() (*torpor.Sandbox, error) { return v.verb(e, sb.ID) })
			awaitDrain(t, e, base)
			e.clock.Advance(lifecycle.DefaultDrainTimeout)
			if err := await(t, done, "the pause past the drain timeout"); err != nil {
				t.Fatal(err)
			}
			e.eng.RequestEnded(sb.ID)
		})
	}
}
