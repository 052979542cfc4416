package gpu_test

import (
	"context"
	"math"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/clocktest"
	"github.com/torpor-dev/torpor/gpu"
	"github.com/torpor-dev/torpor/gpu/sim"
)

var t0 = time.Date(2026, 10, 9, 12, 0, 0, 0, time.UTC)

// memStore keeps what the manager saves.
type memStore struct {
	mu      sync.Mutex
	records map[string]gpu.Record
	rows    []gpu.UsageRow
	fail    error
}

func (s *memStore) SaveLease(ctx context.Context, rec gpu.Record, rows []gpu.UsageRow) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.fail != nil {
		return s.fail
	}
	s.records[rec.Spec.ID] = rec
	s.rows = append(s.rows, rows...)
	return nil
}

func (s *memStore) Rows(id string) []gpu.UsageRow {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []gpu.UsageRow
	for _, r := range s.rows {
		if r.LeaseID == id {
			out = append(out, r)
		}
	}
	return out
}

func (s *memStore) Record(id string) gpu.Record {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.records[id]
}

type flagRec struct {
	mu    sync.Mutex
	flags []gpu.Flag
}

func (f *flagRec) FlagKey(ctx context.Context, fl gpu.Flag) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.flags = append(f.flags, fl)
	return nil
}

func (f *flagRec) all() []gpu.Flag {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]gpu.Flag(nil), f.flags...)
}

type env struct {
	t      *testing.T
	sim    *sim.Host
	host   gpu.Host
	clock  *clocktest.Clock
	store  *memStore
	flags  *flagRec
	m      *gpu.Manager
	mu     sync.Mutex
	events []gpu.Event
}

type envOpt func(*gpu.Options, *env)

func withConfig(f func(*gpu.Config)) envOpt {
	return func(o *gpu.Options, _ *env) { f(&o.Config) }
}

// withHost wraps the simulated host (to gate or alter calls).
func withHost(wrap func(*sim.Host) gpu.Host) envOpt {
	return func(o *gpu.Options, e *env) { o.Host = wrap(e.sim) }
}

func withPause(f func(m func() *gpu.Manager) func(ctx context.Context, id string) error) envOpt {
	return func(o *gpu.Options, e *env) { o.Pause = f(func() *gpu.Manager { return e.m }) }
}

func newEnv(t *testing.T, hardCap bool, opts ...envOpt) *env {
	t.Helper()
	e := &env{t: t, sim: sim.New(sim.Options{HardCap: hardCap}), clock: clocktest.New(t0),
		store: &memStore{records: map[string]gpu.Record{}}, flags: &flagRec{}}
	o := gpu.Options{Clock: e.clock, Config: gpu.DefaultConfig(), Store: e.store, Flagger: e.flags,
		OnEvent: func(ev gpu.Event) { e.mu.Lock(); e.events = append(e.events, ev); e.mu.Unlock() }}
	o.Host, o.Worker = e.sim, e.sim
	for _, f := range opts {
		f(&o, e)
	}
	m, err := gpu.NewManager(o)
	if err != nil {
		t.Fatal(err)
	}
	e.m = m
	return e
}

func (e *env) eventsOf(kind gpu.EventKind) []gpu.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	var out []gpu.Event
	for _, ev := range e.events {
		if ev.Kind == kind {
			out = append(out, ev)
		}
	}
	return out
}

const (
	sliceMiB  = 8192
	workerCtx = 300
)

type leaseOpt func(*gpu.Spec)

func idleTimeout(s int) leaseOpt { return func(sp *gpu.Spec) { sp.Accel.IdleTimeoutS = s } }

// lease starts a worker in group "g-<id>" and creates the lease with an
// 8 GiB slice and auto-pause off unless asked.
func (e *env) lease(id string, mode gpu.SuspendMode, opts ...leaseOpt) (worker int) {
	e.t.Helper()
	group := "g-" + id
	worker = e.sim.StartWorker(group, 0, workerCtx)
	spec := gpu.Spec{ID: id, Tenant: "acme", KeyID: "key_" + id, Group: group, WorkerPID: worker,
		Accel: gpu.Accel{GPUs: 1, VRAMMiB: sliceMiB, SuspendMode: mode, IdleTimeoutS: 0}}
	for _, f := range opts {
		f(&spec)
	}
	if _, err := e.m.Create(context.Background(), spec); err != nil {
		e.t.Fatalf("create %s: %v", id, err)
	}
	return worker
}

func (e *env) child(id string, mib int64) int {
	return e.sim.StartChild("g-"+id, 0, mib)
}

// jobChild runs a job that leaves a child holding mib of VRAM behind, the
// way a job's background process outlives it.
func (e *env) jobChild(id string, mib int64) int {
	e.t.Helper()
	j, err := e.m.BeginJob(context.Background(), id)
	if err != nil {
		e.t.Fatal(err)
	}
	pid := e.child(id, mib)
	if err := j.End(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	return pid
}

func (e *env) status(id string) gpu.Status {
	e.t.Helper()
	st, err := e.m.Status(id)
	if err != nil {
		e.t.Fatal(err)
	}
	return st
}

func (e *env) pause(id string) gpu.Status {
	e.t.Helper()
	st, err := e.m.Pause(context.Background(), id)
	if err != nil {
		e.t.Fatalf("pause %s: %v", id, err)
	}
	return st
}

func (e *env) resume(id string) gpu.Status {
	e.t.Helper()
	st, err := e.m.Resume(context.Background(), id)
	if err != nil {
		e.t.Fatalf("resume %s: %v", id, err)
	}
	return st
}

// job runs a job of d on the lease.
func (e *env) job(id string, d time.Duration) {
	e.t.Helper()
	j, err := e.m.BeginJob(context.Background(), id)
	if err != nil {
		e.t.Fatalf("begin job on %s: %v", id, err)
	}
	e.clock.Advance(d)
	if err := j.End(context.Background()); err != nil {
		e.t.Fatalf("end job on %s: %v", id, err)
	}
}

func wantCode(t *testing.T, err error, code torpor.ErrorCode, reason string) {
	t.Helper()
	if !torpor.IsCode(err, code) {
		t.Fatalf("err = %v, want code %s", err, code)
	}
	if reason != "" {
		if got := torpor.AsError(err).Reason; got != reason {
			t.Fatalf("reason = %q, want %q (err %v)", got, reason, err)
		}
	}
}

func near(a, b float64) bool { return math.Abs(a-b) < 1e-6 }

func wantSeconds(t *testing.T, name string, got, want float64) {
	t.Helper()
	if !near(got, want) {
		t.Fatalf("%s = %v, want %v", name, got, want)
	}
}
