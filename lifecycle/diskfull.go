package lifecycle

import (
	"context"
	"time"

	"github.com/torpor-dev/torpor"
)

// A full data disk (torpor.IsDiskFull) refuses every store write. A verb
// refused before its first write changes nothing; one whose first write
// went through and a later one not (the disk filled in between, as a boot
// or a sandbox wrote) leaves the sandbox recorded in a transition's
// in-between state. A restart's reconcile would finish it; the engine
// does not wait for one: the sweep looks at such a sandbox again every
// cutShortRetry and, once the store can be written, finishes the transition
// as reconcileOne does. A create cut short so is deleted instead of
// booted: its caller heard that it failed.

// cutShortRetry is how soon a sandbox a full data disk cut short is looked
// at again.
const cutShortRetry = 5 * time.Second

// lookAgain has the sweep look at sandbox id again soon when a verb on it
// failed with err, the full data disk.
func (e *Engine) lookAgain(id string, err error) {
	if torpor.IsDiskFull(err) {
		e.sched.set(id, e.now().Add(cutShortRetry))
	}
}

// abandonCreate is lookAgain for the create of id, whose record was
// stored before it failed with err: the sandbox is deleted once the store
// can be written, unless a verb finished its boot before.
func (e *Engine) abandonCreate(id string, err error) {
	if torpor.IsDiskFull(err) {
		e.abandoned.Store(id, true)
		e.lookAgain(id, err)
	}
}

// finishCutShort finishes what a verb cut short by a full data disk left of sb,
// whose lock the caller holds, and reports whether there was anything: a
// create left starting is deleted, any other in-between state finished.
// While the disk is still full it tries again later.
func (e *Engine) finishCutShort(ctx context.Context, sb *torpor.Sandbox) bool {
	_, abandoned := e.abandoned.LoadAndDelete(sb.ID)
	abandoned = abandoned && sb.State == torpor.StateStarting
	if !abandoned && !sb.State.Transitional() {
		return false
	}
	var err error
	if abandoned {
		err = e.terminate(ctx, sb, CauseReconcile)
	} else {
		err = e.reconcileSandbox(ctx, sb)
	}
	if err != nil {
		if abandoned {
			e.abandoned.Store(sb.ID, true)
		}
		e.log.Warn("finishing a transition a full data disk cut short; trying again", "sandbox", sb.ID, "state", sb.State, "err", err)
		e.sched.set(sb.ID, e.now().Add(cutShortRetry))
	}
	return true
}
