package lifecycle_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/clocktest"
	"github.com/torpor-dev/torpor/gpu/gpulease"
	"github.com/torpor-dev/torpor/lifecycle"
	"github.com/torpor-dev/torpor/runtime/fake"
	"github.com/torpor-dev/torpor/store/postgres"
	"github.com/torpor-dev/torpor/store/postgres/pgtest"
	"github.com/torpor-dev/torpor/store/sqlite"
)

// crash is what a failpoint panics with to model the daemon dying there.
type crash struct{ at string }

// envStore is what the tests use of a store: the engine's, its secrets,
// its GPU rows and flags, and Close, which the SQLite and PostgreSQL
// stores both have.
type envStore interface {
	torpor.Store
	torpor.SecretStore
	KeyFlags(ctx context.Context, keyID string) ([]gpulease.Flag, error)
	ListGPUUsage(ctx context.Context, leaseID string) ([]gpulease.UsageRow, error)
	Close() error
}

type env struct {
	t     *testing.T
	store envStore
	// reopen, when set, opens the store anew at each restart after closing
	// the old handle, as a daemon that died takes its connections and file
	// handles with it (the crash tests, on each store).
	reopen func() (envStore, error)
	host   *fake.Host
	clock  *clocktest.Clock
	eng    *lifecycle.Engine
	// crashAt makes the engine "die" at that failpoint.
	crashAt string
	opts    []func(*lifecycle.Config)
	// archives is the directory of the engine's archive store.
	archives string
}

func newEnv(t *testing.T, opts ...func(*lifecycle.Config)) *env {
	t.Helper()
	st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "torpor.db"))
	if err != nil {
		t.Fatal(err)
	}
	return newEnvWith(t, st, nil, opts...)
}

// storeKinds are the stores the crash tests run against.
var storeKinds = []string{"sqlite", "postgres"}

// eachStore runs fn as a subtest per store kind. The PostgreSQL one skips,
// naming what is missing, where PostgreSQL 15 is not installed (pgtest).
func eachStore(t *testing.T, fn func(t *testing.T, kind string)) {
	for _, kind := range storeKinds {
		t.Run(kind, func(t *testing.T) { fn(t, kind) })
	}
}

// newEnvOn is newEnv on a store of the kind given: "sqlite", a file of
// the test's own, or "postgres", a database of the test's own on the
// test binary's PostgreSQL server (skipping the test where there is
// none). Each restart closes the store and opens it again, as a daemon
// restarted after a crash does.
func newEnvOn(t *testing.T, kind string, opts ...func(*lifecycle.Config)) *env {
	t.Helper()
	var open func() (envStore, error)
	switch kind {
	case "sqlite":
		path := filepath.Join(t.TempDir(), "torpor.db")
		open = func() (envStore, error) { return sqlite.Open(context.Background(), path) }
	case "postgres":
		// As the daemon opens it (daemon/store.go): the database is its own.
		o := postgres.Options{URL: pgtest.NewDatabase(t), KeyDir: t.TempDir(), Exclusive: true}
		open = func() (envStore, error) { return postgres.Open(context.Background(), o) }
	default:
		t.Fatalf("no store kind %q", kind)
	}
	st, err := open()
	if err != nil {
		t.Fatal(err)
	}
	return newEnvWith(t, st, open, opts...)
}

func newEnvWith(t *testing.T, st envStore, reopen func() (envStore, error), opts ...func(*lifecycle.Config)) *env {
	t.Helper()
	ctx := context.Background()
	t.Cleanup(func() { st.Close() })
	if err := st.PutTemplate(ctx, torpor.Template{Name: "base", RootFS: "/nonexistent", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	e := &env{t: t, store: st, reopen: reopen, host: fake.NewHost(), clock: clocktest.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)), opts: opts,
		archives: t.TempDir()}
	e.restart()
	return e
}

// restart models a daemon restart: a new engine over the same store and host.
func (e *env) restart() {
	e.t.Helper()
	if e.eng != nil {
		e.eng.Close()
	}
	if e.reopen != nil && e.eng != nil {
		e.store.Close()
		st, err := e.reopen()
		if err != nil {
			e.t.Fatalf("reopening the store: %v", err)
		}
		e.store = st
		e.t.Cleanup(func() { st.Close() })
	}
	cfg := lifecycle.Config{
		Store:    e.store,
		Runtimes: []torpor.Runtime{fake.New(e.host)},
		Clock:    e.clock,
		Failpoint: func(name string) {
			if name == e.crashAt {
				e.crashAt = ""
				panic(crash{name})
			}
		},
	}
	cfg.Archives = e.archiveStore()
	for _, o := range e.opts {
		o(&cfg)
	}
	eng, err := lifecycle.New(cfg)
	if err != nil {
		e.t.Fatal(err)
	}
	if err := eng.Recover(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	e.eng = eng
	e.t.Cleanup(eng.Close)
}

// crashing runs fn, expecting it to die at failpoint at.
func (e *env) crashing(at string, fn func()) {
	e.t.Helper()
	e.crashAt = at
	defer func() {
		r := recover()
		if c, ok := r.(crash); !ok || c.at != at {
			e.t.Fatalf("expected a crash at %s, got %v", at, r)
		}
	}()
	fn()
}

func (e *env) create(req torpor.CreateRequest) *torpor.Sandbox {
	e.t.Helper()
	if req.Template == "" {
		req.Template = "base"
	}
	sb, err := e.eng.Create(context.Background(), "acme", req)
	if err != nil {
		e.t.Fatal(err)
	}
	return sb
}

func (e *env) get(id string) *torpor.Sandbox {
	e.t.Helper()
	sb, err := e.eng.Get(context.Background(), "acme", id)
	if err != nil {
		e.t.Fatal(err)
	}
	return sb
}

var ctx = context.Background()

func TestCreateBootsAndRecordsEvents(t *testing.T) {
	e := newEnv(t)
	sb := e.create(torpor.CreateRequest{
		Metadata: map[string]string{"team": "ml"},
		Env:      map[string]string{"TOKEN": "s3cret"},
		Runtime:  torpor.RuntimeConfig{Setup: []string{"mkdir -p /data"}, Entrypoint: []string{"/bin/server"}},
	})
	if sb.State != torpor.StateRunning || sb.Boots != 1 || sb.Runtime.Kind != "fake" {
		t.Fatalf("got %+v", sb)
	}
	if sb.Resources != torpor.DefaultLimits.Default {
		t.Fatalf("default resources not applied: %+v", sb.Resources)
	}
	spec := e.host.Spec(sb.ID)
	if spec.Env["TOKEN"] != "s3cret" || spec.Setup[0] != "mkdir -p /data" || spec.Entrypoint[0] != "/bin/server" {
		t.Fatalf("boot spec %+v", spec)
	}
	evs, err := e.eng.Events(ctx, "acme", torpor.EventFilter{SandboxID: sb.ID})
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) != 2 || evs[0].Type != torpor.EventCreated || evs[1].Type != torpor.EventStarted {
		t.Fatalf("events %+v", evs)
	}
}

func TestCreateRejectsBadInputWithoutSideEffects(t *testing.T) {
	e := newEnv(t)
	cases := []struct {
		name  string
		req   torpor.CreateRequest
		param string
	}{
		{"unknown template", torpor.CreateRequest{Template: "nope"}, "template"},
		{"negative memory", torpor.CreateRequest{Template: "base", Resources: &torpor.Resources{MemoryMiB: -1}}, "resources.memory_mib"},
		{"huge cpus", torpor.CreateRequest{Template: "base", Resources: &torpor.Resources{VCPUs: 1e9}}, "resources.vcpus"},
		{"unknown runtime", torpor.CreateRequest{Template: "base", Runtime: torpor.RuntimeConfig{Kind: "xen"}}, "runtime.kind"},
		{"bad env name", torpor.CreateRequest{Template: "base", Env: map[string]string{"A=B": "x"}}, "env"},
		{"empty entrypoint program", torpor.CreateRequest{Template: "base", Runtime: torpor.RuntimeConfig{Entrypoint: []string{""}}}, "runtime.entrypoint"},
		{"blank setup", torpor.CreateRequest{Template: "base", Runtime: torpor.RuntimeConfig{Setup: []string{"  "}}}, "runtime.setup[0]"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := e.eng.Create(ctx, "acme", c.req)
			var te *torpor.Error
			if !errors.As(err, &te) || te.Code != torpor.EInvalid || te.Param != c.param {
				t.Fatalf("got %v, want invalid_argument on %s", err, c.param)
			}
		})
	}
	all, _ := e.eng.List(ctx, "acme", torpor.SandboxFilter{IncludeTerminated: true})
	if len(all) != 0 {
		t.Fatalf("bad requests left %d sandboxes", len(all))
	}
}

// TestVerbRules is the table of what each verb does from each state.
func TestVerbRules(t *testing.T) {
	type verb func(e *env, id string) (*torpor.Sandbox, error)
	verbs := map[string]verb{
		"pause":     func(e *env, id string) (*torpor.Sandbox, error) { return e.eng.Pause(ctx, "acme", id, "") },
		"start":     func(e *env, id string) (*torpor.Sandbox, error) { return e.eng.Start(ctx, "acme", id) },
		"hibernate": func(e *env, id string) (*torpor.Sandbox, error) { return e.eng.Hibernate(ctx, "acme", id) },
		"restart":   func(e *env, id string) (*torpor.Sandbox, error) { return e.eng.Restart(ctx, "acme", id) },
		"touch":     func(e *env, id string) (*torpor.Sandbox, error) { return e.eng.Touch(ctx, "acme", id) },
		"delete":    func(e *env, id string) (*torpor.Sandbox, error) { return e.eng.Delete(ctx, "acme", id) },
	}
	// into brings a new sandbox to a state.
	into := map[torpor.State]func(e *env, id string){
		torpor.StateRunning:    func(e *env, id string) {},
		torpor.StatePaused:     func(e *env, id string) { must(e.eng.Pause(ctx, "acme", id, "")) },
		torpor.StateHibernated: func(e *env, id string) { must(e.eng.Hibernate(ctx, "acme", id)) },
		torpor.StateTerminated: func(e *env, id string) { must(e.eng.Delete(ctx, "acme", id)) },
		torpor.StateFailed: func(e *env, id string) {
			e.host.Exit(id, &torpor.Failure{Code: torpor.FailureEntrypoint, Message: "exit 1"})
			waitState(e, id, torpor.StateFailed)
		},
	}
	cases := []struct {
		from     torpor.State
		verb     string
		want     torpor.State     // state after, when it succeeds
		wantErr  torpor.ErrorCode // or the error
		instance torpor.InstanceState
	}{
		{torpor.StateRunning, "pause", torpor.StatePaused, "", torpor.InstanceFrozen},
		{torpor.StateRunning, "start", torpor.StateRunning, "", torpor.InstanceRunning},
		{torpor.StateRunning, "hibernate", torpor.StateHibernated, "", torpor.InstanceMissing},
		{torpor.StateRunning, "restart", torpor.StateRunning, "", torpor.InstanceRunning},
		{torpor.StateRunning, "touch", torpor.StateRunning, "", torpor.InstanceRunning},
		{torpor.StateRunning, "delete", torpor.StateTerminated, "", torpor.InstanceMissing},
		{torpor.StatePaused, "pause", torpor.StatePaused, "", torpor.InstanceFrozen},
		{torpor.StatePaused, "start", torpor.StateRunning, "", torpor.InstanceRunning},
		{torpor.StatePaused, "hibernate", torpor.StateHibernated, "", torpor.InstanceMissing},
		{torpor.StatePaused, "restart", "", torpor.EConflict, torpor.InstanceFrozen},
		{torpor.StatePaused, "touch", torpor.StatePaused, "", torpor.InstanceFrozen},
		{torpor.StatePaused, "delete", torpor.StateTerminated, "", torpor.InstanceMissing},
		{torpor.StateHibernated, "pause", "", torpor.EConflict, torpor.InstanceMissing},
		{torpor.StateHibernated, "start", torpor.StateRunning, "", torpor.InstanceRunning},
		{torpor.StateHibernated, "hibernate", torpor.StateHibernated, "", torpor.InstanceMissing},
		{torpor.StateHibernated, "restart", "", torpor.EConflict, torpor.InstanceMissing},
		{torpor.StateHibernated, "delete", torpor.StateTerminated, "", torpor.InstanceMissing},
		{torpor.StateFailed, "pause", "", torpor.EConflict, torpor.InstanceStopped},
		{torpor.StateFailed, "start", torpor.StateRunning, "", torpor.InstanceRunning},
		{torpor.StateFailed, "delete", torpor.StateTerminated, "", torpor.InstanceMissing},
		{torpor.StateTerminated, "pause", "", torpor.EGone, torpor.InstanceMissing},
		{torpor.StateTerminated, "start", "", torpor.EGone, torpor.InstanceMissing},
		{torpor.StateTerminated, "touch", "", torpor.EGone, torpor.InstanceMissing},
		{torpor.StateTerminated, "delete", torpor.StateTerminated, "", torpor.InstanceMissing},
	}
	for _, c := range cases {
		t.Run(fmt.Sprintf("%s %s", c.verb, c.from), func(t *testing.T) {
			e := newEnv(t)
			id := e.create(torpor.CreateRequest{}).ID
			into[c.from](e, id)
			before := e.get(id)
			sb, err := verbs[c.verb](e, id)
			if c.wantErr != "" {
				var te *torpor.Error
				if !errors.As(err, &te) || te.Code != c.wantErr {
					t.Fatalf("got %v, want %s", err, c.wantErr)
				}
				if c.wantErr == torpor.EConflict && te.State != c.from {
					t.Fatalf("the conflict must name the state %s, got %q", c.from, te.State)
				}
				if after := e.get(id); after.State != before.State || after.Version != before.Version {
					t.Fatalf("a refused verb changed the sandbox: %s v%d -> %s v%d", before.State, before.Version, after.State, after.Version)
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				if sb.State != c.want || e.get(id).State != c.want {
					t.Fatalf("state %s, want %s", sb.State, c.want)
				}
			}
			if got := e.host.State(id); got != c.instance {
				t.Fatalf("instance %s, want %s", got, c.instance)
			}
		})
	}
}

func must(_ *torpor.Sandbox, err error) {
	if err != nil {
		panic(err)
	}
}

func waitState(e *env, id string, want torpor.State) *torpor.Sandbox {
	e.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		sb := e.get(id)
		if sb.State == want {
			return sb
		}
		if time.Now().After(deadline) {
			e.t.Fatalf("sandbox %s is %s, want %s", id, sb.State, want)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestHibernateThenStartBootsAgainOnTheSameDisk(t *testing.T) {
	e := newEnv(t)
	sb := e.create(torpor.CreateRequest{})
	must(e.eng.Hibernate(ctx, "acme", sb.ID))
	if !e.host.HasDisk(sb.ID) {
		t.Fatal("hibernate removed the disk")
	}
	e.clock.Advance(time.Hour)
	got, err := e.eng.Start(ctx, "acme", sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Boots != 2 || e.host.Boots(sb.ID) != 2 || !got.LastActivityAt.Equal(e.clock.Now()) {
		t.Fatalf("boots %d/%d, last activity %v", got.Boots, e.host.Boots(sb.ID), got.LastActivityAt)
	}
}

func TestEntrypointExitFailsTheSandbox(t *testing.T) {
	e := newEnv(t)
	sb := e.create(torpor.CreateRequest{Runtime: torpor.RuntimeConfig{Entrypoint: []string{"/bin/false"}}})
	code := 3
	e.host.Exit(sb.ID, &torpor.Failure{Code: torpor.FailureEntrypoint, Message: "exited with status 3", ExitCode: &code})
	got := waitState(e, sb.ID, torpor.StateFailed)
	if got.Failure == nil || got.Failure.Code != torpor.FailureEntrypoint || *got.Failure.ExitCode != 3 {
		t.Fatalf("failure %+v", got.Failure)
	}
}

func TestSetupFailureFailsTheCreate(t *testing.T) {
	e := newEnv(t)
	e.host.FailNext("boot", &torpor.Error{Code: torpor.EConflict, Reason: torpor.FailureSetup, Message: "setup command 1 exited with status 2"})
	sb := e.create(torpor.CreateRequest{Runtime: torpor.RuntimeConfig{Setup: []string{"exit 2"}}})
	if sb.State != torpor.StateFailed || sb.Failure.Code != torpor.FailureSetup {
		t.Fatalf("got %s %+v", sb.State, sb.Failure)
	}
}

func TestFailedFreezeRollsBackToRunning(t *testing.T) {
	e := newEnv(t)
	sb := e.create(torpor.CreateRequest{})
	e.host.FailNext("freeze", errors.New("EPERM"))
	if _, err := e.eng.Pause(ctx, "acme", sb.ID, ""); err == nil {
		t.Fatal("pause succeeded")
	}
	if got := e.get(sb.ID); got.State != torpor.StateRunning || e.host.State(sb.ID) != torpor.InstanceRunning {
		t.Fatalf("state %s, instance %s", got.State, e.host.State(sb.ID))
	}
}

func TestTenantsSeeOnlyTheirOwnSandboxes(t *testing.T) {
	e := newEnv(t)
	sb := e.create(torpor.CreateRequest{})
	for name, call := range map[string]func() error{
		"get":    func() error { _, err := e.eng.Get(ctx, "other", sb.ID); return err },
		"pause":  func() error { _, err := e.eng.Pause(ctx, "other", sb.ID, ""); return err },
		"delete": func() error { _, err := e.eng.Delete(ctx, "other", sb.ID); return err },
		"exec": func() error {
			_, err := e.eng.Exec(ctx, "other", sb.ID, torpor.ExecRequest{Cmd: []string{"true"}})
			return err
		},
	} {
		if err := call(); !torpor.IsCode(err, torpor.ENotFound) {
			t.Errorf("%s by another tenant: %v, want not_found", name, err)
		}
	}
	list, _ := e.eng.List(ctx, "other", torpor.SandboxFilter{})
	if len(list) != 0 {
		t.Fatalf("other tenant lists %d sandboxes", len(list))
	}
	if e.get(sb.ID).State != torpor.StateRunning {
		t.Fatal("another tenant changed the sandbox")
	}
}

func TestExecCountsAsActivityAndChecksInput(t *testing.T) {
	e := newEnv(t)
	sb := e.create(torpor.CreateRequest{})
	e.clock.Advance(time.Minute)
	if _, err := e.eng.Exec(ctx, "acme", sb.ID, torpor.ExecRequest{Cmd: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
	if got := e.get(sb.ID); !got.LastActivityAt.Equal(e.clock.Now()) {
		t.Fatalf("last activity %v, want %v", got.LastActivityAt, e.clock.Now())
	}
	_, err := e.eng.Exec(ctx, "acme", sb.ID, torpor.ExecRequest{Cmd: []string{"true"}, Cwd: "relative"})
	if !torpor.IsCode(err, torpor.EInvalid) {
		t.Fatalf("relative cwd: %v", err)
	}
}

// TestCrashMidTransitionReconciles kills the engine between persisting a
// transition's start and acting on the runtime, and between acting and
// persisting the end, for each verb; a new engine must reach a true state.
// A pause by freeze and a resume from one store nothing before the
// runtime acts, so a crash before their one write leaves the sandbox as
// it was recorded, its instance put back to match. It runs on each store
// (SQLite and PostgreSQL), the store reopened at each restart.
func TestCrashMidTransitionReconciles(t *testing.T) {
	cases := []struct {
		verb     string
		setup    func(e *env, id string)
		do       func(e *env, id string)
		point    string
		want     torpor.State
		instance torpor.InstanceState
	}{
		{"pause", nil, func(e *env, id string) { e.eng.Pause(ctx, "acme", id, "") }, "pausing.before-runtime", torpor.StateRunning, torpor.InstanceRunning},
		{"pause", nil, func(e *env, id string) { e.eng.Pause(ctx, "acme", id, "") }, "pausing.after-runtime", torpor.StateRunning, torpor.InstanceRunning},
		{"resume", func(e *env, id string) { must(e.eng.Pause(ctx, "acme", id, "")) }, func(e *env, id string) { e.eng.Start(ctx, "acme", id) }, "resuming.before-runtime", torpor.StatePaused, torpor.InstanceFrozen},
		{"resume", func(e *env, id string) { must(e.eng.Pause(ctx, "acme", id, "")) }, func(e *env, id string) { e.eng.Start(ctx, "acme", id) }, "resuming.after-runtime", torpor.StatePaused, torpor.InstanceFrozen},
		{"hibernate", nil, func(e *env, id string) { e.eng.Hibernate(ctx, "acme", id) }, "hibernating.before-runtime", torpor.StateHibernated, torpor.InstanceMissing},
		{"hibernate", nil, func(e *env, id string) { e.eng.Hibernate(ctx, "acme", id) }, "hibernating.after-runtime", torpor.StateHibernated, torpor.InstanceMissing},
		{"start", func(e *env, id string) { must(e.eng.Hibernate(ctx, "acme", id)) }, func(e *env, id string) { e.eng.Start(ctx, "acme", id) }, "starting.before-runtime", torpor.StateRunning, torpor.InstanceRunning},
		{"start", func(e *env, id string) { must(e.eng.Hibernate(ctx, "acme", id)) }, func(e *env, id string) { e.eng.Start(ctx, "acme", id) }, "starting.after-runtime", torpor.StateRunning, torpor.InstanceRunning},
		{"restart", nil, func(e *env, id string) { e.eng.Restart(ctx, "acme", id) }, "restarting.after-runtime", torpor.StateRunning, torpor.InstanceRunning},
		{"delete", nil, func(e *env, id string) { e.eng.Delete(ctx, "acme", id) }, "terminating.before-runtime", torpor.StateTerminated, torpor.InstanceMissing},
		{"delete", nil, func(e *env, id string) { e.eng.Delete(ctx, "acme", id) }, "terminating.after-runtime", torpor.StateTerminated, torpor.InstanceMissing},
	}
	eachStore(t, func(t *testing.T, kind string) {
		for _, c := range cases {
			t.Run(c.point, func(t *testing.T) {
				e := newEnvOn(t, kind)
				id := e.create(torpor.CreateRequest{}).ID
				if c.setup != nil {
					c.setup(e, id)
				}
				e.crashing(c.point, func() { c.do(e, id) })
				e.restart()
				got := e.get(id)
				if got.State != c.want {
					t.Fatalf("after restart: %s, want %s", got.State, c.want)
				}
				if inst := e.host.State(id); inst != c.instance {
					t.Fatalf("instance %s, want %s", inst, c.instance)
				}
				if c.want == torpor.StateTerminated && e.host.HasDisk(id) {
					t.Fatal("the disk of a deleted sandbox was left behind")
				}
			})
		}
	})
}

func TestCrashDuringCreateFinishesTheBoot(t *testing.T) {
	e := newEnv(t)
	var id string
	e.host.BootHook = func(_ context.Context, spec torpor.BootSpec) error { id = spec.SandboxID; return nil }
	e.crashing("starting.after-runtime", func() { e.create(torpor.CreateRequest{}) })
	e.restart()
	if got := e.get(id); got.State != torpor.StateRunning || e.host.State(id) != torpor.InstanceRunning {
		t.Fatalf("state %s instance %s", got.State, e.host.State(id))
	}
}

func TestRecoverAdoptsRemovesLeftoversAndHandlesLostInstances(t *testing.T) {
	e := newEnv(t)
	running := e.create(torpor.CreateRequest{})
	paused := e.create(torpor.CreateRequest{})
	must(e.eng.Pause(ctx, "acme", paused.ID, ""))
	lostRunning := e.create(torpor.CreateRequest{})
	lostPaused := e.create(torpor.CreateRequest{})
	must(e.eng.Pause(ctx, "acme", lostPaused.ID, ""))
	exited := e.create(torpor.CreateRequest{})

	// While the daemon is down: an orphan appears, instances vanish, one exits.
	orphanRT := fake.New(e.host)
	if _, err := orphanRT.Boot(ctx, torpor.BootSpec{SandboxID: "orphan1"}); err != nil {
		t.Fatal(err)
	}
	e.eng.Close()
	e.host.Lose(lostRunning.ID)
	e.host.Lose(lostPaused.ID)
	e.host.Exit(exited.ID, &torpor.Failure{Code: torpor.FailureOOM, Message: "killed"})
	e.eng = nil
	e.restart()

	checks := []struct {
		id    string
		state torpor.State
		inst  torpor.InstanceState
	}{
		{running.ID, torpor.StateRunning, torpor.InstanceRunning},
		{paused.ID, torpor.StatePaused, torpor.InstanceFrozen},
		{lostRunning.ID, torpor.StateRunning, torpor.InstanceRunning},
		{lostPaused.ID, torpor.StateHibernated, torpor.InstanceMissing},
		{exited.ID, torpor.StateFailed, torpor.InstanceStopped},
	}
	for _, c := range checks {
		if got := e.get(c.id); got.State != c.state || e.host.State(c.id) != c.inst {
			t.Errorf("%s: %s/%s, want %s/%s", c.id, got.State, e.host.State(c.id), c.state, c.inst)
		}
	}
	if e.get(exited.ID).Failure.Code != torpor.FailureOOM {
		t.Error("the exit reason was lost")
	}
	if e.host.State("orphan1") != torpor.InstanceMissing || e.host.HasDisk("orphan1") {
		t.Error("the orphan instance was not removed")
	}
	// The adopted instance is watched again.
	e.host.Exit(running.ID, nil)
	waitState(e, running.ID, torpor.StateFailed)
}

func TestMetadataFilterAndUpdate(t *testing.T) {
	e := newEnv(t)
	a := e.create(torpor.CreateRequest{Metadata: map[string]string{"team": "ml", "env": "dev"}})
	e.create(torpor.CreateRequest{Metadata: map[string]string{"team": "web"}})
	got, err := e.eng.List(ctx, "acme", torpor.SandboxFilter{Metadata: map[string]string{"team": "ml"}})
	if err != nil || len(got) != 1 || got[0].ID != a.ID {
		t.Fatalf("filter: %v %v", got, err)
	}
	prod := "prod"
	sb, err := e.eng.Update(ctx, "acme", a.ID, torpor.UpdateRequest{Metadata: map[string]*string{"env": &prod, "team": nil}})
	if err != nil || sb.Metadata["env"] != "prod" || len(sb.Metadata) != 1 {
		t.Fatalf("update: %+v %v", sb.Metadata, err)
	}
}
