package lifecycle_test

import (
	"bytes"
	"testing"

	"github.com/torpor-dev/torpor"
)

// TestRestartWaitsForAnExecInFlight: a restart that comes while an exec
// runs waits for it, as a pause and a hibernation do, so that what an
// operation holds of the old instance (a files call holds its root open)
// is let go before the instance is replaced; the exec succeeds with its
// output, then the sandbox boots again.
func TestRestartWaitsForAnExecInFlight(t *testing.T) {
	e := newEnv(t)
	ex := newBlockingExec(t, e, nil)
	sb := e.create(torpor.CreateRequest{})
	var out bytes.Buffer
	execDone := execAsync(e, sb.ID, &out)
	<-ex.started
	restarted := verbAsync(func() (*torpor.Sandbox, error) { return e.eng.Restart(ctx, "acme", sb.ID) })
	notYet(t, restarted, "the restart")
	if got := e.get(sb.ID); got.State != torpor.StateRunning || got.Boots != sb.Boots {
		t.Fatalf("under an exec in flight: %s, boot %d", got.State, got.Boots)
	}
	ex.release()
	if err := await(t, execDone, "the exec"); err != nil || out.String() != "out" {
		t.Fatalf("exec: %v, stdout %q", err, out.String())
	}
	if err := await(t, restarted, "the restart"); err != nil {
		t.Fatal(err)
	}
	if got := e.get(sb.ID); got.State != torpor.StateRunning || got.Boots != sb.Boots+1 {
		t.Fatalf("after the restart: %s, boot %d", got.State, got.Boots)
	}
}

// TestHibernationOfAPausedSandboxWaitsForAFilesRead: the files of a
// paused sandbox can be read without waking it; a hibernation waits for
// such a read to end before the instance, whose root the read holds open,
// goes.
func TestHibernationOfAPausedSandboxWaitsForAFilesRead(t *testing.T) {
	e := newEnv(t)
	e.host.FilesDir = t.TempDir()
	sb := e.create(torpor.CreateRequest{})
	if _, err := e.eng.Pause(ctx, "acme", sb.ID, ""); err != nil {
		t.Fatal(err)
	}
	_, done, err := e.eng.Files(ctx, "acme", sb.ID, false)
	if err != nil {
		t.Fatal(err)
	}
	hibernated := verbAsync(func() (*torpor.Sandbox, error) { return e.eng.Hibernate(ctx, "acme", sb.ID) })
	notYet(t, hibernated, "the hibernation")
	if got := e.get(sb.ID); got.State != torpor.StatePaused || e.host.State(sb.ID) != torpor.InstanceFrozen {
		t.Fatalf("under a files read: %s, instance %s", got.State, e.host.State(sb.ID))
	}
	done()
	if err := await(t, hibernated, "the hibernation"); err != nil {
		t.Fatal(err)
	}
	if got := e.get(sb.ID); got.State != torpor.StateHibernated {
		t.Fatalf("after the hibernation: %s", got.State)
	}
}
