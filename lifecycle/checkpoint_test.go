package lifecycle_test

import (
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/lifecycle"
	"github.com/torpor-dev/torpor/runtime/fake"
)

func newCheckpointed(e *env) string {
	id := newRunning(e)
	e.clock.Advance(time.Second)
	if _, err := e.eng.CreateCheckpoint(ctx, "acme", id, "cp1"); err != nil {
		e.t.Fatal(err)
	}
	return id
}

func doCheckpoint(e *env, id string) { _, _ = e.eng.CreateCheckpoint(ctx, "acme", id, "cp1") }
func doDeleteCheckpoint(e *env, id string) {
	_ = e.eng.DeleteCheckpoint(ctx, "acme", id, "cp1")
}
func doFork(e *env, id string) {
	_, _ = e.eng.Fork(ctx, "acme", id, torpor.ForkRequest{Count: 2})
}
func doRestore(e *env, id string) { _, _ = e.eng.Restore(ctx, "acme", id, "cp1") }

func forkPoints() []crashPoint { return forkPointsFrom(torpor.StateRunning) }

// forkPointsFrom is the fork's points, its parent left in state from.
func forkPointsFrom(from torpor.State) []crashPoint {
	var out []crashPoint
	for _, at := range forkFailpoints {
		out = append(out, crashPoint{at, from})
	}
	return out
}

var forkFailpoints = []string{
	"forking.before-store", "forking.after-store", "forking.after-checkpoint",
	"forking.after-clone", "forking.before-commit", "forking.after-commit",
}

// forks returns the sandboxes of the tenant forked from parent, by state.
func (e *env) forks(parent string) map[torpor.State][]string {
	e.t.Helper()
	sbs, err := e.eng.List(ctx, "acme", torpor.SandboxFilter{IncludeTerminated: true})
	if err != nil {
		e.t.Fatal(err)
	}
	out := map[torpor.State][]string{}
	for _, sb := range sbs {
		if sb.Metadata[torpor.MetaForkedFrom] == parent {
			out[sb.State] = append(out[sb.State], sb.ID)
		}
	}
	return out
}

// checkpointsHeld checks that the fake runtime holds exactly the
// checkpoints the records name as ready.
func (e *env) checkpointsHeld() {
	e.t.Helper()
	held, err := fake.New(e.host).ListCheckpoints(ctx)
	if err != nil {
		e.t.Fatal(err)
	}
	sbs, err := e.eng.List(ctx, "acme", torpor.SandboxFilter{IncludeTerminated: true})
	if err != nil {
		e.t.Fatal(err)
	}
	want := map[string][]string{}
	for _, sb := range sbs {
		for _, c := range sb.Checkpoints {
			if c.State != torpor.CheckpointReady {
				e.t.Errorf("sandbox %s keeps checkpoint %s %s", sb.ID, c.Name, c.State)
			}
			want[sb.ID] = append(want[sb.ID], c.Name)
		}
	}
	for id := range held {
		slices.Sort(held[id])
		slices.Sort(want[id])
		if !slices.Equal(held[id], want[id]) {
			e.t.Errorf("sandbox %s: runtime holds checkpoints %v, records %v", id, held[id], want[id])
		}
	}
	for id, names := range want {
		if len(held[id]) == 0 {
			e.t.Errorf("sandbox %s records checkpoints %v the runtime lacks", id, names)
		}
	}
}

// TestForkCrashLeavesAllOrNone crashes a fork of 3 at each of its points:
// after the restart, before the commit no fork stands (each made is
// terminated), after it all three run; no checkpoint copy is left over.
func TestForkCrashLeavesAllOrNone(t *testing.T) {
	for _, at := range append(forkFailpoints, "starting.after-runtime", "started.after-store") {
		t.Run(at, func(t *testing.T) {
			e := newEnv(t)
			id := newRunning(e)
			e.clock.Advance(time.Second)
			e.crashing(at, func() { _, _ = e.eng.Fork(ctx, "acme", id, torpor.ForkRequest{Count: 3}) })
			e.restart()
			got := e.forks(id)
			committed := at == "forking.after-commit"
			for st, ids := range got {
				switch {
				case st == torpor.StateTerminated && !committed:
				case st == torpor.StateRunning && committed:
				default:
					t.Errorf("after a crash at %s: forks %v are %s", at, ids, st)
				}
			}
			if committed && len(got[torpor.StateRunning]) != 3 {
				t.Errorf("after a crash at %s: %d forks run, want 3", at, len(got[torpor.StateRunning]))
			}
			if p := e.get(id); p.State != torpor.StateRunning {
				t.Errorf("parent is %s", p.State)
			}
			e.checkpointsHeld()
			for _, ids := range got {
				for _, k := range ids {
					e.checkHeld(e.get(k))
				}
			}
		})
	}
}

func TestCheckpointForkRestore(t *testing.T) {
	e := newEnv(t)
	id := newRunning(e)
	cp, err := e.eng.CreateCheckpoint(ctx, "acme", id, "before")
	if err != nil {
		t.Fatal(err)
	}
	if cp.State != torpor.CheckpointReady || cp.Kind != torpor.CheckpointDisk || cp.Name != "before" {
		t.Fatalf("checkpoint %+v", cp)
	}
	if e.host.State(id) != torpor.InstanceRunning {
		t.Fatalf("the checkpoint left the sandbox %s", e.host.State(id))
	}
	if _, err := e.eng.CreateCheckpoint(ctx, "acme", id, "before"); !torpor.IsCode(err, torpor.EConflict) {
		t.Fatalf("a second checkpoint of one name: %v", err)
	}
	if _, err := e.eng.CreateCheckpoint(ctx, "acme", id, "../x"); !torpor.IsCode(err, torpor.EInvalid) {
		t.Fatalf("a bad name: %v", err)
	}
	list, err := e.eng.Checkpoints(ctx, "acme", id)
	if err != nil || len(list) != 1 {
		t.Fatalf("list: %v %v", list, err)
	}

	// Fork of 3 from the checkpoint.
	res, err := e.eng.Fork(ctx, "acme", id, torpor.ForkRequest{Count: 3, Checkpoint: "before"})
	if err != nil {
		t.Fatal(err)
	}
	if len(res.Sandboxes) != 3 || res.ProcessesCarried {
		t.Fatalf("fork: %+v", res)
	}
	for _, k := range res.Sandboxes {
		if k.State != torpor.StateRunning || k.Metadata[torpor.MetaForkedFrom] != id || k.Metadata[torpor.MetaForkedFromCheckpoint] != "before" {
			t.Fatalf("fork %+v", k)
		}
	}
	if _, err := e.eng.Fork(ctx, "acme", id, torpor.ForkRequest{Count: 17}); !torpor.IsCode(err, torpor.EInvalid) {
		t.Fatalf("fork of 17: %v", err)
	}
	if _, err := e.eng.Fork(ctx, "acme", id, torpor.ForkRequest{Count: 1, Checkpoint: "nope"}); !torpor.IsCode(err, torpor.ENotFound) {
		t.Fatalf("fork of a missing checkpoint: %v", err)
	}

	// Fork of a hibernated parent does not wake it.
	if _, err := e.eng.Hibernate(ctx, "acme", id); err != nil {
		t.Fatal(err)
	}
	boots := e.host.Boots(id)
	res, err = e.eng.Fork(ctx, "acme", id, torpor.ForkRequest{Count: 1})
	if err != nil {
		t.Fatal(err)
	}
	if p := e.get(id); p.State != torpor.StateHibernated || e.host.Boots(id) != boots {
		t.Fatalf("the fork woke its parent: %s", p.State)
	}
	if res.Sandboxes[0].Metadata[torpor.MetaForkedFromCheckpoint] != "" {
		t.Fatalf("fork of the disk as it is names a checkpoint")
	}

	// Restore of a hibernated sandbox, then of a running one.
	if _, err := e.eng.Restore(ctx, "acme", id, "before"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.eng.Start(ctx, "acme", id); err != nil {
		t.Fatal(err)
	}
	sb, err := e.eng.Restore(ctx, "acme", id, "before")
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != torpor.StateRunning {
		t.Fatalf("restored: %s", sb.State)
	}

	// A fork that does not fit leaves nothing; one whose boot fails part
	// way removes what it made.
	before := len(e.ids())
	e.host.FailNext("boot", errors.New("no room"))
	if _, err := e.eng.Fork(ctx, "acme", id, torpor.ForkRequest{Count: 2}); err == nil {
		t.Fatal("a fork whose boot failed succeeded")
	}
	for st, ids := range e.forks(id) {
		if st != torpor.StateRunning && st != torpor.StateTerminated {
			t.Fatalf("forks %v left %s", ids, st)
		}
	}
	if n := len(e.ids()); n != before+1 {
		// the failed fork's first record, terminated
		t.Logf("%d sandboxes after a failed fork, %d before", n, before)
	}

	// Delete a checkpoint, then the sandbox: its checkpoints go.
	if err := e.eng.DeleteCheckpoint(ctx, "acme", id, "before"); err != nil {
		t.Fatal(err)
	}
	if e.host.HasCheckpoint(id, "before") {
		t.Fatal("the deleted checkpoint's copy is kept")
	}
	if _, err := e.eng.CreateCheckpoint(ctx, "acme", id, "again"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.eng.Delete(ctx, "acme", id); err != nil {
		t.Fatal(err)
	}
	if e.host.HasCheckpoint(id, "again") {
		t.Fatal("a deleted sandbox's checkpoint is kept")
	}
	e.checkpointsHeld()
}

// plainRuntime is the fake runtime without its optional capabilities, as
// a runtime without checkpoints (the microVM one, for now) is.
type plainRuntime struct{ torpor.Runtime }

// TestCheckpointRefusedWithoutCheckpointer: a runtime without
// torpor.Checkpointer refuses checkpoints, forks and restores with a 400
// that names the runtime, and changes nothing.
func TestCheckpointRefusedWithoutCheckpointer(t *testing.T) {
	e := newEnv(t, func(c *lifecycle.Config) {
		c.Runtimes = []torpor.Runtime{plainRuntime{c.Runtimes[0]}}
	})
	id := newRunning(e)
	if _, err := e.eng.CreateCheckpoint(ctx, "acme", id, "cp"); !torpor.IsCode(err, torpor.EInvalid) {
		t.Fatalf("checkpoint: %v, want invalid", err)
	}
	if _, err := e.eng.Fork(ctx, "acme", id, torpor.ForkRequest{Count: 1}); !torpor.IsCode(err, torpor.EInvalid) {
		t.Fatalf("fork: %v, want invalid", err)
	}
	if _, err := e.eng.Restore(ctx, "acme", id, "cp"); !torpor.IsCode(err, torpor.EInvalid) {
		t.Fatalf("restore: %v, want invalid", err)
	}
	if len(e.ids()) != 1 || e.get(id).State != torpor.StateRunning {
		t.Fatal("a refused call changed something")
	}
}

// TestRestartSweepsLeftoverCheckpoints: after a restart, the copies no
// record names (of a live sandbox, of a sandbox no longer stored) are
// removed and those its record names are kept.
func TestRestartSweepsLeftoverCheckpoints(t *testing.T) {
	e := newEnv(t)
	id := newCheckpointed(e)
	rt := fake.New(e.host)
	if _, err := rt.Checkpoint(ctx, torpor.InstanceRef{SandboxID: id}, "stray"); err != nil {
		t.Fatal(err)
	}
	ghost := newRunning(e)
	if _, err := rt.Checkpoint(ctx, torpor.InstanceRef{SandboxID: ghost}, "left"); err != nil {
		t.Fatal(err)
	}
	if _, err := e.eng.Delete(ctx, "acme", ghost); err != nil {
		t.Fatal(err)
	}
	e.restart()
	if !e.host.HasCheckpoint(id, "cp1") {
		t.Error("the recorded checkpoint was removed")
	}
	if e.host.HasCheckpoint(id, "stray") || e.host.HasCheckpoint(ghost, "left") {
		t.Error("a leftover checkpoint copy was kept")
	}
	e.checkpointsHeld()
}
