package e2e

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/client"
	"github.com/torpor-dev/torpor/lifecycle"
)

// failpointEnv arms a failpoint in the daemon (daemon.FailpointEnv): it
// kills itself with SIGKILL when it gets there.
const failpointEnv = "TORPOR_TEST_FAILPOINT"

// soakEnv runs the long versions of tests: the whole crash matrix on
// microVMs.
const soakEnv = "TORPOR_SOAK"

// TestCrashMatrixRunc kills the daemon at every failpoint of every
// transition (lifecycle.Failpoints), and with kill -9 during a boot's
// setup, for container sandboxes; a restarted daemon must leave each
// sandbox in a true state with its files, nothing on the host that no
// sandbox holds, and a ledger that bills each second of its life once,
// as its transitions say.
func TestCrashMatrixRunc(t *testing.T) {
	needs(t)
	rig := newCrashRig(t, "runc", nil, nil)
	cases := crashCases([]torpor.PauseMode{torpor.PauseFreeze})
	// A runtime that only freezes reaches the in-between records of a
	// pause only through the idle engine, and that of a resume never.
	rig.mustCoverFailpoints(cases, lifecycle.InBetweenFailpoints()...)
	rig.run(t, cases)
}

// TestCrashMatrixVM is the crash matrix for microVM sandboxes, paused by
// snapshot and by freeze. A microVM boots in seconds (under emulation
// where KVM cannot run the guest), so only a few points run by default;
// TORPOR_SOAK=1 runs every one.
func TestCrashMatrixVM(t *testing.T) {
	env := needsVM(t)
	rig := newCrashRig(t, "vm", env, []string{"--isolation", "vm", "--memory", "256"})
	cases := crashCases([]torpor.PauseMode{torpor.PauseSnapshot, torpor.PauseFreeze})
	// The claim cases' warm pool boots the base template's default, a
	// container: a microVM's create claims none of it, so the claim's
	// points are the runc matrix's.
	cases = slices.DeleteFunc(cases, func(c crashCase) bool { return slices.Contains(claimFailpoints, c.arm) })
	// MicroVMs have no checkpoints or forks yet (docs/fork.md).
	cases = slices.DeleteFunc(cases, func(c crashCase) bool { return slices.Contains(checkpointFailpoints(), c.arm) })
	if os.Getenv(soakEnv) == "" {
		quick := []string{
			"create/create.before-runtime",
			"pause/snapshot/pausing.before-runtime",
			"pause/snapshot/pausing.after-runtime",
			"resume/snapshot/resuming.after-runtime",
			"hibernate/hibernating.after-runtime",
			"restart/restarting.after-runtime",
			"delete/snapshot/terminating.before-runtime",
		}
		cases = slices.DeleteFunc(cases, func(c crashCase) bool { return !slices.Contains(quick, c.name) })
		t.Logf("%d of the VM crash points (%s=1 runs all of them)", len(cases), soakEnv)
	} else {
		rig.mustCoverFailpoints(cases, append(slices.Clone(claimFailpoints), checkpointFailpoints()...)...)
	}
	rig.run(t, cases)
}

// crashFrom is the state a case brings its sandbox into before the verb.
type crashFrom struct {
	state torpor.State // "" when the verb makes the sandbox
	mode  torpor.PauseMode
}

// crashCase is one point of the matrix: a verb driven from a state, the
// failpoint armed (none for a kill from outside), and the state a
// restarted daemon must leave the sandbox in: the state before the verb
// when nothing of it was stored, else the one it was heading for ("" for
// no sandbox at all).
type crashCase struct {
	name  string
	from  crashFrom
	arm   string
	drive func(t *testing.T, r *crashRig, d *daemon, id string)
	want  crashFrom
	// undo, when set, takes back what drive changed of the sandbox
	// besides its state.
	undo func(d *daemon, id string)
	// armEnv is more environment for the armed daemon only (a warm pool
	// for a create to claim); the daemons before and after it keep none.
	armEnv []string
	// check, when set, checks more of the sandbox a restart left.
	check func(t *testing.T, r *crashRig, d *daemon, sb *torpor.Sandbox)
}

// claimFailpoints are the points of a create that claims a warm pool's
// member (lifecycle/failpoints.go).
var claimFailpoints = []string{"claim.after-thaw", "claim.after-store"}

// warmPool is the pool the claim cases' armed daemon fills: one member
// of the template a plain create boots.
const warmPool = "TORPOR_WARM_POOLS=base=1"

var (
	inRunning    = crashFrom{state: torpor.StateRunning}
	inHibernated = crashFrom{state: torpor.StateHibernated}
	inArchived   = crashFrom{state: torpor.StateArchived}
	inTerminated = crashFrom{state: torpor.StateTerminated}
)

func inPaused(m torpor.PauseMode) crashFrom { return crashFrom{torpor.StatePaused, m} }

// crashVerb drives a CLI verb on the sandbox (its id in place of "ID"),
// which must fail: the daemon dies under it.
func crashVerb(args ...string) func(t *testing.T, r *crashRig, d *daemon, id string) {
	return func(t *testing.T, r *crashRig, d *daemon, id string) {
		argv := slices.Clone(args)
		for i, a := range argv {
			if a == "ID" {
				argv[i] = id
			}
		}
		if argv[0] == "create" {
			argv = append(argv, r.create...)
		}
		if out, _, code := d.cli(argv...); code == 0 {
			t.Errorf("torpor %s succeeded although the daemon was to die: %s", strings.Join(argv, " "), out)
		}
	}
}

// crashAt is a failpoint and the state a restart must leave the sandbox
// in when the daemon dies there.
type crashAt struct {
	point string
	want  crashFrom
}

// crashCases is the matrix of a runtime that pauses by modes (its
// default first): each transition from each state it starts from, with
// each of its points.
func crashCases(modes []torpor.PauseMode) []crashCase {
	var cs []crashCase
	add := func(path string, from crashFrom, drive func(*testing.T, *crashRig, *daemon, string), points ...crashAt) {
		for _, p := range points {
			cs = append(cs, crashCase{name: path + "/" + p.point, from: from, arm: p.point, drive: drive, want: p.want})
		}
	}
	add("create", crashFrom{}, crashVerb("create"),
		crashAt{"create.before-store", crashFrom{}},
		crashAt{"create.before-runtime", inRunning},
		crashAt{"starting.after-runtime", inRunning},
		crashAt{"started.after-store", inRunning})
	// A create that claims a warm pool's member: the armed daemon fills
	// its pool, and the create claims the member. Cut short after the
	// thaw, nothing of the create is stored (the member's record is
	// still the pool's, and the restart removes it); after its write,
	// the claimant's sandbox runs, from the pool, billed from the claim.
	claim := func(t *testing.T, r *crashRig, d *daemon, _ string) {
		waitPool(t, d, d.client(t), "base", readyIs(1))
		// The member booted and froze before now: a claimant's sandbox
		// created, or billed, before this instant holds the pool's time.
		r.claimFrom = time.Now()
		crashVerb("create")(t, r, d, "")
	}
	add("create/pool", crashFrom{}, claim,
		crashAt{"claim.after-thaw", crashFrom{}},
		crashAt{"claim.after-store", inRunning})
	for i := len(cs) - 2; i < len(cs); i++ {
		cs[i].armEnv = []string{warmPool}
	}
	cs[len(cs)-1].check = checkClaimed
	for _, m := range modes {
		pause := crashVerb("pause", "ID", "--mode", string(m))
		if m == torpor.PauseFreeze {
			// A pause by freeze stores nothing before its one write: up
			// to there the sandbox stays running, its instance thawed.
			add("pause/"+string(m), inRunning, pause,
				crashAt{"pausing.before-runtime", inRunning},
				crashAt{"pausing.after-runtime", inRunning},
				crashAt{"paused.after-store", inPaused(m)})
			continue
		}
		add("pause/"+string(m), inRunning, pause,
			crashAt{"pausing.before-store", inRunning},
			crashAt{"pausing.after-store", inPaused(m)},
			crashAt{"pausing.before-runtime", inPaused(m)},
			crashAt{"pausing.after-runtime", inPaused(m)},
			crashAt{"paused.after-store", inPaused(m)})
	}
	for _, m := range modes {
		if m == torpor.PauseFreeze {
			// Nor does a resume from a freeze: up to its one write the
			// sandbox stays paused, its instance frozen again.
			add("resume/"+string(m), inPaused(m), crashVerb("start", "ID"),
				crashAt{"resuming.before-runtime", inPaused(m)},
				crashAt{"resuming.after-runtime", inPaused(m)},
				crashAt{"resumed.after-store", inRunning})
			continue
		}
		add("resume/"+string(m), inPaused(m), crashVerb("start", "ID"),
			crashAt{"resuming.before-store", inPaused(m)},
			crashAt{"resuming.before-runtime", inRunning},
			crashAt{"resuming.after-runtime", inRunning},
			crashAt{"resumed.after-store", inRunning})
	}
	add("hibernate", inRunning, crashVerb("hibernate", "ID"),
		crashAt{"hibernating.before-store", inRunning},
		crashAt{"hibernating.after-store", inHibernated},
		crashAt{"hibernating.before-runtime", inHibernated},
		crashAt{"hibernating.after-runtime", inHibernated},
		crashAt{"hibernated.after-store", inHibernated})
	add("start", inHibernated, crashVerb("start", "ID"),
		crashAt{"starting.before-store", inHibernated},
		crashAt{"starting.before-runtime", inRunning},
		crashAt{"starting.after-runtime", inRunning},
		crashAt{"started.after-store", inRunning})
	// The archive tier (docs/archive.md): an archive, a restore (a start
	// of an archived sandbox) and a delete of an archived one.
	add("archive", inHibernated, crashVerb("archive", "ID"),
		crashAt{"archiving.before-store", inHibernated},
		crashAt{"archiving.after-store", inHibernated},
		crashAt{"archiving.after-upload", inHibernated},
		crashAt{"archived.after-store", inArchived})
	add("start/archived", inArchived, crashVerb("start", "ID"),
		crashAt{"restoring.before-import", inArchived},
		crashAt{"restoring.after-import", inArchived},
		crashAt{"restored.before-drop", inRunning})
	add("delete/archived", inArchived, crashVerb("rm", "ID"),
		crashAt{"terminating.after-archive-drop", inTerminated})
	// Checkpoints, fork and restore (docs/fork.md): the carrier is where
	// it was; a fork's forks all stand or none does (checkForks), and no
	// copy is left that no record names (checkCheckpointCopies).
	add("checkpoint", inRunning, crashVerb("checkpoint", "ID", "--name", "crash-cp"),
		crashAt{"checkpointing.before-store", inRunning},
		crashAt{"checkpointing.after-store", inRunning},
		crashAt{"checkpointing.after-copy", inRunning})
	add("checkpoint/rm", inRunning, func(t *testing.T, r *crashRig, d *daemon, id string) {
		d.ok("checkpoint", id, "--name", "crash-rm")
		crashVerb("checkpoint", "rm", "ID", "crash-rm")(t, r, d, id)
	}, crashAt{"checkpoint-delete.after-store", inRunning})
	add("restore", inRunning, func(t *testing.T, r *crashRig, d *daemon, id string) {
		d.ok("checkpoint", id, "--name", "crash-rs")
		crashVerb("restore", "ID", "--checkpoint", "crash-rs")(t, r, d, id)
	}, crashAt{"restoring-checkpoint.before-store", inRunning},
		crashAt{"restoring-checkpoint.after-store", inRunning},
		crashAt{"restoring-checkpoint.after-copy", inRunning})
	for i := len(cs) - 7; i < len(cs); i++ {
		cs[i].check = checkCheckpointCopies
		cs[i].undo = func(d *daemon, id string) {
			for _, n := range []string{"crash-cp", "crash-rm", "crash-rs"} {
				d.cli("checkpoint", "rm", id, n)
			}
		}
	}
	add("fork", inRunning, crashVerb("fork", "ID", "--count", "2"),
		crashAt{"forking.before-store", inRunning},
		crashAt{"forking.after-store", inRunning},
		crashAt{"forking.after-checkpoint", inRunning},
		crashAt{"forking.after-clone", inRunning},
		crashAt{"forking.before-commit", inRunning},
		crashAt{"forking.after-commit", inRunning})
	for i := len(cs) - 6; i < len(cs); i++ {
		cs[i].check = checkForks(cs[i].arm == "forking.after-commit")
		cs[i].undo = removeForks
	}
	add("restart", inRunning, crashVerb("restart", "ID"),
		crashAt{"restarting.before-store", inRunning},
		crashAt{"restarting.before-runtime", inRunning},
		crashAt{"restarting.after-runtime", inRunning},
		crashAt{"restarted.after-store", inRunning})
	for _, from := range []crashFrom{inRunning, inPaused(modes[0])} {
		path := "delete"
		if from.state == torpor.StatePaused {
			path += "/" + string(from.mode)
		}
		add(path, from, crashVerb("rm", "ID"),
			crashAt{"terminating.before-store", from},
			crashAt{"terminating.before-runtime", inTerminated},
			crashAt{"terminating.after-runtime", inTerminated},
			crashAt{"terminated.after-store", inTerminated})
	}
	// The idle engine pauses through the same verb, by the runtime's
	// default mode, and stores pausing first even by freeze (it tells the
	// proxy before it looks for requests under way).
	add("idle", inRunning, func(t *testing.T, r *crashRig, d *daemon, id string) {
		d.ok("update", id, "--timeout", "1", "--on-timeout", "pause")
	}, crashAt{"pausing.after-store", inPaused(modes[0])}, crashAt{"pausing.after-runtime", inPaused(modes[0])})
	for i := len(cs) - 2; i < len(cs); i++ {
		cs[i].undo = func(d *daemon, id string) { d.ok("update", id, "--timeout", "0") }
	}
	// kill -9 from outside while a boot runs its setup, between the
	// runtime calls the failpoints bracket.
	cs = append(cs, crashCase{name: "create/kill-9-during-setup", drive: func(t *testing.T, r *crashRig, d *daemon, _ string) {
		// The shell of a container's setup shows among the host's
		// processes by its marker (the true after the sleep keeps it).
		setup := ": " + setupMarker() + "; sleep 2; true"
		if r.kind == "vm" {
			setup = "sleep 6" // see waitSetup
		}
		had := r.qemus()
		done := make(chan struct{})
		go func() {
			defer close(done)
			d.cli(append([]string{"create", "--setup", setup}, r.create...)...)
		}()
		r.waitSetup(t, d, had)
		_ = d.cmd.Process.Kill()
		<-done
	}, want: inRunning})
	return cs
}

// crashRig is the data dir, daemon binary and runtime one matrix goes
// through, case after case; a sandbox (the carrier) is brought from case
// to case into the state each starts from, so that it lives through all
// of them with its file.
type crashRig struct {
	t       *testing.T
	kind    string
	bin     string
	dataDir string
	env     []string // for every daemon: the runtime's settings
	create  []string // the create flags of the runtime's sandboxes
	carrier string
	// tally counts what the checks found, by kind, for the summary.
	tally map[string]int
	ran   int
	// claimFrom is when the claim case's create was sent.
	claimFrom time.Time
}

// newCrashRig returns a rig whose sandboxes are all deleted, and checked,
// when the test ends, whichever of its cases ran and however they ended.
func newCrashRig(t *testing.T, kind string, env, create []string) *crashRig {
	r := &crashRig{t: t, kind: kind, bin: torporBin(t), dataDir: t.TempDir(), env: env, create: create, tally: map[string]int{}}
	t.Cleanup(r.finish)
	return r
}

// mustCoverFailpoints fails unless the cases arm every failpoint the
// engine has, so that a point added later cannot be left out; unreached
// are the points the runtime's transitions do not (all) pass.
func (r *crashRig) mustCoverFailpoints(cases []crashCase, unreached ...string) {
	for _, at := range lifecycle.Failpoints() {
		if slices.Contains(unreached, at) {
			continue
		}
		if !slices.ContainsFunc(cases, func(c crashCase) bool { return c.arm == at }) {
			r.t.Fatalf("no %s crash case arms failpoint %s", r.kind, at)
		}
	}
}

func (r *crashRig) run(t *testing.T, cases []crashCase) {
	start := time.Now()
	points := map[string]bool{}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			r.ran++
			if c.arm != "" {
				points[c.arm] = true
			}
			r.runCase(t, c)
		})
	}
	t.Logf("%s crash matrix: %d cases (%d failpoints), %s; lost %d, left transitional %d, in a wrong state %d, orphans %d, ledger errors %d",
		r.kind, r.ran, len(points), time.Since(start).Round(time.Second),
		r.tally["lost"], r.tally["transitional"], r.tally["state"], r.tally["orphan"], r.tally["ledger"])
}

// fail records a finding of a kind: lost (a sandbox or its file),
// transitional (a sandbox left in an in-between state), state (another
// state than the crash point leads to), orphan, ledger.
func (r *crashRig) fail(t *testing.T, kind, format string, args ...any) {
	t.Helper()
	r.tally[kind]++
	t.Errorf(kind+": "+format, args...)
}

func (r *crashRig) runCase(t *testing.T, c crashCase) {
	d := startDaemon(t, r.bin, r.dataDir, r.env...)
	id := r.prepare(t, d, c.from)
	before, beforeAll := r.ids(t, d), r.allTenantIDs(t, d)
	d.stop()

	env := append(slices.Clone(r.env), c.armEnv...)
	if c.arm != "" {
		env = append(env, failpointEnv+"="+c.arm)
	}
	d = startDaemon(t, r.bin, r.dataDir, env...)
	c.drive(t, r, d, id)
	d.waitDied()

	d = startDaemon(t, r.bin, r.dataDir, r.env...)
	defer func() {
		if t.Failed() {
			t.Logf("the restarted daemon's log:\n%s", d.logs.String())
		}
		d.stop() // sandboxes stay for the next case
	}()
	if id == "" {
		if id = r.newID(t, d, before); id == "" && c.want.state != "" {
			r.fail(t, "lost", "the sandbox being created is gone")
			return
		}
		if c.want.state == "" {
			if id != "" {
				r.fail(t, "orphan", "a crash before the sandbox was stored left sandbox %s", id)
			}
			// Nor does any other tenant see one (a claim cut short
			// leaves a record of the pool's, which no tenant lists).
			for _, sb := range r.sandboxesOf(t, d, client.AllTenants) {
				if !slices.Contains(beforeAll, sb.ID) && sb.ID != id {
					r.fail(t, "orphan", "a crash before the sandbox was stored left sandbox %s of tenant %s", sb.ID, sb.Tenant)
				}
			}
			r.checkHost(t, d)
			return
		}
	}
	sb := d.get(id)
	switch {
	case sb.State.Transitional():
		r.fail(t, "transitional", "sandbox %s is left %s", id, sb.State)
	case sb.State != c.want.state || (sb.State == torpor.StatePaused && sb.PauseMode != c.want.mode):
		r.fail(t, "state", "sandbox %s is %s (%s), want %s (%s)", id, sb.State, sb.PauseMode, c.want.state, c.want.mode)
	}
	r.checkHost(t, d)
	r.checkLedger(t, d, id)
	if c.check != nil {
		c.check(t, r, d, sb)
	}
	if c.from.state == "" {
		// A new sandbox: it takes over from the carrier, with a file.
		if r.carrier != "" {
			d.ok("rm", r.carrier)
			r.checkLedger(t, d, r.carrier)
		}
		d.ok("exec", id, "--", "sh", "-c", "echo yes > /kept")
		r.carrier = id
	}
	if c.undo != nil {
		c.undo(d, id)
	}
	if sb.State == torpor.StateTerminated {
		assertNoTrace(t, id)
		r.carrier = ""
		return
	}
	// It goes on: it runs again, with its file, and leaves nothing behind.
	if sb.State != torpor.StateRunning {
		d.ok("start", id)
	}
	if out := d.ok("exec", id, "--", "cat", "/kept"); out != "yes\n" {
		r.fail(t, "lost", "the file of sandbox %s: %q", id, out)
	}
	r.checkHost(t, d)
}

// prepare brings the carrier (a new one when there is none) into from
// and returns it; "" when the case makes its own sandbox.
func (r *crashRig) prepare(t *testing.T, d *daemon, from crashFrom) string {
	if from.state == "" {
		return ""
	}
	if r.carrier == "" || d.get(r.carrier).State == torpor.StateTerminated {
		r.carrier = strings.TrimSpace(d.ok(append([]string{"create"}, r.create...)...))
		d.ok("exec", r.carrier, "--", "sh", "-c", "echo yes > /kept")
	}
	id := r.carrier
	sb := d.get(id)
	if sb.State == from.state && sb.PauseMode == from.mode {
		return id
	}
	if sb.State != torpor.StateRunning {
		d.ok("start", id)
	}
	switch from.state {
	case torpor.StatePaused:
		d.ok("pause", id, "--mode", string(from.mode))
	case torpor.StateHibernated:
		d.ok("hibernate", id)
	case torpor.StateArchived:
		d.ok("hibernate", id)
		d.ok("archive", id)
	}
	return id
}

// setupMarker names the setup of the kill -9 case among processes. It
// holds the test process's pid, so that a crash matrix run beside this
// one (another checkout's) cannot be taken for it.
func setupMarker() string { return fmt.Sprintf("torpor-crash-setup-%d", os.Getpid()) }

// waitSetup waits until a sandbox being created runs its setup: a
// container's is a process of the host; a microVM's runs in its guest, so
// it waits for a new QEMU and then for longer than the guest takes to
// boot under emulation (its setup sleeps for longer still).
func (r *crashRig) waitSetup(t *testing.T, d *daemon, had map[string]int) {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		// The CLI that asks for the create carries the marker in its
		// arguments too, before the daemon has stored anything: only
		// the setup's own processes, which the boot starts, count.
		for _, cmdline := range processesWith(setupMarker()) {
			if !strings.HasPrefix(cmdline, d.bin+"\x00") {
				return
			}
		}
		for id := range r.qemus() {
			if had[id] == 0 {
				time.Sleep(4 * time.Second)
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("the setup did not start:\n%s", d.logs.String())
}

// checkClaimed checks the sandbox a crash after a claim's write left: it
// is the pool's member, now the claimant's, and its ledger and events
// start at the claim, not at the member's boot (whose time is the pool's).
func checkClaimed(t *testing.T, r *crashRig, d *daemon, sb *torpor.Sandbox) {
	t.Helper()
	if !sb.FromPool {
		r.fail(t, "state", "sandbox %s was not claimed from the pool (from_pool false)", sb.ID)
	}
	if sb.CreatedAt.Before(r.claimFrom) {
		r.fail(t, "ledger", "sandbox %s is created at %s, before its claim was sent at %s", sb.ID, sb.CreatedAt, r.claimFrom)
	}
	cl := d.client(t)
	evs := sandboxEvents(t, cl, sb.ID)
	if len(evs) < 2 || evs[0].Type != torpor.EventCreated || evs[0].Attrs["pool"] != "true" || !evs[0].Time.Equal(sb.CreatedAt) {
		r.fail(t, "ledger", "the events of claimed sandbox %s do not start with its claim at %s: %+v", sb.ID, sb.CreatedAt, evs)
	}
	// Every tenant's rows of the sandbox (checkLedger reads its own
	// tenant's): the member's time before the claim is billed to the
	// pool, each second once, and none of the claimant's before it.
	rep, err := cl.Usage(context.Background(), client.UsageQuery{Sandbox: sb.ID})
	if err != nil {
		t.Fatal(err)
	}
	pooled := 0
	for _, row := range rep.Rows {
		switch {
		case row.Tenant == torpor.PoolTenant:
			pooled++
			if row.End.After(sb.CreatedAt) {
				r.fail(t, "ledger", "the pool is billed for claimed sandbox %s after its claim at %s: %+v", sb.ID, sb.CreatedAt, row)
			}
		case row.Start.Before(sb.CreatedAt):
			r.fail(t, "ledger", "tenant %s is billed for sandbox %s before its claim at %s: %+v", row.Tenant, sb.ID, sb.CreatedAt, row)
		}
	}
	if pooled == 0 {
		r.fail(t, "ledger", "claimed sandbox %s has no ledger rows of the pool's before the claim", sb.ID)
	}
}

func (r *crashRig) sandboxes(t *testing.T, d *daemon) []*torpor.Sandbox {
	return r.sandboxesOf(t, d, "")
}

// sandboxesOf lists the sandboxes of a tenant ("" the admin key's own,
// client.AllTenants every tenant's but the warm pools'), terminated ones
// included.
func (r *crashRig) sandboxesOf(t *testing.T, d *daemon, tenant string) []*torpor.Sandbox {
	sbs, err := d.client(t).List(context.Background(), client.ListOptions{All: true, Tenant: tenant})
	if err != nil {
		t.Fatal(err)
	}
	return sbs
}

// allTenantIDs returns the ids of every tenant's sandboxes.
func (r *crashRig) allTenantIDs(t *testing.T, d *daemon) []string {
	var ids []string
	for _, sb := range r.sandboxesOf(t, d, client.AllTenants) {
		ids = append(ids, sb.ID)
	}
	return ids
}

func (r *crashRig) ids(t *testing.T, d *daemon) []string {
	var ids []string
	for _, sb := range r.sandboxes(t, d) {
		ids = append(ids, sb.ID)
	}
	return ids
}

// newID returns the one sandbox not in before, or "".
func (r *crashRig) newID(t *testing.T, d *daemon, before []string) string {
	var ids []string
	for _, id := range r.ids(t, d) {
		if !slices.Contains(before, id) {
			ids = append(ids, id)
		}
	}
	if len(ids) > 1 {
		r.fail(t, "orphan", "one create made sandboxes %v", ids)
	}
	if len(ids) == 0 {
		return ""
	}
	return ids[0]
}

// finish deletes every sandbox and checks their whole ledgers and that
// nothing of them is left.
func (r *crashRig) finish() {
	t := r.t
	if r.ran == 0 {
		return
	}
	d := startDaemon(t, r.bin, r.dataDir, r.env...)
	defer d.stop()
	for _, sb := range r.sandboxes(t, d) {
		if sb.State != torpor.StateTerminated {
			d.ok("rm", sb.ID)
		}
	}
	for _, sb := range r.sandboxes(t, d) {
		r.checkLedger(t, d, sb.ID)
		assertNoTrace(t, sb.ID)
	}
	r.checkHost(t, d)
}

// holdsInstance reports whether sb holds an instance on the host: a
// running or frozen one (a snapshot pause ends it).
func holdsInstance(sb *torpor.Sandbox) bool {
	return sb.State == torpor.StateRunning || (sb.State == torpor.StatePaused && sb.PauseMode != torpor.PauseSnapshot)
}

// checkHost checks that what is on the host under the rig's data dir is
// what its sandboxes hold, and no more: a container (runc), QEMU (vm),
// mounts and cgroups for each running or frozen one, a snapshot for each
// one paused by snapshot, a disk for each one not terminated, and no
// address leased to a terminated one. What a transition ends may take a
// moment to go, so it looks again for a few seconds before it reports.
func (r *crashRig) checkHost(t *testing.T, d *daemon) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		problems := r.hostProblems(t, d)
		if len(problems) == 0 {
			return
		}
		if time.Now().After(deadline) {
			for _, p := range problems {
				r.fail(t, "orphan", "%s", p)
			}
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func (r *crashRig) hostProblems(t *testing.T, d *daemon) []string {
	byID := map[string]*torpor.Sandbox{}
	for _, sb := range r.sandboxes(t, d) {
		byID[sb.ID] = sb
	}
	var problems []string
	// A warm pool's members are no tenant's, so their instances, disks
	// and leases count below as of no sandbox. Only the armed daemon of
	// a claim case keeps a pool: a daemon removes the members of pools it
	// does not keep (those it reconciles cut short at once, frozen ones
	// in the background, which the retries of checkHost wait for), so a
	// member a later daemon still has is left over.
	pools, err := d.client(t).Pools(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pools {
		if p.Ready > 0 {
			problems = append(problems, fmt.Sprintf("%d members of warm pool %s on a daemon that keeps none (size %d)", p.Ready, p.Template, p.Size))
		}
	}
	// want compares what the host has (by sandbox id) with what each
	// sandbox of kind should have.
	want := func(what, kind string, has map[string]int, should func(*torpor.Sandbox) bool) {
		for id, n := range has {
			sb := byID[id]
			switch {
			case sb == nil:
				problems = append(problems, fmt.Sprintf("%s of no sandbox: %s", what, id))
			case sb.Runtime.Kind != kind || !should(sb):
				problems = append(problems, fmt.Sprintf("%s of %s, which is %s (%s)", what, id, sb.State, sb.PauseMode))
			case n > 1:
				problems = append(problems, fmt.Sprintf("%d %ss of %s", n, what, id))
			}
		}
		for id, sb := range byID {
			if sb.Runtime.Kind == kind && should(sb) && has[id] == 0 {
				problems = append(problems, fmt.Sprintf("no %s for %s, which is %s (%s)", what, id, sb.State, sb.PauseMode))
			}
		}
	}
	live := func(sb *torpor.Sandbox) bool { return sb.State != torpor.StateTerminated }
	snapshotted := func(sb *torpor.Sandbox) bool {
		return sb.State == torpor.StatePaused && sb.PauseMode == torpor.PauseSnapshot
	}
	if r.kind == "runc" {
		containers, states := r.runcContainers(t)
		want("container", "runc", containers, holdsInstance)
		for id, st := range states {
			if sb := byID[id]; sb != nil && holdsInstance(sb) && st != map[torpor.State]string{torpor.StateRunning: "running", torpor.StatePaused: "paused"}[sb.State] {
				problems = append(problems, fmt.Sprintf("the container of %s is %s, the sandbox %s", id, st, sb.State))
			}
		}
		want("cgroup", "runc", r.cgroups(), holdsInstance)
	}
	if r.kind == "vm" {
		want("QEMU process", "vm", r.qemus(), holdsInstance)
		want("snapshot", "vm", r.globIDs(filepath.Join(r.dataDir, "vm", "sandboxes", "*", "snapshot")), snapshotted)
	}
	want("disk", r.kind, r.globIDs(filepath.Join(r.dataDir, r.kind, "sandboxes", "*")), func(sb *torpor.Sandbox) bool {
		return live(sb) && sb.State != torpor.StateArchived
	})
	want("archive", r.kind, r.archiveIDs(), func(sb *torpor.Sandbox) bool { return sb.State == torpor.StateArchived })
	mounts, others := r.mounts()
	problems = append(problems, others...)
	for id, n := range mounts {
		if sb := byID[id]; sb == nil || !holdsInstance(sb) {
			problems = append(problems, fmt.Sprintf("%d mounts or loop devices of %s, which is not running or frozen", n, id))
		}
	}
	for id := range r.leases() {
		if sb := byID[id]; sb == nil || !live(sb) {
			problems = append(problems, fmt.Sprintf("an address leased to %s, which is terminated", id))
		}
	}
	sort.Strings(problems)
	return problems
}

// archiveIDs counts the archives in the daemon's local archive store
// (DATA/archive/archives/ID/KEY), by sandbox.
func (r *crashRig) archiveIDs() map[string]int {
	out := map[string]int{}
	matches, _ := filepath.Glob(filepath.Join(r.dataDir, "archive", "archives", "*", "*"))
	for _, m := range matches {
		out[filepath.Base(filepath.Dir(m))]++
	}
	return out
}

// sandboxOf returns the id of the sandbox a path under the data dir is
// of (DATA/KIND/sandboxes/ID/...), or "".
func (r *crashRig) sandboxOf(p string) string {
	rel, err := filepath.Rel(r.dataDir, p)
	if err != nil {
		return ""
	}
	parts := strings.Split(rel, string(filepath.Separator))
	if len(parts) < 3 || parts[1] != "sandboxes" || !torpor.ValidID(parts[2]) {
		return ""
	}
	return parts[2]
}

func (r *crashRig) globIDs(pattern string) map[string]int {
	out := map[string]int{}
	matches, _ := filepath.Glob(pattern)
	for _, m := range matches {
		if id := r.sandboxOf(m); id != "" {
			out[id]++
		}
	}
	return out
}

// runcContainers lists the containers under the runtime's runc root
// (DATA/runc/runc) and their status.
func (r *crashRig) runcContainers(t *testing.T) (map[string]int, map[string]string) {
	out, err := exec.Command("runc", "--root", filepath.Join(r.dataDir, "runc", "runc"), "list", "--format", "json").Output()
	if err != nil {
		t.Fatalf("runc list: %v", err)
	}
	var list []struct{ ID, Status string }
	if s := strings.TrimSpace(string(out)); s != "" && s != "null" {
		if err := json.Unmarshal(out, &list); err != nil {
			t.Fatalf("runc list: %v: %s", err, out)
		}
	}
	ids, states := map[string]int{}, map[string]string{}
	for _, c := range list {
		ids[c.ID]++
		states[c.ID] = c.Status
	}
	return ids, states
}

// cgroups lists the sandboxes' cgroups under the runtime's cgroup parent
// in every hierarchy: "torpor/" and a hash of its state dir (see
// runc.Config.CgroupParent), one per sandbox and hierarchy.
func (r *crashRig) cgroups() map[string]int {
	sum := sha256.Sum256([]byte(filepath.Join(r.dataDir, "runc")))
	parent := "torpor/" + hex.EncodeToString(sum[:4])
	out := map[string]int{}
	for _, pattern := range []string{"/sys/fs/cgroup/*/" + parent + "/*", "/sys/fs/cgroup/" + parent + "/*"} {
		matches, _ := filepath.Glob(pattern)
		for _, m := range matches {
			if fi, err := os.Stat(m); err == nil && fi.IsDir() {
				out[filepath.Base(m)] = 1 // one in each hierarchy
			}
		}
	}
	return out
}

// qemus counts the QEMU processes of each sandbox of the data dir.
func (r *crashRig) qemus() map[string]int {
	re := regexp.MustCompile(regexp.QuoteMeta(filepath.Join(r.dataDir, "vm", "sandboxes")) + `/([a-z0-9]+)/`)
	out := map[string]int{}
	for _, cmdline := range processesWith("qemu-system") {
		if m := re.FindStringSubmatch(cmdline); m != nil {
			out[m[1]]++
		}
	}
	return out
}

// processesWith returns the command lines of the host's processes that
// contain s.
func processesWith(s string) []string {
	var out []string
	procs, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	for _, p := range procs {
		if b, err := os.ReadFile(p); err == nil && strings.Contains(string(b), s) {
			out = append(out, string(b))
		}
	}
	return out
}

// mounts counts the mounts under the data dir, and the loop devices
// backed by its files (a sandbox's disk image), by sandbox, and describes
// those of no sandbox.
func (r *crashRig) mounts() (map[string]int, []string) {
	var paths []string
	b, _ := os.ReadFile("/proc/self/mountinfo")
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 5 {
			paths = append(paths, f[4])
		}
	}
	loops, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, l := range loops {
		if b, err := os.ReadFile(l); err == nil {
			paths = append(paths, strings.TrimSpace(string(b)))
		}
	}
	out := map[string]int{}
	var others []string
	spares := 0
	for _, p := range paths {
		if !strings.HasPrefix(p, r.dataDir+"/") {
			continue
		}
		// The runc runtime's spare disks (runtime/runc/spare.go): one per
		// disk size of its last two, none of a daemon that died.
		if filepath.Dir(p) == filepath.Join(r.dataDir, "runc", "disks") && strings.HasPrefix(filepath.Base(p), "spare.") {
			if spares++; spares > 2 {
				others = append(others, "a spare disk beyond two: "+p)
			}
			continue
		}
		if id := r.sandboxOf(p); id != "" {
			out[id]++
		} else {
			others = append(others, "a mount of no sandbox: "+p)
		}
	}
	return out, others
}

// leases returns the sandboxes of the data dir that hold an address on
// the sandbox network (a lease names the sandbox's network namespace).
func (r *crashRig) leases() map[string]int {
	out := map[string]int{}
	files, _ := filepath.Glob("/run/torpor/network/*/leases/*")
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var l struct{ NetNS string }
		if json.Unmarshal(b, &l) == nil {
			if id := r.sandboxOf(l.NetNS); id != "" {
				out[id]++
			}
		}
	}
	return out
}

// checkLedger checks that a sandbox's usage rows (its open interval
// included) cover its life from creation to now or its end once each, no
// gap and no overlap, as its event log says it was, and that a snapshot
// it held is billed.
func (r *crashRig) checkLedger(t *testing.T, d *daemon, id string) {
	t.Helper()
	ctx := context.Background()
	cl := d.client(t)
	sb, err := cl.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	// The sandbox's tenant's rows: an admin key's query of every
	// tenant's would hold, for a sandbox claimed from a warm pool, the
	// member's time before the claim, which is the pool's.
	rep, err := cl.Usage(ctx, client.UsageQuery{Sandbox: id, Tenant: sb.Tenant})
	if err != nil {
		t.Fatal(err)
	}
	rows := rep.Rows
	if rep.Truncated || len(rows) == 0 {
		r.fail(t, "ledger", "the ledger of %s: %d rows, truncated %v", id, len(rows), rep.Truncated)
		return
	}
	slices.SortFunc(rows, func(a, b torpor.UsageRecord) int { return a.Start.Compare(b.Start) })
	for _, row := range rows {
		if row.Kind == torpor.UsageSnapshotPaused && row.Seconds > 0 && row.SnapshotGiBSeconds <= 0 {
			r.fail(t, "ledger", "the snapshot of %s is not billed from %s to %s", id, row.Start, row.End)
		}
		if row.Open && sb.State == torpor.StateTerminated {
			r.fail(t, "ledger", "terminated sandbox %s has an open interval %+v", id, row)
		}
	}
	spans, err := torpor.SpansOfRows(rows)
	if err != nil {
		r.fail(t, "ledger", "%v", err)
		return
	}
	end := rows[len(rows)-1].End
	if sb.TerminatedAt != nil && !end.Equal(*sb.TerminatedAt) {
		r.fail(t, "ledger", "the ledger of %s ends at %s, the sandbox at %s", id, end, sb.TerminatedAt)
	}
	if !spans[0].Start.Equal(sb.CreatedAt) {
		r.fail(t, "ledger", "the ledger of %s starts at %s, the sandbox at %s", id, spans[0].Start, sb.CreatedAt)
	}
	if want := torpor.SpansOfEvents(sandboxEvents(t, cl, id), end); !slices.Equal(spans, want) {
		r.fail(t, "ledger", "the ledger of %s\n%v\ndiffers from its event log\n%v", id, spans, want)
	}
}

// sandboxEvents returns every event of a sandbox, oldest first.
func sandboxEvents(t *testing.T, cl *client.Client, id string) []torpor.Event {
	t.Helper()
	var events []torpor.Event
	for since := int64(0); ; {
		evs, next, err := cl.Events(context.Background(), id, since)
		if err != nil {
			t.Fatal(err)
		}
		if len(evs) == 0 {
			return events
		}
		events, since = append(events, evs...), next
	}
}
