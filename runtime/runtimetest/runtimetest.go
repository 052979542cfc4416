// Package runtimetest is the behaviour test suite every torpor.Runtime
// passes: run it from each implementation's tests with a Harness.
package runtimetest

import (
	"bytes"
	"context"
	"errors"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

// Harness says how to make the runtime under test and what it can do.
// The optional capabilities (torpor.Snapshotter, for one) need no field:
// the suite tests those the runtime implements, found by a type assertion
// as the engine finds them.
type Harness struct {
	// New returns a runtime. Every call returns a new object over the same
	// state (directory, host resources), as a restarted daemon would make:
	// the suite uses a second one to test reattachment.
	New func(t *testing.T) torpor.Runtime
	// Template is the template sandboxes boot from. Process tests expect a
	// busybox-like userland (sh, cat, sleep, kill, hostname).
	Template torpor.Template
	// Processes says the runtime really runs processes: setup commands,
	// entrypoints and exec, freezing, limits and isolation are then tested.
	// A fake runtime leaves it false and gets the state-machine tests.
	Processes bool
	// Network says sandboxes get an eth0 on the host's sandbox network
	// besides their loopback (else: the loopback only).
	Network bool
	// Exit, for a runtime that does not run processes, ends a sandbox's
	// instance as its entrypoint exiting with code would, so that the
	// suite can test a stopped instance without one. A runtime that runs
	// processes leaves it nil: the suite then boots an entrypoint that
	// exits.
	Exit func(t *testing.T, ref torpor.InstanceRef, code int)
	// Elsewhere, when set, returns a runtime over other state than New's
	// (another directory, another host), as another node of a fleet has:
	// the suite moves disks into it (torpor.DiskArchiver). Nil: they are
	// moved back into New's runtime after a Destroy.
	Elsewhere func(t *testing.T) torpor.Runtime
}

// safety bounds every test so that a hung runtime fails instead of
// blocking the test binary; it is no performance assertion.
const safety = 60 * time.Second

type suite struct {
	h  Harness
	rt torpor.Runtime
}

type testCase struct {
	name      string
	processes bool // needs Harness.Processes
	fn        func(t *testing.T, s *suite)
}

var cases = []testCase{
	{"KindAndPauseModes", false, testKind},
	{"BadIDIsRefused", false, testBadID},
	{"BadBootSpecIsRefused", false, testBadSpec},
	{"MissingInstance", false, testMissing},
	{"BootThenInspectRunning", false, testBootInspect},
	{"FreezeAndThawAreIdempotent", false, testFreezeIdempotent},
	{"StopAndDestroyAreIdempotent", false, testStopDestroyIdempotent},
	{"DestroyRemovesSandboxAndDisk", false, testDestroy},
	{"FreshRuntimeSeesInstance", false, testReattachState},
	{"StoppedInstanceRefusesVerbs", false, testStopped},
	{"Snapshot/EndsAndRestoresInstance", false, testSnapshot},
	{"DiskArchive/ExportStoppedImportElsewhere", false, testDiskArchive},
	{"SnapshotArchive/ExportSnapshottedRestoreElsewhere", false, testSnapshotArchive},
	{"Checkpoint/CloneAndRestore", false, testCheckpoint},
	{"Exec/OutputAndExitCode", true, testExecOutput},
	{"Exec/EnvAndCwd", true, testExecEnvCwd},
	{"Exec/Stdin", true, testExecStdin},
	{"Exec/CommandNotFound", true, testExecNotFound},
	{"Exec/TimeoutKillsProcessTree", true, testExecTimeout},
	{"Exec/FrozenInstanceIsRefused", true, testExecFrozen},
	{"Exec/CancelKillsCommand", true, testExecCancel},
	{"Freeze/StopsProcessesAndKeepsMemory", true, testFreezeCounter},
	{"Stop/KeepsDiskAndEndsProcesses", true, testStopKeepsDisk},
	{"Boot/AgainRunsSetupAndEntrypointAgain", true, testBootAgain},
	{"Boot/SetupFailure", true, testSetupFailure},
	{"Entrypoint/ExitIsReportedByWait", true, testEntrypointExit},
	{"Resources/OutOfMemory", true, testOOM},
	{"Reattach/ExecAndWaitFromFreshRuntime", true, testReattachProcesses},
	{"Isolation/SandboxesCannotSeeEachOther", true, testIsolation},
}

// Run runs the suite against the runtime h makes. Subtests run in
// parallel, each on sandboxes of its own that it destroys at the end.
func Run(t *testing.T, h Harness) {
	s := &suite{h: h, rt: h.New(t)}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if tc.processes && !h.Processes {
				t.Skip("the runtime does not run processes")
			}
			t.Parallel()
			tc.fn(t, s)
		})
	}
}

// ctx returns a context bounded by the safety timeout.
func testCtx(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), safety)
	t.Cleanup(cancel)
	return ctx
}

// spec returns a boot spec for a new sandbox id.
func (s *suite) spec() torpor.BootSpec {
	id := torpor.NewID("rt_", 12)
	return torpor.BootSpec{
		SandboxID: id,
		Template:  s.h.Template,
		Resources: torpor.Resources{VCPUs: 1, MemoryMiB: 256, Pids: 512},
		Hostname:  id,
	}
}

// boot boots spec and destroys the sandbox when the test ends.
func (s *suite) boot(t *testing.T, spec torpor.BootSpec) torpor.InstanceRef {
	t.Helper()
	ref := torpor.InstanceRef{SandboxID: spec.SandboxID}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), safety)
		defer cancel()
		if err := s.rt.Destroy(ctx, ref); err != nil {
			t.Errorf("cleanup: destroy %s: %v", ref.SandboxID, err)
		}
	})
	handle, err := s.rt.Boot(testCtx(t), spec)
	if err != nil {
		t.Fatalf("boot %s: %v", spec.SandboxID, err)
	}
	ref.Handle = handle
	return ref
}

// run executes cmd in ref and returns its output and exit code, failing
// the test on an error.
func (s *suite) run(t *testing.T, ref torpor.InstanceRef, cmd ...string) (stdout, stderr string, code int) {
	t.Helper()
	return runIn(t, s.rt, ref, torpor.ExecRequest{Cmd: cmd})
}

func runIn(t *testing.T, rt torpor.Runtime, ref torpor.InstanceRef, req torpor.ExecRequest) (string, string, int) {
	t.Helper()
	var out, errb bytes.Buffer
	req.Stdout, req.Stderr = &out, &errb
	res, err := rt.Exec(testCtx(t), ref, req)
	if err != nil {
		t.Fatalf("exec %q: %v", req.Cmd, err)
	}
	return out.String(), errb.String(), res.ExitCode
}

// sh runs a shell script in ref and returns its stdout, failing the test
// unless it exits 0.
func (s *suite) sh(t *testing.T, ref torpor.InstanceRef, script string) string {
	t.Helper()
	out, errs, code := s.run(t, ref, "/bin/sh", "-c", script)
	if code != 0 {
		t.Fatalf("sh -c %q: exit %d, stderr %q", script, code, errs)
	}
	return out
}

func (s *suite) inspect(t *testing.T, rt torpor.Runtime, ref torpor.InstanceRef) torpor.InstanceStatus {
	t.Helper()
	st, err := rt.Inspect(testCtx(t), ref)
	if err != nil {
		t.Fatalf("inspect %s: %v", ref.SandboxID, err)
	}
	return st
}

func (s *suite) wantState(t *testing.T, rt torpor.Runtime, ref torpor.InstanceRef, want torpor.InstanceState) torpor.InstanceStatus {
	t.Helper()
	st := s.inspect(t, rt, ref)
	if st.State != want {
		t.Fatalf("%s is %s, want %s (failure %+v)", ref.SandboxID, st.State, want, st.Failure)
	}
	return st
}

func wantCode(t *testing.T, what string, err error, code torpor.ErrorCode) {
	t.Helper()
	if !torpor.IsCode(err, code) {
		t.Fatalf("%s: err = %v, want %s", what, err, code)
	}
}

// eventually polls cond until it holds or the safety timeout passes.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(safety)
	for delay := time.Millisecond; !cond(); delay = min(2*delay, 50*time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(delay)
	}
}

// processNames lists the command names of the processes the sandbox sees.
func (s *suite) processNames(t *testing.T, ref torpor.InstanceRef) []string {
	t.Helper()
	return strings.Fields(s.sh(t, ref, "cat /proc/[0-9]*/comm 2>/dev/null; true"))
}

func count(list []string, name string) int {
	n := 0
	for _, s := range list {
		if s == name {
			n++
		}
	}
	return n
}

// liveVerbs returns, by name, the calls on ref that need a live instance:
// Freeze, Thaw, Exec, and Snapshot where the runtime has that capability.
func (s *suite) liveVerbs(ctx context.Context, ref torpor.InstanceRef) map[string]func() error {
	calls := map[string]func() error{
		"Freeze": func() error { return s.rt.Freeze(ctx, ref) },
		"Thaw":   func() error { return s.rt.Thaw(ctx, ref) },
		"Exec": func() error {
			_, err := s.rt.Exec(ctx, ref, torpor.ExecRequest{Cmd: []string{"true"}})
			return err
		},
	}
	if sn, ok := s.rt.(torpor.Snapshotter); ok {
		calls["Snapshot"] = func() error { _, err := sn.Snapshot(ctx, ref); return err }
	}
	return calls
}

func testKind(t *testing.T, s *suite) {
	if s.rt.Kind() == "" {
		t.Error("Kind is empty")
	}
	if len(s.rt.PauseModes()) == 0 {
		t.Error("PauseModes is empty")
	}
}

func testBadID(t *testing.T, s *suite) {
	ctx := testCtx(t)
	for _, id := range []string{"", "../escape", "UPPER", "a/b", "a b", strings.Repeat("a", 65), "x\x00"} {
		spec := s.spec()
		spec.SandboxID = id
		if _, err := s.rt.Boot(ctx, spec); !torpor.IsCode(err, torpor.EInvalid) {
			t.Errorf("Boot(%q): err = %v, want invalid_argument", id, err)
		}
	}
	ref := torpor.InstanceRef{SandboxID: "../escape"}
	calls := s.liveVerbs(ctx, ref)
	calls["Inspect"] = func() error { _, err := s.rt.Inspect(ctx, ref); return err }
	calls["Stop"] = func() error { return s.rt.Stop(ctx, ref) }
	calls["Destroy"] = func() error { return s.rt.Destroy(ctx, ref) }
	if sn, ok := s.rt.(torpor.Snapshotter); ok {
		calls["Restore"] = func() error { _, err := sn.Restore(ctx, ref); return err }
	}
	for name, call := range calls {
		if err := call(); !torpor.IsCode(err, torpor.EInvalid) {
			t.Errorf("%s with a bad id: err = %v, want invalid_argument", name, err)
		}
	}
}

// testBadSpec: a spec that torpor.BootSpec.Validate refuses is refused
// before it touches the sandbox: a new one gets no disk, a running one
// keeps its instance.
func testBadSpec(t *testing.T, s *suite) {
	ctx := testCtx(t)
	running := s.spec()
	ref := s.boot(t, running)
	for name, mod := range map[string]func(*torpor.BootSpec){
		"bad hostname":          func(sp *torpor.BootSpec) { sp.Hostname = "-bad host" },
		"env name with =":       func(sp *torpor.BootSpec) { sp.Env = map[string]string{"A=B": "c"} },
		"setup with NUL":        func(sp *torpor.BootSpec) { sp.Setup = []string{"true\x00"} },
		"empty entrypoint name": func(sp *torpor.BootSpec) { sp.Entrypoint = []string{""} },
		"negative resources":    func(sp *torpor.BootSpec) { sp.Resources.Pids = -1 },
		"too little memory":     func(sp *torpor.BootSpec) { sp.Resources.MemoryMiB = 4 },
	} {
		fresh := s.spec()
		mod(&fresh)
		freshRef := torpor.InstanceRef{SandboxID: fresh.SandboxID}
		t.Cleanup(func() { _ = s.rt.Destroy(context.Background(), freshRef) })
		if _, err := s.rt.Boot(ctx, fresh); !torpor.IsCode(err, torpor.EInvalid) {
			t.Errorf("Boot with %s: err = %v, want invalid_argument", name, err)
		}
		if st := s.inspect(t, s.rt, freshRef); st.State != torpor.InstanceMissing || st.DiskExists {
			t.Errorf("after Boot with %s: %+v, want missing without disk", name, st)
		}
		over := running
		mod(&over)
		if _, err := s.rt.Boot(ctx, over); !torpor.IsCode(err, torpor.EInvalid) {
			t.Errorf("Boot over a running instance with %s: err = %v, want invalid_argument", name, err)
		}
		s.wantState(t, s.rt, ref, torpor.InstanceRunning)
	}
}

func testMissing(t *testing.T, s *suite) {
	ctx := testCtx(t)
	ref := torpor.InstanceRef{SandboxID: s.spec().SandboxID}
	st := s.inspect(t, s.rt, ref)
	if st.State != torpor.InstanceMissing || st.DiskExists {
		t.Errorf("never booted: %+v, want missing without disk", st)
	}
	wantCode(t, "Freeze of a missing instance", s.rt.Freeze(ctx, ref), torpor.ENotFound)
	wantCode(t, "Thaw of a missing instance", s.rt.Thaw(ctx, ref), torpor.ENotFound)
	_, err := s.rt.Exec(ctx, ref, torpor.ExecRequest{Cmd: []string{"true"}})
	wantCode(t, "Exec in a missing instance", err, torpor.ENotFound)
	if err := s.rt.Stop(ctx, ref); err != nil {
		t.Errorf("Stop of a missing instance: %v", err)
	}
	if err := s.rt.Destroy(ctx, ref); err != nil {
		t.Errorf("Destroy of a missing sandbox: %v", err)
	}
}

func testBootInspect(t *testing.T, s *suite) {
	ref := s.boot(t, s.spec())
	st := s.wantState(t, s.rt, ref, torpor.InstanceRunning)
	if !st.DiskExists {
		t.Error("running instance has no disk")
	}
	ids, err := s.rt.List(testCtx(t))
	if err != nil {
		t.Fatal(err)
	}
	if count(ids, ref.SandboxID) != 1 {
		t.Errorf("List = %v, want it to hold %s once", ids, ref.SandboxID)
	}
}

func testFreezeIdempotent(t *testing.T, s *suite) {
	ctx := testCtx(t)
	ref := s.boot(t, s.spec())
	if err := s.rt.Thaw(ctx, ref); err != nil {
		t.Fatalf("Thaw of a running instance: %v", err)
	}
	for i := 0; i < 2; i++ {
		if err := s.rt.Freeze(ctx, ref); err != nil {
			t.Fatalf("Freeze #%d: %v", i+1, err)
		}
		s.wantState(t, s.rt, ref, torpor.InstanceFrozen)
	}
	for i := 0; i < 2; i++ {
		if err := s.rt.Thaw(ctx, ref); err != nil {
			t.Fatalf("Thaw #%d: %v", i+1, err)
		}
		s.wantState(t, s.rt, ref, torpor.InstanceRunning)
	}
}

func testStopDestroyIdempotent(t *testing.T, s *suite) {
	ctx := testCtx(t)
	ref := s.boot(t, s.spec())
	if err := s.rt.Freeze(ctx, ref); err != nil {
		t.Fatal(err)
	}
	// Stopping a frozen instance must not hang on it.
	for i := 0; i < 2; i++ {
		if err := s.rt.Stop(ctx, ref); err != nil {
			t.Fatalf("Stop #%d: %v", i+1, err)
		}
	}
	st := s.inspect(t, s.rt, ref)
	if st.State != torpor.InstanceMissing && st.State != torpor.InstanceStopped {
		t.Errorf("after Stop: %s, want missing or stopped", st.State)
	}
	if !st.DiskExists {
		t.Error("Stop removed the disk")
	}
	for i := 0; i < 2; i++ {
		if err := s.rt.Destroy(ctx, ref); err != nil {
			t.Fatalf("Destroy #%d: %v", i+1, err)
		}
	}
}

func testDestroy(t *testing.T, s *suite) {
	ctx := testCtx(t)
	ref := s.boot(t, s.spec())
	if err := s.rt.Destroy(ctx, ref); err != nil {
		t.Fatal(err)
	}
	st := s.inspect(t, s.rt, ref)
	if st.State != torpor.InstanceMissing || st.DiskExists {
		t.Errorf("after Destroy: %+v, want missing without disk", st)
	}
	ids, err := s.rt.List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if count(ids, ref.SandboxID) != 0 {
		t.Errorf("List after Destroy still has %s", ref.SandboxID)
	}
}

func testReattachState(t *testing.T, s *suite) {
	ctx := testCtx(t)
	ref := s.boot(t, s.spec())
	fresh := s.h.New(t)
	s.wantState(t, fresh, ref, torpor.InstanceRunning)
	if err := fresh.Freeze(ctx, ref); err != nil {
		t.Fatalf("Freeze from a fresh runtime: %v", err)
	}
	s.wantState(t, s.rt, ref, torpor.InstanceFrozen)
	if err := fresh.Thaw(ctx, ref); err != nil {
		t.Fatalf("Thaw from a fresh runtime: %v", err)
	}
	s.wantState(t, s.rt, ref, torpor.InstanceRunning)
	ids, err := fresh.List(ctx)
	if err != nil || count(ids, ref.SandboxID) != 1 {
		t.Errorf("fresh List = %v, %v; want it to hold %s", ids, err, ref.SandboxID)
	}
	if err := fresh.Stop(ctx, ref); err != nil {
		t.Fatalf("Stop from a fresh runtime: %v", err)
	}
	if st := s.inspect(t, s.rt, ref); st.State == torpor.InstanceRunning || st.State == torpor.InstanceFrozen {
		t.Errorf("after Stop from a fresh runtime: %s", st.State)
	}
}

// testStopped: an instance whose entrypoint exited is stopped, with the
// exit as its failure, for Wait and Inspect alike; the verbs that need a
// live instance answer a conflict (not not_found: there is an instance),
// and Stop and Destroy still work.
func testStopped(t *testing.T, s *suite) {
	if !s.h.Processes && s.h.Exit == nil {
		t.Skip("the runtime runs no processes and the harness has no Exit")
	}
	ctx := testCtx(t)
	spec := s.spec()
	if s.h.Processes {
		spec.Entrypoint = []string{"/bin/sh", "-c", "sleep 0.2; exit 7"}
	}
	ref := s.boot(t, spec)
	if !s.h.Processes {
		s.h.Exit(t, ref, 7)
	}
	st, err := s.rt.Wait(ctx, ref)
	if err != nil {
		t.Fatal(err)
	}
	check := func(what string, st torpor.InstanceStatus) {
		t.Helper()
		f := st.Failure
		if st.State != torpor.InstanceStopped || !st.DiskExists || f == nil || f.Code != torpor.FailureEntrypoint || f.ExitCode == nil || *f.ExitCode != 7 {
			t.Errorf("%s: %+v (failure %+v), want stopped with a disk, entrypoint_exited and exit code 7", what, st, f)
		}
	}
	check("Wait", st)
	check("Inspect", s.inspect(t, s.rt, ref))
	check("Inspect from a fresh runtime", s.inspect(t, s.h.New(t), ref))
	for name, call := range s.liveVerbs(ctx, ref) {
		wantCode(t, name+" of a stopped instance", call(), torpor.EConflict)
	}
	if err := s.rt.Stop(ctx, ref); err != nil {
		t.Fatalf("Stop of a stopped instance: %v", err)
	}
	if st := s.inspect(t, s.rt, ref); st.State == torpor.InstanceRunning || st.State == torpor.InstanceFrozen || !st.DiskExists {
		t.Errorf("after Stop: %+v, want no live instance and a disk", st)
	}
}

// wantSnapshotFailure checks that err is a *torpor.Error with Reason
// torpor.FailureSnapshot.
func wantSnapshotFailure(t *testing.T, what string, err error) {
	t.Helper()
	var te *torpor.Error
	if !errors.As(err, &te) || te.Reason != torpor.FailureSnapshot {
		t.Errorf("%s: err = %v, want a *torpor.Error with reason %s", what, err, torpor.FailureSnapshot)
	}
}

// testSnapshot runs a runtime with the snapshot pause (torpor.Snapshotter)
// through the snapshot's state machine: a snapshot ends the instance and
// keeps the disk, is idempotent, is restored by a fresh runtime (from a
// running or a frozen instance); Stop and Destroy drop it.
func testSnapshot(t *testing.T, s *suite) {
	sn, ok := s.rt.(torpor.Snapshotter)
	if !ok {
		t.Skip("the runtime has no snapshot pause")
	}
	ctx := testCtx(t)
	spec := s.spec()
	_, err := sn.Restore(ctx, torpor.InstanceRef{SandboxID: s.spec().SandboxID})
	wantSnapshotFailure(t, "Restore of a sandbox never booted", err)
	ref := s.boot(t, spec)
	if h, err := sn.Restore(ctx, ref); err != nil || h != ref.Handle {
		t.Errorf("Restore of a running instance: %q, %v; want its handle %q", h, err, ref.Handle)
	}

	info, err := sn.Snapshot(ctx, ref)
	if err != nil {
		t.Fatalf("Snapshot: %v", err)
	}
	if info.Path == "" || info.SizeBytes <= 0 {
		t.Errorf("snapshot info %+v, want a path and a size", info)
	}
	if st := s.inspect(t, s.rt, ref); st.State != torpor.InstanceMissing || !st.DiskExists {
		t.Fatalf("after Snapshot: %+v, want missing with a disk", st)
	}
	_, err = s.rt.Exec(ctx, ref, torpor.ExecRequest{Cmd: []string{"true"}})
	wantCode(t, "Exec in a snapshotted sandbox", err, torpor.ENotFound)
	wantCode(t, "Freeze of a snapshotted sandbox", s.rt.Freeze(ctx, ref), torpor.ENotFound)
	if again, err := sn.Snapshot(ctx, ref); err != nil || again.Path != info.Path {
		t.Errorf("Snapshot of a snapshotted sandbox: %+v, %v; want the snapshot %s", again, err, info.Path)
	}

	// A fresh runtime restores it, as after a daemon restart.
	fresh, ok := s.h.New(t).(torpor.Snapshotter)
	if !ok {
		t.Fatal("a fresh runtime has no snapshot pause")
	}
	if ref.Handle, err = fresh.Restore(ctx, ref); err != nil {
		t.Fatalf("Restore from a fresh runtime: %v", err)
	}
	s.wantState(t, s.rt, ref, torpor.InstanceRunning)

	// A frozen instance snapshots too, and comes back running.
	if err := s.rt.Freeze(ctx, ref); err != nil {
		t.Fatal(err)
	}
	if _, err := sn.Snapshot(ctx, ref); err != nil {
		t.Fatalf("Snapshot of a frozen instance: %v", err)
	}
	if ref.Handle, err = sn.Restore(ctx, ref); err != nil {
		t.Fatalf("Restore of a frozen instance's snapshot: %v", err)
	}
	s.wantState(t, s.rt, ref, torpor.InstanceRunning)

	// Stop drops the snapshot and keeps the disk, which boots afresh.
	if _, err := sn.Snapshot(ctx, ref); err != nil {
		t.Fatal(err)
	}
	if err := s.rt.Stop(ctx, ref); err != nil {
		t.Fatalf("Stop of a snapshotted sandbox: %v", err)
	}
	_, err = sn.Restore(ctx, ref)
	wantSnapshotFailure(t, "Restore after Stop", err)
	if st := s.inspect(t, s.rt, ref); st.State == torpor.InstanceRunning || st.State == torpor.InstanceFrozen || !st.DiskExists {
		t.Errorf("after a failed Restore: %+v, want no live instance and a disk", st)
	}
	ref = s.boot(t, spec)
	s.wantState(t, s.rt, ref, torpor.InstanceRunning)

	// Destroy drops snapshot and disk.
	if _, err := sn.Snapshot(ctx, ref); err != nil {
		t.Fatal(err)
	}
	if err := s.rt.Destroy(ctx, ref); err != nil {
		t.Fatalf("Destroy of a snapshotted sandbox: %v", err)
	}
	if st := s.inspect(t, s.rt, ref); st.State != torpor.InstanceMissing || st.DiskExists {
		t.Errorf("after Destroy: %+v, want missing without disk", st)
	}
	_, err = sn.Restore(ctx, ref)
	wantSnapshotFailure(t, "Restore after Destroy", err)
}

func testExecOutput(t *testing.T, s *suite) {
	ref := s.boot(t, s.spec())
	out, errs, code := s.run(t, ref, "/bin/sh", "-c", "echo hi; echo oops >&2; exit 3")
	if out != "hi\n" || errs != "oops\n" || code != 3 {
		t.Errorf("got stdout %q, stderr %q, exit %d; want \"hi\\n\", \"oops\\n\", 3", out, errs, code)
	}
	if out, _, code := s.run(t, ref, "echo", "a b", "c"); out != "a b c\n" || code != 0 {
		t.Errorf("echo: %q, %d", out, code)
	}
}

func testExecEnvCwd(t *testing.T, s *suite) {
	spec := s.spec()
	spec.Env = map[string]string{"BOOT_VAR": "from-boot", "SHARED": "boot"}
	ref := s.boot(t, spec)
	out, errs, code := runIn(t, s.rt, ref, torpor.ExecRequest{
		Cmd: []string{"/bin/sh", "-c", `echo "$BOOT_VAR $EXEC_VAR $SHARED $(pwd)"`},
		Env: map[string]string{"EXEC_VAR": "from-exec", "SHARED": "exec"},
		Cwd: "/tmp",
	})
	if want := "from-boot from-exec exec /tmp\n"; out != want || code != 0 {
		t.Errorf("got %q (stderr %q, exit %d), want %q", out, errs, code, want)
	}
	if out := s.sh(t, ref, "pwd"); out != "/\n" {
		t.Errorf("default cwd = %q, want /", out)
	}
	_, err := s.rt.Exec(testCtx(t), ref, torpor.ExecRequest{Cmd: []string{"true"}, Cwd: "/no/such/dir"})
	if err == nil {
		t.Error("exec in a missing cwd succeeded")
	}
}

func testExecStdin(t *testing.T, s *suite) {
	ref := s.boot(t, s.spec())
	in := "line one\nline two\n"
	out, _, code := runIn(t, s.rt, ref, torpor.ExecRequest{Cmd: []string{"cat"}, Stdin: strings.NewReader(in)})
	if out != in || code != 0 {
		t.Errorf("cat: %q, exit %d; want %q", out, code, in)
	}
	out, _, _ = runIn(t, s.rt, ref, torpor.ExecRequest{Cmd: []string{"/bin/sh", "-c", "wc -l"}, Stdin: strings.NewReader(in)})
	if strings.TrimSpace(out) != "2" {
		t.Errorf("wc -l: %q", out)
	}
}

func testExecNotFound(t *testing.T, s *suite) {
	ref := s.boot(t, s.spec())
	_, _, code := s.run(t, ref, "/no/such/command")
	if code != 127 {
		t.Errorf("exit %d, want 127", code)
	}
}

func testExecTimeout(t *testing.T, s *suite) {
	ref := s.boot(t, s.spec())
	var out bytes.Buffer
	res, err := s.rt.Exec(testCtx(t), ref, torpor.ExecRequest{
		Cmd:     []string{"/bin/sh", "-c", "echo started; sleep 100 & sleep 100"},
		Timeout: 300 * time.Millisecond,
		Stdout:  &out,
	})
	if err != nil {
		t.Fatal(err)
	}
	if !res.TimedOut || out.String() != "started\n" {
		t.Errorf("result %+v, stdout %q; want timed out after \"started\"", res, out.String())
	}
	if n := count(s.processNames(t, ref), "sleep"); n != 0 {
		t.Errorf("%d sleep processes survived the timeout", n)
	}
	// A command that ends in time is not marked.
	res, err = s.rt.Exec(testCtx(t), ref, torpor.ExecRequest{Cmd: []string{"true"}, Timeout: time.Minute})
	if err != nil || res.TimedOut || res.ExitCode != 0 {
		t.Errorf("quick command: %+v, %v", res, err)
	}
}

func testExecFrozen(t *testing.T, s *suite) {
	ctx := testCtx(t)
	ref := s.boot(t, s.spec())
	if err := s.rt.Freeze(ctx, ref); err != nil {
		t.Fatal(err)
	}
	// The safety context turns a hang into a failure.
	_, err := s.rt.Exec(ctx, ref, torpor.ExecRequest{Cmd: []string{"true"}})
	wantCode(t, "Exec in a frozen instance", err, torpor.EConflict)
	if err := s.rt.Thaw(ctx, ref); err != nil {
		t.Fatal(err)
	}
	if out := s.sh(t, ref, "echo back"); out != "back\n" {
		t.Errorf("after thaw: %q", out)
	}
}

func testExecCancel(t *testing.T, s *suite) {
	ref := s.boot(t, s.spec())
	ctx, cancel := context.WithCancel(testCtx(t))
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := s.rt.Exec(ctx, ref, torpor.ExecRequest{Cmd: []string{"/bin/sh", "-c", "sleep 100 & sleep 100"}})
		done <- err
	}()
	eventually(t, "the command to start", func() bool { return count(s.processNames(t, ref), "sleep") == 2 })
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled exec: err = %v, want context.Canceled", err)
	}
	eventually(t, "the cancelled command's processes to end", func() bool {
		return count(s.processNames(t, ref), "sleep") == 0
	})
}

// readCounter reads the counter file the loop of testFreezeCounter writes.
func (s *suite) readCounter(t *testing.T, ref torpor.InstanceRef) int {
	t.Helper()
	n, err := strconv.Atoi(strings.TrimSpace(s.sh(t, ref, "cat /tmp/counter")))
	if err != nil {
		t.Fatalf("counter: %v", err)
	}
	return n
}

func testFreezeCounter(t *testing.T, s *suite) {
	const step = 20 * time.Millisecond
	ctx := testCtx(t)
	ref := s.boot(t, s.spec())
	// A shell loop counts in a variable (its memory) and publishes the
	// count atomically every step.
	pid := strings.TrimSpace(s.sh(t, ref, `
		i=0
		while :; do i=$((i+1)); echo $i > /tmp/counter.new; mv /tmp/counter.new /tmp/counter; sleep 0.02; done </dev/null >/dev/null 2>&1 &
		echo $!`))
	eventually(t, "the counter to start", func() bool {
		_, _, code := s.run(t, ref, "test", "-s", "/tmp/counter")
		return code == 0
	})

	t0 := time.Now()
	c1 := s.readCounter(t, ref)
	if err := s.rt.Freeze(ctx, ref); err != nil {
		t.Fatal(err)
	}
	frozenAt := time.Now()
	s.wantState(t, s.rt, ref, torpor.InstanceFrozen)
	time.Sleep(20 * step)
	thawAt := time.Now()
	if err := s.rt.Thaw(ctx, ref); err != nil {
		t.Fatal(err)
	}
	c2 := s.readCounter(t, ref)
	t1 := time.Now()

	// Each step takes at least `step`, so while running the loop made at
	// most running/step steps (plus one in flight at each edge); had it run
	// through the freeze it would have made about 20 more.
	running := frozenAt.Sub(t0) + t1.Sub(thawAt)
	if max := int(running/step) + 2; c2-c1 > max {
		t.Errorf("counter went %d -> %d across a freeze; at most %d steps fit in the %v it was not frozen", c1, c2, max, running)
	}
	if c2 < c1 {
		t.Errorf("counter went back from %d to %d: the loop restarted", c1, c2)
	}
	var c3 int
	eventually(t, "the counter to advance after thaw", func() bool {
		c3 = s.readCounter(t, ref)
		return c3 > c2
	})
	if _, _, code := s.run(t, ref, "kill", "-0", pid); code != 0 {
		t.Errorf("the loop's process %s is gone after thaw", pid)
	}
}

func testStopKeepsDisk(t *testing.T, s *suite) {
	ctx := testCtx(t)
	spec := s.spec()
	ref := s.boot(t, spec)
	s.sh(t, ref, "echo kept > /root/data; sleep 1000 </dev/null >/dev/null 2>&1 &")
	eventually(t, "the background sleep to start", func() bool { return count(s.processNames(t, ref), "sleep") == 1 })
	if err := s.rt.Stop(ctx, ref); err != nil {
		t.Fatal(err)
	}
	st := s.inspect(t, s.rt, ref)
	if st.State == torpor.InstanceRunning || st.State == torpor.InstanceFrozen || !st.DiskExists {
		t.Fatalf("after Stop: %+v, want no live instance and a disk", st)
	}
	if _, err := s.rt.Exec(ctx, ref, torpor.ExecRequest{Cmd: []string{"true"}}); err == nil {
		t.Error("Exec after Stop succeeded")
	}
	ref = s.boot(t, spec)
	if out := s.sh(t, ref, "cat /root/data"); out != "kept\n" {
		t.Errorf("file after Stop and Boot: %q, want \"kept\\n\"", out)
	}
	if n := count(s.processNames(t, ref), "sleep"); n != 0 {
		t.Errorf("%d sleep processes survived Stop", n)
	}
}

func testBootAgain(t *testing.T, s *suite) {
	ctx := testCtx(t)
	spec := s.spec()
	spec.Setup = []string{"echo boot >> /root/boots", "test -f /root/boots"}
	spec.Entrypoint = []string{"/bin/sh", "-c", "echo ep >> /root/eps; exec sleep 1000"}
	lines := func(ref torpor.InstanceRef, file string) int {
		return strings.Count(s.sh(t, ref, "cat "+file+" 2>/dev/null; true"), "\n")
	}
	ref := s.boot(t, spec)
	if n := lines(ref, "/root/boots"); n != 1 {
		t.Fatalf("setup ran %d times after the first boot", n)
	}
	eventually(t, "the first entrypoint", func() bool { return lines(ref, "/root/eps") == 1 })

	if err := s.rt.Stop(ctx, ref); err != nil {
		t.Fatal(err)
	}
	ref = s.boot(t, spec)
	if n := lines(ref, "/root/boots"); n != 2 {
		t.Errorf("setup ran %d times after the second boot, want 2", n)
	}
	eventually(t, "the second entrypoint", func() bool { return lines(ref, "/root/eps") == 2 })

	// Booting over a running instance replaces it.
	ref = s.boot(t, spec)
	if n := lines(ref, "/root/boots"); n != 3 {
		t.Errorf("setup ran %d times after the third boot, want 3", n)
	}
	eventually(t, "the third entrypoint", func() bool { return lines(ref, "/root/eps") == 3 })
}

func testSetupFailure(t *testing.T, s *suite) {
	ctx := testCtx(t)
	spec := s.spec()
	spec.Setup = []string{"true", "echo setup-oops; exit 4", "touch /root/never"}
	spec.Entrypoint = []string{"sleep", "1000"}
	ref := torpor.InstanceRef{SandboxID: spec.SandboxID}
	t.Cleanup(func() { _ = s.rt.Destroy(context.Background(), ref) })
	_, err := s.rt.Boot(ctx, spec)
	var te *torpor.Error
	if !errors.As(err, &te) || te.Reason != torpor.FailureSetup {
		t.Fatalf("Boot with a failing setup: err = %v, want a *torpor.Error with reason %s", err, torpor.FailureSetup)
	}
	st := s.wantState(t, s.rt, ref, torpor.InstanceStopped)
	f := st.Failure
	if f == nil || f.Code != torpor.FailureSetup || f.ExitCode == nil || *f.ExitCode != 4 || !strings.Contains(f.Message, "setup-oops") {
		t.Errorf("failure = %+v, want setup_failed, exit 4, with the command's output", f)
	}
}

func testEntrypointExit(t *testing.T, s *suite) {
	spec := s.spec()
	spec.Entrypoint = []string{"/bin/sh", "-c", "sleep 0.2; exit 7"}
	ref := s.boot(t, spec)
	st, err := s.rt.Wait(testCtx(t), ref)
	if err != nil {
		t.Fatal(err)
	}
	check := func(what string, st torpor.InstanceStatus) {
		t.Helper()
		f := st.Failure
		if st.State != torpor.InstanceStopped || f == nil || f.Code != torpor.FailureEntrypoint || f.ExitCode == nil || *f.ExitCode != 7 {
			t.Errorf("%s: %+v (failure %+v), want stopped with entrypoint_exited and exit code 7", what, st, f)
		}
	}
	check("Wait", st)
	check("Inspect", s.inspect(t, s.rt, ref))
	_, err = s.rt.Exec(testCtx(t), ref, torpor.ExecRequest{Cmd: []string{"true"}})
	wantCode(t, "Exec in a stopped instance", err, torpor.EConflict)
}

func testOOM(t *testing.T, s *suite) {
	spec := s.spec()
	spec.Resources.MemoryMiB = 32
	spec.Entrypoint = []string{"/bin/sh", "-c", "x=a; while :; do x=$x$x; done"}
	ref := s.boot(t, spec)
	st, err := s.rt.Wait(testCtx(t), ref)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != torpor.InstanceStopped || st.Failure == nil || st.Failure.Code != torpor.FailureOOM {
		t.Errorf("Wait: %+v (failure %+v), want stopped with out_of_memory", st, st.Failure)
	}
}

func testReattachProcesses(t *testing.T, s *suite) {
	spec := s.spec()
	// The entrypoint lingers after it sees the file, so that the exec
	// that made it reports before the instance ends (its end kills every
	// process of the sandbox, the exec's own included).
	spec.Entrypoint = []string{"/bin/sh", "-c", "while [ ! -f /tmp/stop ]; do sleep 0.02; done; sleep 0.3; exit 5"}
	ref := s.boot(t, spec)
	fresh := s.h.New(t)
	s.wantState(t, fresh, ref, torpor.InstanceRunning)
	if out, _, code := runIn(t, fresh, ref, torpor.ExecRequest{Cmd: []string{"echo", "reattached"}}); out != "reattached\n" || code != 0 {
		t.Errorf("exec from a fresh runtime: %q, %d", out, code)
	}
	type waited struct {
		st  torpor.InstanceStatus
		err error
	}
	done := make(chan waited, 1)
	go func() {
		st, err := fresh.Wait(testCtx(t), ref)
		done <- waited{st, err}
	}()
	select {
	case w := <-done:
		t.Fatalf("Wait returned while the entrypoint ran: %+v, %v", w.st, w.err)
	default:
	}
	runIn(t, fresh, ref, torpor.ExecRequest{Cmd: []string{"touch", "/tmp/stop"}})
	w := <-done
	if w.err != nil {
		t.Fatal(w.err)
	}
	if f := w.st.Failure; w.st.State != torpor.InstanceStopped || f == nil || f.Code != torpor.FailureEntrypoint || f.ExitCode == nil || *f.ExitCode != 5 {
		t.Errorf("Wait from a fresh runtime: %+v (failure %+v), want entrypoint_exited with 5", w.st, f)
	}
}

func testIsolation(t *testing.T, s *suite) {
	specA, specB := s.spec(), s.spec()
	specA.Hostname, specB.Hostname = "alpha", "beta"
	a, b := s.boot(t, specA), s.boot(t, specB)
	s.sh(t, a, "echo secret > /tmp/a-secret; sleep 1000 </dev/null >/dev/null 2>&1 &")
	eventually(t, "the background sleep to start", func() bool { return count(s.processNames(t, a), "sleep") == 1 })
	if _, _, code := s.run(t, b, "cat", "/tmp/a-secret"); code == 0 {
		t.Error("sandbox b reads a file sandbox a wrote")
	}
	if n := count(s.processNames(t, b), "sleep"); n != 0 {
		t.Errorf("sandbox b sees %d sleep processes of sandbox a", n)
	}
	if out := s.sh(t, a, "hostname"); out != "alpha\n" {
		t.Errorf("hostname of a = %q", out)
	}
	if out := s.sh(t, b, "hostname"); out != "beta\n" {
		t.Errorf("hostname of b = %q", out)
	}
	// Own network namespace: loopback only, or with the sandbox network
	// a loopback and an eth0 of its own.
	var ifaces []string
	for _, line := range strings.Split(s.sh(t, b, "cat /proc/net/dev"), "\n") {
		if name, _, ok := strings.Cut(line, ":"); ok {
			ifaces = append(ifaces, strings.TrimSpace(name))
		}
	}
	sort.Strings(ifaces)
	want := []string{"lo"}
	if s.h.Network {
		want = []string{"eth0", "lo"}
		if ea, eb := s.sh(t, a, "cat /sys/class/net/eth0/address"), s.sh(t, b, "cat /sys/class/net/eth0/address"); ea == eb {
			t.Errorf("sandboxes a and b share the eth0 %s", ea)
		}
	}
	if strings.Join(ifaces, " ") != strings.Join(want, " ") {
		t.Errorf("network interfaces %v, want %v", ifaces, want)
	}
}
