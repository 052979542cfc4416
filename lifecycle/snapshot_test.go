package lifecycle_test

import (
	"context"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

func TestSnapshotPauseReleasesTheInstanceAndResumeRestoresIt(t *testing.T) {
	e := newEnv(t)
	sb := e.create(torpor.CreateRequest{Resources: &torpor.Resources{MemoryMiB: 1024}})
	got, err := e.eng.Pause(ctx, "acme", sb.ID, torpor.PauseSnapshot)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != torpor.StatePaused || got.PauseMode != torpor.PauseSnapshot || got.Snapshot == nil || got.Snapshot.SizeBytes == 0 {
		t.Fatalf("after a snapshot pause: %s %s %+v", got.State, got.PauseMode, got.Snapshot)
	}
	if st := e.host.State(sb.ID); st != torpor.InstanceMissing || !e.host.HasSnapshot(sb.ID) {
		t.Fatalf("instance %s, snapshot %v: a snapshot pause must end the instance", st, e.host.HasSnapshot(sb.ID))
	}
	if _, mem, _ := e.eng.CapacityUsed(); mem != 0 {
		t.Errorf("a snapshot-paused sandbox still holds %.0f MiB of the node", mem)
	}
	// A restart finds no instance, which is what a snapshot pause means.
	e.restart()
	if got := e.get(sb.ID); got.State != torpor.StatePaused || got.PauseMode != torpor.PauseSnapshot {
		t.Fatalf("after a daemon restart: %s %s", got.State, got.PauseMode)
	}
	e.clock.Advance(time.Minute)
	got, err = e.eng.Start(ctx, "acme", sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.State != torpor.StateRunning || got.Snapshot != nil || e.host.State(sb.ID) != torpor.InstanceRunning {
		t.Fatalf("after resume: %s snapshot %+v instance %s", got.State, got.Snapshot, e.host.State(sb.ID))
	}
	if got.Boots != 1 {
		t.Errorf("a restore is not a boot: boots %d", got.Boots)
	}
	if got.Meters.SnapshotPausedS != 60 || got.Meters.FrozenS != 0 {
		t.Errorf("meters: %s", got.Meters)
	}
}

// A snapshot that cannot be restored leaves the sandbox failed, saying
// so, with its disk kept: never booted afresh as if it had resumed.
func TestUnrestorableSnapshotFailsAndKeepsTheDisk(t *testing.T) {
	e := newEnv(t)
	sb := e.create(torpor.CreateRequest{})
	must(e.eng.Pause(ctx, "acme", sb.ID, torpor.PauseSnapshot))
	e.host.CorruptSnapshot(sb.ID)
	if _, err := e.eng.Start(ctx, "acme", sb.ID); err == nil {
		t.Fatal("resuming from a corrupt snapshot succeeded")
	}
	got := e.get(sb.ID)
	if got.State != torpor.StateFailed || got.Failure == nil || got.Failure.Code != torpor.FailureSnapshot {
		t.Fatalf("state %s failure %+v, want failed with %s", got.State, got.Failure, torpor.FailureSnapshot)
	}
	if e.host.Boots(sb.ID) != 1 || !e.host.HasDisk(sb.ID) {
		t.Fatalf("boots %d, disk %v: the sandbox was rebooted or lost its disk", e.host.Boots(sb.ID), e.host.HasDisk(sb.ID))
	}
	if got, err := e.eng.Start(ctx, "acme", sb.ID); err != nil || got.State != torpor.StateRunning || got.Boots != 2 {
		t.Fatalf("start after the failure: %v %+v", err, got)
	}
}

func TestIdlePolicyChoosesThePauseMode(t *testing.T) {
	e := newEnv(t)
	sb := e.create(torpor.CreateRequest{PolicyRequest: torpor.PolicyRequest{
		Timeout:   torpor.Seconds(60),
		Lifecycle: &torpor.Lifecycle{OnTimeout: torpor.ActionPause, PauseMode: torpor.PauseSnapshot}}})
	e.clock.Advance(61 * time.Second)
	got := settle(e, sb.ID, torpor.StatePaused)
	if got.PauseMode != torpor.PauseSnapshot || e.host.State(sb.ID) != torpor.InstanceMissing {
		t.Fatalf("idle pause by %q, instance %s; the policy asked for a snapshot", got.PauseMode, e.host.State(sb.ID))
	}
	if _, err := e.eng.Create(ctx, "acme", torpor.CreateRequest{Template: "base", PolicyRequest: torpor.PolicyRequest{
		Lifecycle: &torpor.Lifecycle{PauseMode: "teleport"}}}); !torpor.IsCode(err, torpor.EInvalid) {
		t.Errorf("an unknown pause mode: %v", err)
	}
}

// A runtime without a sandbox network cannot let a sandbox out: asking
// for it is refused, not ignored.
func TestAllowInternetNeedsANetwork(t *testing.T) {
	e := newEnv(t)
	_, err := e.eng.Create(ctx, "acme", torpor.CreateRequest{Template: "base", AllowInternet: true})
	if !torpor.IsCode(err, torpor.EInvalid) {
		t.Fatalf("allow_internet on a runtime without a network: %v", err)
	}
}

// The idle clock starts when the sandbox runs: a boot slower than the idle
// timeout does not get the sandbox paused the moment it is up.
func TestIdleClockStartsWhenTheBootEnds(t *testing.T) {
	e := newEnv(t)
	e.host.BootHook = func(context.Context, torpor.BootSpec) error {
		e.clock.Advance(90 * time.Second) // a slow boot
		return nil
	}
	sb := e.create(torpor.CreateRequest{PolicyRequest: torpor.PolicyRequest{
		LifecyclePolicy: &torpor.LifecyclePolicy{PauseAfterIdleSeconds: torpor.Seconds(60)}}})
	if sb.State != torpor.StateRunning || sb.PauseAt == nil || !sb.PauseAt.Equal(e.clock.Now().Add(60*time.Second)) {
		t.Fatalf("after a 90 s boot: %s, pause at %v (now %s)", sb.State, sb.PauseAt, e.clock.Now())
	}
}
