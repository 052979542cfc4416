package lifecycle_test

import (
	"context"
	"errors"
	"os"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/lifecycle"
)

// crashPath is a transition driven from a state: from makes a sandbox in
// it ("" when the transition makes the sandbox), do drives the verb, and
// points says, for each failpoint the verb passes, the state a restart
// must leave the sandbox in (the state before the verb when nothing of it
// was stored, the state it was heading for otherwise; "" for no sandbox).
type crashPath struct {
	name   string
	from   func(e *env) string
	do     func(e *env, id string)
	points []crashPoint
}

type crashPoint struct {
	at   string
	want torpor.State
}

func newRunning(e *env) string { return e.create(torpor.CreateRequest{}).ID }

func newPaused(mode torpor.PauseMode) func(e *env) string {
	return func(e *env) string {
		id := newRunning(e)
		e.clock.Advance(time.Second)
		must(e.eng.Pause(ctx, "acme", id, mode))
		return id
	}
}

func newHibernated(e *env) string {
	id := newRunning(e)
	e.clock.Advance(time.Second)
	must(e.eng.Hibernate(ctx, "acme", id))
	return id
}

func doPause(mode torpor.PauseMode) func(e *env, id string) {
	return func(e *env, id string) { _, _ = e.eng.Pause(ctx, "acme", id, mode) }
}

func doStart(e *env, id string)     { _, _ = e.eng.Start(ctx, "acme", id) }
func doHibernate(e *env, id string) { _, _ = e.eng.Hibernate(ctx, "acme", id) }
func doRestart(e *env, id string)   { _, _ = e.eng.Restart(ctx, "acme", id) }
func doDelete(e *env, id string)    { _, _ = e.eng.Delete(ctx, "acme", id) }

// pausingPoints is the points of a pause of a running sandbox that stores
// its in-between state first (by snapshot).
func pausingPoints() []crashPoint {
	return []crashPoint{
		{"pausing.before-store", torpor.StateRunning},
		{"pausing.after-store", torpor.StatePaused},
		{"pausing.before-runtime", torpor.StatePaused},
		{"pausing.after-runtime", torpor.StatePaused},
		{"paused.after-store", torpor.StatePaused},
	}
}

// freezingPoints is the points of a pause by freeze, which stores only
// where it lands: until then the sandbox is recorded running, and a
// restart thaws an instance the crash left frozen.
func freezingPoints() []crashPoint {
	return []crashPoint{
		{"pausing.before-runtime", torpor.StateRunning},
		{"pausing.after-runtime", torpor.StateRunning},
		{"paused.after-store", torpor.StatePaused},
	}
}

// resumingPoints is the points of a resume that stores its in-between
// state first (from a snapshot).
func resumingPoints() []crashPoint {
	return []crashPoint{
		{"resuming.before-store", torpor.StatePaused},
		{"resuming.before-runtime", torpor.StateRunning},
		{"resuming.after-runtime", torpor.StateRunning},
		{"resumed.after-store", torpor.StateRunning},
	}
}

// thawingPoints is the points of a resume from a freeze, which stores only
// where it lands: until then the sandbox is recorded paused, and a restart
// freezes an instance the crash left thawed.
func thawingPoints() []crashPoint {
	return []crashPoint{
		{"resuming.before-runtime", torpor.StatePaused},
		{"resuming.after-runtime", torpor.StatePaused},
		{"resumed.after-store", torpor.StateRunning},
	}
}

func hibernatingPoints(from torpor.State) []crashPoint {
	return []crashPoint{
		{"hibernating.before-store", from},
		{"hibernating.after-store", torpor.StateHibernated},
		{"hibernating.before-runtime", torpor.StateHibernated},
		{"hibernating.after-runtime", torpor.StateHibernated},
		{"hibernated.after-store", torpor.StateHibernated},
	}
}

func terminatingPoints(from torpor.State) []crashPoint {
	return []crashPoint{
		{"terminating.before-store", from},
		{"terminating.before-runtime", torpor.StateTerminated},
		{"terminating.after-runtime", torpor.StateTerminated},
		{"terminated.after-store", torpor.StateTerminated},
	}
}

var crashPaths = []crashPath{
	{"create", nil, func(e *env, _ string) { e.create(torpor.CreateRequest{}) }, []crashPoint{
		{"create.before-store", ""},
		{"create.before-runtime", torpor.StateRunning},
		{"starting.after-runtime", torpor.StateRunning},
		{"started.after-store", torpor.StateRunning},
	}},
	{"pause by freeze", newRunning, doPause(torpor.PauseFreeze), freezingPoints()},
	{"pause by snapshot", newRunning, doPause(torpor.PauseSnapshot), pausingPoints()},
	{"resume from freeze", newPaused(torpor.PauseFreeze), doStart, thawingPoints()},
	{"resume from snapshot", newPaused(torpor.PauseSnapshot), doStart, resumingPoints()},
	{"hibernate running", newRunning, doHibernate, hibernatingPoints(torpor.StateRunning)},
	{"hibernate frozen", newPaused(torpor.PauseFreeze), doHibernate, hibernatingPoints(torpor.StatePaused)},
	{"hibernate snapshotted", newPaused(torpor.PauseSnapshot), doHibernate, hibernatingPoints(torpor.StatePaused)},
	{"start hibernated", newHibernated, doStart, []crashPoint{
		{"starting.before-store", torpor.StateHibernated},
		{"starting.before-runtime", torpor.StateRunning},
		{"starting.after-runtime", torpor.StateRunning},
		{"started.after-store", torpor.StateRunning},
	}},
	{"restart", newRunning, doRestart, []crashPoint{
		{"restarting.before-store", torpor.StateRunning},
		{"restarting.before-runtime", torpor.StateRunning},
		{"restarting.after-runtime", torpor.StateRunning},
		{"restarted.after-store", torpor.StateRunning},
	}},
	{"delete running", newRunning, doDelete, terminatingPoints(torpor.StateRunning)},
	{"delete frozen", newPaused(torpor.PauseFreeze), doDelete, terminatingPoints(torpor.StatePaused)},
	{"delete snapshotted", newPaused(torpor.PauseSnapshot), doDelete, terminatingPoints(torpor.StatePaused)},
	{"delete hibernated", newHibernated, doDelete, terminatingPoints(torpor.StateHibernated)},
	// The archive tier (archive_test.go).
	{"archive", newHibernated, doArchive, []crashPoint{
		{"archiving.before-store", torpor.StateHibernated},
		{"archiving.after-store", torpor.StateHibernated},
		{"archiving.after-upload", torpor.StateHibernated},
		{"archived.after-store", torpor.StateArchived},
	}},
	{"archive snapshotted", newPaused(torpor.PauseSnapshot), doArchive, []crashPoint{
		{"archiving.before-store", torpor.StatePaused},
		{"archiving.after-store", torpor.StatePaused},
		{"archiving.after-upload", torpor.StatePaused},
		{"archived.after-store", torpor.StateArchived},
	}},
	{"start archived snapshot", newArchivedSnapshot, doStart, []crashPoint{
		{"restoring.before-import", torpor.StateArchived},
		{"restoring.after-import", torpor.StateArchived},
		{"resuming.before-store", torpor.StatePaused},
		{"resuming.before-runtime", torpor.StateRunning},
		{"resumed.after-store", torpor.StateRunning},
		{"restored.before-drop", torpor.StateRunning},
	}},
	{"start archived", newArchived, doStart, []crashPoint{
		{"restoring.before-import", torpor.StateArchived},
		{"restoring.after-import", torpor.StateArchived},
		{"starting.before-store", torpor.StateArchived},
		{"starting.before-runtime", torpor.StateRunning},
		{"started.after-store", torpor.StateRunning},
		{"restored.before-drop", torpor.StateRunning},
	}},
	{"delete archived", newArchived, doDelete, append(terminatingPoints(torpor.StateArchived),
		crashPoint{"terminating.after-archive-drop", torpor.StateTerminated})},
	// Checkpoints, forks and restores (checkpoint_test.go): the parent
	// is where it was; TestForkCrashLeavesAllOrNone checks the forks.
	{"checkpoint", newRunning, doCheckpoint, []crashPoint{
		{"checkpointing.before-store", torpor.StateRunning},
		{"checkpointing.after-store", torpor.StateRunning},
		{"checkpointing.after-copy", torpor.StateRunning},
	}},
	{"delete checkpoint", newCheckpointed, doDeleteCheckpoint, []crashPoint{
		{"checkpoint-delete.after-store", torpor.StateRunning},
	}},
	{"fork", newRunning, doFork, forkPoints()},
	{"fork hibernated", newHibernated, doFork, forkPointsFrom(torpor.StateHibernated)},
	{"restore", newCheckpointed, doRestore, []crashPoint{
		{"restoring-checkpoint.before-store", torpor.StateRunning},
		{"restoring-checkpoint.after-store", torpor.StateRunning},
		{"restoring-checkpoint.after-copy", torpor.StateRunning},
	}},
	// A create that claims a pool's member: cut short after the thaw,
	// before its one write, no tenant has a sandbox (the restart removes
	// the thawed member); after the write, the claimant's sandbox runs.
	{"claim", withWarmMember, func(e *env, _ string) { e.create(torpor.CreateRequest{}) }, []crashPoint{
		{"claim.after-thaw", ""},
		{"claim.after-store", torpor.StateRunning},
	}},
}

// withWarmMember restarts the engine with a warm pool of one for the
// template creates use, and waits until its member is ready to be
// claimed; the sandbox is the create's ("").
func withWarmMember(e *env) string {
	e.opts = append(e.opts, withPools(map[string]int{"base": 1}))
	e.restart()
	e.waitReady("base", 1)
	return ""
}

// TestCrashAtEveryFailpoint crashes the engine at every point of every
// transition listed in lifecycle.Failpoints, restarts it, and checks that
// the sandbox is in a true state that agrees with its instance, that
// nothing of it is left that its state does not hold (instance, snapshot,
// disk), and that its ledger covers its life as its events say, each
// second once. Every listed point must be crashed at by some path, and
// every point the engine passes must be listed.
func TestCrashAtEveryFailpoint(t *testing.T) {
	var mu sync.Mutex
	passed := map[string]bool{}
	record := func(cfg *lifecycle.Config) {
		crash := cfg.Failpoint
		cfg.Failpoint = func(name string) {
			mu.Lock()
			passed[name] = true
			mu.Unlock()
			crash(name)
		}
	}
	crashed := map[string]bool{}
	var names []string
	for _, p := range crashPaths {
		for _, c := range p.points {
			crashed[c.at] = true
			names = append(names, p.name+"/"+c.at)
		}
	}
	for _, name := range pgCrashPoints {
		if !slices.Contains(names, name) {
			t.Errorf("pgCrashPoints names %s, which is no case of the matrix", name)
		}
	}
	eachStore(t, func(t *testing.T, kind string) {
		ran := 0
		defer func() {
			t.Logf("%d of the matrix's %d cases ran (%s=1 runs every one on PostgreSQL)", ran, len(names), soakEnv)
		}()
		for _, p := range crashPaths {
			for _, c := range p.points {
				name := p.name + "/" + c.at
				if !crashPointRuns(kind, name) {
					continue
				}
				ran++
				t.Run(name, func(t *testing.T) {
					e := newEnvOn(t, kind, record)
					id := ""
					if p.from != nil {
						id = p.from(e)
					}
					e.clock.Advance(time.Second)
					known := e.ids()
					e.crashing(c.at, func() { p.do(e, id) })
					e.clock.Advance(time.Second)
					e.restart()
					if id == "" {
						id = e.newID(known)
					}
					if c.want == "" {
						if id != "" {
							t.Fatalf("a crash at %s left sandbox %s", c.at, id)
						}
						return
					}
					if id == "" {
						t.Fatalf("a crash at %s lost the sandbox", c.at)
					}
					// What the restart set going (watchers of instances) has a
					// moment to act: the state must hold, not only be reached.
					time.Sleep(20 * time.Millisecond)
					sb := e.get(id)
					if sb.State != c.want {
						t.Fatalf("after a crash at %s: %s, want %s", c.at, sb.State, c.want)
					}
					e.checkHeld(sb)
					e.clock.Advance(time.Second)
					e.checkLedger(id)
					// It goes on: the next transition works, and its ledger
					// still holds.
					if sb.State != torpor.StateTerminated {
						if _, err := e.eng.Delete(ctx, "acme", id); err != nil {
							t.Fatal(err)
						}
						e.checkHeld(e.get(id))
						e.checkLedger(id)
					}
				})
			}
		}
	})
	for _, at := range lifecycle.Failpoints() {
		if !crashed[at] {
			t.Errorf("no crash path goes through failpoint %s", at)
		}
	}
	for at := range passed {
		if !slices.Contains(lifecycle.Failpoints(), at) {
			t.Errorf("the engine passed failpoint %s, which lifecycle.Failpoints does not list", at)
		}
	}
}

// ids returns the ids of every sandbox of the tenant.
func (e *env) ids() []string {
	e.t.Helper()
	sbs, err := e.eng.List(ctx, "acme", torpor.SandboxFilter{IncludeTerminated: true})
	if err != nil {
		e.t.Fatal(err)
	}
	var ids []string
	for _, sb := range sbs {
		ids = append(ids, sb.ID)
	}
	return ids
}

// newID returns the id of the one sandbox not in known, or "".
func (e *env) newID(known []string) string {
	e.t.Helper()
	var ids []string
	for _, id := range e.ids() {
		if !slices.Contains(known, id) {
			ids = append(ids, id)
		}
	}
	if len(ids) > 1 {
		e.t.Fatalf("new sandboxes %v, want at most one", ids)
	}
	if len(ids) == 0 {
		return ""
	}
	return ids[0]
}

// checkHeld checks that sb's instance, snapshot and disk are what its
// state holds, and no more.
func (e *env) checkHeld(sb *torpor.Sandbox) {
	e.t.Helper()
	if sb.State.Transitional() {
		e.t.Fatalf("sandbox %s is left %s", sb.ID, sb.State)
	}
	want := torpor.InstanceMissing
	snapshot := sb.State == torpor.StatePaused && sb.PauseMode == torpor.PauseSnapshot
	switch {
	case sb.State == torpor.StateRunning:
		want = torpor.InstanceRunning
	case sb.State == torpor.StatePaused && !snapshot:
		want = torpor.InstanceFrozen
	}
	if got := e.host.State(sb.ID); got != want {
		e.t.Errorf("sandbox %s is %s (%s) with its instance %s, want %s", sb.ID, sb.State, sb.PauseMode, got, want)
	}
	if got := e.host.HasSnapshot(sb.ID); got != snapshot {
		e.t.Errorf("sandbox %s is %s (%s): has a snapshot %v, want %v", sb.ID, sb.State, sb.PauseMode, got, snapshot)
	}
	if got := sb.Snapshot != nil; got != snapshot {
		e.t.Errorf("sandbox %s is %s (%s): records a snapshot %v, want %v", sb.ID, sb.State, sb.PauseMode, got, snapshot)
	}
	if got, want := e.host.HasDisk(sb.ID), sb.State != torpor.StateTerminated && sb.State != torpor.StateArchived; got != want {
		e.t.Errorf("sandbox %s is %s: has a disk %v, want %v", sb.ID, sb.State, got, want)
	}
	e.checkArchives(sb)
}

// checkLedger checks that the sandbox's usage rows, the open interval
// included, cover its life from its creation with no gap and no overlap,
// as its event log says it was.
func (e *env) checkLedger(id string) {
	e.t.Helper()
	sb := e.get(id)
	rows, err := e.eng.Usage(ctx, "acme", torpor.UsageFilter{SandboxID: id})
	if err != nil {
		e.t.Fatal(err)
	}
	slices.SortFunc(rows, func(a, b torpor.UsageRecord) int { return a.Start.Compare(b.Start) })
	for _, r := range rows {
		if r.Kind == torpor.UsageSnapshotPaused && r.Seconds > 0 && r.SnapshotGiBSeconds <= 0 {
			e.t.Errorf("the snapshot of %s is not billed from %s to %s", id, r.Start, r.End)
		}
	}
	spans, err := torpor.SpansOfRows(rows)
	if err != nil {
		e.t.Fatal(err)
	}
	end := e.clock.Now()
	if sb.TerminatedAt != nil {
		end = *sb.TerminatedAt
	}
	if len(spans) == 0 || !spans[0].Start.Equal(sb.CreatedAt) || !spans[len(spans)-1].End.Equal(end) {
		e.t.Fatalf("the ledger of %s %v does not span its life %s - %s", id, spans, sb.CreatedAt, end)
	}
	evs, err := e.eng.Events(ctx, "acme", torpor.EventFilter{SandboxID: id})
	if err != nil {
		e.t.Fatal(err)
	}
	if want := torpor.SpansOfEvents(evs, end); !slices.Equal(spans, want) {
		e.t.Fatalf("the ledger of %s\n%v\ndiffers from its event log\n%v", id, spans, want)
	}
}

// refusingStore is a store whose writes of sandboxes fail while refuse is
// set, as those of a full disk do; the engine's passing failpoint at sets
// it (once).
type refusingStore struct {
	torpor.Store
	mu     sync.Mutex
	at     string
	refuse bool
}

func (s *refusingStore) arm(at string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.at = at
}

func (s *refusingStore) passing(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if name == s.at {
		s.at, s.refuse = "", true
	}
}

func (s *refusingStore) set(refuse bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.refuse = refuse
}

func (s *refusingStore) UpdateSandboxUsage(ctx context.Context, sb *torpor.Sandbox, usage []torpor.UsageRecord, events ...torpor.Event) error {
	s.mu.Lock()
	refuse := s.refuse
	s.mu.Unlock()
	if refuse {
		return errors.New("the disk is full")
	}
	return s.Store.UpdateSandboxUsage(ctx, sb, usage, events...)
}

// TestPauseAndResumeThatCannotBeStoredAreUndone: a pause by freeze and a
// resume from one store nothing before the runtime acts, so when the one
// write after it fails, the instance is put back to what the store says
// (as a restart's reconcile would) and the caller hears of the failure.
func TestPauseAndResumeThatCannotBeStoredAreUndone(t *testing.T) {
	st := &refusingStore{}
	e := newEnv(t, func(cfg *lifecycle.Config) {
		st.Store = cfg.Store
		cfg.Store = st
		next := cfg.Failpoint
		cfg.Failpoint = func(name string) {
			st.passing(name)
			next(name)
		}
	})
	id := newRunning(e)
	e.clock.Advance(time.Second)
	st.arm("pausing.after-runtime")
	if _, err := e.eng.Pause(ctx, "acme", id, torpor.PauseFreeze); err == nil {
		t.Fatal("a pause whose record could not be stored succeeded")
	}
	st.set(false)
	if sb := e.get(id); sb.State != torpor.StateRunning || e.host.State(id) != torpor.InstanceRunning {
		t.Fatalf("after a pause that could not be stored: %s with its instance %s, want running", sb.State, e.host.State(id))
	}
	if got := e.eng.StateCounts()[torpor.StatePausing]; got != 0 {
		t.Fatalf("%d sandboxes shown pausing after the pause failed", got)
	}
	if _, err := e.eng.Exec(ctx, "acme", id, torpor.ExecRequest{Cmd: []string{"true"}}); err != nil {
		t.Fatalf("exec after a pause that could not be stored: %v", err)
	}
	must(e.eng.Pause(ctx, "acme", id, torpor.PauseFreeze))
	e.clock.Advance(time.Second)
	st.arm("resuming.after-runtime")
	if _, err := e.eng.Start(ctx, "acme", id); err == nil {
		t.Fatal("a resume whose record could not be stored succeeded")
	}
	st.set(false)
	if sb := e.get(id); sb.State != torpor.StatePaused || e.host.State(id) != torpor.InstanceFrozen {
		t.Fatalf("after a resume that could not be stored: %s with its instance %s, want paused", sb.State, e.host.State(id))
	}
	must(e.eng.Start(ctx, "acme", id))
	e.clock.Advance(time.Second)
	e.checkHeld(e.get(id))
	e.checkLedger(id)
}

// TestFreezeStoresOnlyWhereItLands: an API pause by freeze and the resume
// from it pass none of lifecycle.InBetweenFailpoints (one store write
// each), while an idle pause by freeze and a pause by snapshot still store
// pausing first.
func TestFreezeStoresOnlyWhereItLands(t *testing.T) {
	var mu sync.Mutex
	passed := map[string]bool{}
	e := newEnv(t, func(cfg *lifecycle.Config) {
		next := cfg.Failpoint
		cfg.Failpoint = func(name string) {
			mu.Lock()
			passed[name] = true
			mu.Unlock()
			next(name)
		}
	})
	took := func(what string, want ...string) {
		t.Helper()
		mu.Lock()
		defer mu.Unlock()
		for _, at := range lifecycle.InBetweenFailpoints() {
			if passed[at] != slices.Contains(want, at) {
				t.Errorf("%s: passed %s: %v, want %v", what, at, passed[at], !passed[at])
			}
		}
		clear(passed)
	}
	id := newRunning(e)
	must(e.eng.Pause(ctx, "acme", id, torpor.PauseFreeze))
	took("pause by freeze")
	must(e.eng.Start(ctx, "acme", id))
	took("resume from freeze")
	must(e.eng.Pause(ctx, "acme", id, torpor.PauseSnapshot))
	took("pause by snapshot", "pausing.before-store", "pausing.after-store")
	must(e.eng.Start(ctx, "acme", id))
	took("resume from snapshot", "resuming.before-store")

	idle := e.create(torpor.CreateRequest{PolicyRequest: torpor.PolicyRequest{
		LifecyclePolicy: policy(torpor.LifecyclePolicy{PauseAfterIdleSeconds: torpor.Seconds(60)})}}).ID
	e.clock.Advance(60 * time.Second)
	settle(e, idle, torpor.StatePaused)
	took("idle pause by freeze", "pausing.before-store", "pausing.after-store")
}

// soakEnv, set to 1, runs the long versions of tests: here the whole
// failpoint matrix on PostgreSQL as well as on SQLite.
const soakEnv = "TORPOR_SOAK"

// pgCrashPoints are the cases of the failpoint matrix that run on
// PostgreSQL by default: one of each kind of step a crash can cut, on
// each verb (a record stored and the runtime not yet acted on; the runtime
// acted on and its record not stored; a freeze or thaw that stores only
// where it lands; the last write; a pool's claim). Each PostgreSQL case
// costs a database of its own and a reopen of the store at its restart,
// about 0.8 s under -race (RELIABILITY.md): the other cases run on
// PostgreSQL under TORPOR_SOAK=1, and every case on SQLite always.
var pgCrashPoints = []string{
	"create/create.before-runtime",
	"create/started.after-store",
	"pause by freeze/pausing.after-runtime",
	"pause by snapshot/pausing.after-store",
	"resume from freeze/resuming.after-runtime",
	"resume from snapshot/resuming.before-runtime",
	"hibernate snapshotted/hibernating.after-runtime",
	"start hibernated/starting.before-runtime",
	"restart/restarting.after-runtime",
	"delete running/terminating.before-runtime",
	"delete snapshotted/terminated.after-store",
	"claim/claim.after-thaw",
}

// crashPointRuns says whether the case name of the failpoint matrix runs
// on the store kind: every one on SQLite, and on PostgreSQL every one
// under TORPOR_SOAK=1, else those of pgCrashPoints.
func crashPointRuns(kind, name string) bool {
	return kind != "postgres" || os.Getenv(soakEnv) != "" || slices.Contains(pgCrashPoints, name)
}
