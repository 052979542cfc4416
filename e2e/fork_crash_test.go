package e2e

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/client"
	"github.com/torpor-dev/torpor/lifecycle"
)

// forksOf returns the sandboxes forked from id (terminated ones too).
func forksOf(t testing.TB, d *daemon, id string) []*torpor.Sandbox {
	t.Helper()
	sbs, err := d.client(t).List(context.Background(), client.ListOptions{All: true, Metadata: map[string]string{torpor.MetaForkedFrom: id}})
	if err != nil {
		t.Fatal(err)
	}
	return sbs
}

// checkForks checks, after a crash in a fork of 2, that both forks run
// (the fork was committed) or none stands.
func checkForks(committed bool) func(t *testing.T, r *crashRig, d *daemon, sb *torpor.Sandbox) {
	return func(t *testing.T, r *crashRig, d *daemon, sb *torpor.Sandbox) {
		running := 0
		for _, k := range forksOf(t, d, sb.ID) {
			switch k.State {
			case torpor.StateRunning:
				running++
			case torpor.StateTerminated:
			default:
				r.fail(t, "state", "fork %s is left %s", k.ID, k.State)
			}
		}
		if want := map[bool]int{true: 2, false: 0}[committed]; running != want {
			r.fail(t, "state", "%d forks of %s run after the crash, want %d", running, sb.ID, want)
		}
		checkCheckpointCopies(t, r, d, sb)
	}
}

// removeForks deletes the forks of id that still stand.
func removeForks(d *daemon, id string) {
	for _, k := range forksOf(d.t, d, id) {
		if k.State != torpor.StateTerminated {
			d.ok("rm", k.ID)
		}
	}
}

// checkCheckpointCopies checks that the runtime keeps exactly the
// checkpoint copies the sandbox's record names.
func checkCheckpointCopies(t *testing.T, r *crashRig, d *daemon, sb *torpor.Sandbox) {
	var want, got []string
	for _, c := range sb.Checkpoints {
		want = append(want, c.Name)
	}
	entries, _ := os.ReadDir(filepath.Join(r.dataDir, "runc", "checkpoints", sb.ID))
	for _, e := range entries {
		got = append(got, e.Name())
	}
	slices.Sort(want)
	slices.Sort(got)
	if !slices.Equal(got, want) {
		r.fail(t, "orphan", "sandbox %s records checkpoints %v and the runtime keeps %v", sb.ID, want, got)
	}
}

// checkpointFailpoints are the points of checkpoints, forks and restores
// (lifecycle/failpoints.go), which microVM sandboxes do not reach yet.
func checkpointFailpoints() []string {
	var out []string
	for _, at := range lifecycle.Failpoints() {
		for _, p := range []string{"checkpointing.", "checkpoint-delete.", "forking.", "restoring-checkpoint."} {
			if len(at) > len(p) && at[:len(p)] == p {
				out = append(out, at)
			}
		}
	}
	return out
}
