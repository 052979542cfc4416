package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"path"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/files"
)

// Causes recorded on events: who asked for a transition.
const (
	CauseAPI       = "api"
	CauseReconcile = "reconcile"
)

// userRe is a user name or uid[:gid].
var userRe = regexp.MustCompile(`^([a-z_][a-z0-9_.-]{0,31}|[0-9]{1,10}(:[0-9]{1,10})?)$`)

// MaxExecTimeout bounds one command's run time.
const MaxExecTimeout = 24 * time.Hour

// withSandbox locks id, loads tenant's sandbox and runs fn on it. Every
// verb runs inside it, so transitions of one sandbox never interleave.
func (e *Engine) withSandbox(ctx context.Context, tenant, id string, fn func(sb *torpor.Sandbox) error) (*torpor.Sandbox, error) {
	unlock := e.locks.Lock(id)
	defer unlock()
	sb, err := e.load(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	if err := e.own(ctx, sb); err != nil {
		return nil, err
	}
	if err := fn(sb); err != nil {
		e.lookAgain(id, err)
		return nil, err
	}
	return e.view(sb), nil
}

func ref(sb *torpor.Sandbox) torpor.InstanceRef {
	return torpor.InstanceRef{SandboxID: sb.ID, Handle: sb.Handle}
}

// Pause stops a running sandbox's processes. A paused sandbox is returned
// as it is. An empty mode is the runtime's first (freeze for runc).
func (e *Engine) Pause(ctx context.Context, tenant, id string, mode torpor.PauseMode) (*torpor.Sandbox, error) {
	return e.withSandbox(ctx, tenant, id, func(sb *torpor.Sandbox) error {
		return e.pause(ctx, sb, mode, CauseAPI)
	})
}

func (e *Engine) pause(ctx context.Context, sb *torpor.Sandbox, mode torpor.PauseMode, cause string) error {
	switch sb.State {
	case torpor.StatePaused:
		return nil
	case torpor.StateRunning, torpor.StatePausing:
	case torpor.StateTerminated:
		return gone(sb)
	default:
		return torpor.WrongState("pause", sb.State)
	}
	rt, err := e.runtime(sb.Runtime.Kind)
	if err != nil {
		return err
	}
	if mode == "" {
		mode = rt.PauseModes()[0]
	}
	if !supports(rt, mode) {
		return torpor.Invalid("mode", "the %s runtime cannot pause by %q; it can: %v", rt.Kind(), mode, rt.PauseModes())
	}
	if sb.Accel != nil && mode != torpor.PauseFreeze {
		return torpor.Invalid("mode", "a GPU sandbox pauses by freeze; its accel.suspend_mode says what happens to its GPU state")
	}
	if sb.State == torpor.StateRunning {
		end, err := e.drain(ctx, sb, "pause")
		if err != nil {
			return err
		}
		defer end()
	}
	start := time.Now()
	defer func() {
		if sb.State == torpor.StatePaused {
			e.fail("paused.after-store")
			e.observe("pause", cause, start)
		}
	}()
	if sb.State == torpor.StateRunning {
		e.runHooks(ctx, sb, torpor.HookOnPause)
	}
	sb.PauseMode = mode
	wasRunning := sb.State == torpor.StateRunning
	inBetween := recordsPausing(sb, mode, cause)
	if !inBetween && wasRunning {
		// Unstored, the pause still shows: in the metrics, and in the
		// conflict an operation the freeze makes fail answers with (see
		// leftRunning).
		e.noteUnstored(sb.ID, torpor.StatePausing)
		// The proxy drops what it knows of the sandbox and looks again,
		// finding it pausing (view): a request that comes now waits for
		// the pause and wakes the sandbox, rather than reach it frozen.
		e.announce()
		defer func() {
			if e.unstoredState(sb.ID) == torpor.StatePausing {
				e.noteUnstored(sb.ID, torpor.StateRunning)
			}
		}()
	}
	if inBetween {
		e.fail("pausing.before-store")
		if err := e.setState(ctx, sb, torpor.StatePausing); err != nil {
			return err
		}
		e.fail("pausing.after-store")
		if wasRunning {
			if stay, err := e.stayForTraffic(ctx, sb, cause); stay || err != nil {
				return err
			}
		}
	}
	if wasRunning {
		e.awaitRequests(ctx, sb, "pause")
	}
	e.fail("pausing.before-runtime")
	if err := e.stopInstance(ctx, rt, sb, mode); err != nil {
		// Thawing a running instance is harmless; one that a failed or
		// unfinished freeze left (partly) frozen runs again.
		if terr := e.thawInstance(ctx, rt, sb); terr != nil {
			e.log.Warn("thawing after a failed pause", "sandbox", sb.ID, "err", terr)
		}
		sb.PauseMode = ""
		ev := e.event(sb, "sandbox.pause_failed", "error", err.Error())
		if rerr := e.setState(ctx, sb, torpor.StateRunning, ev); rerr != nil {
			return rerr
		}
		return fmt.Errorf("pause %s: %w", sb.ID, err)
	}
	e.fail("pausing.after-runtime")
	sb.Meters.Pauses++
	if cause == CauseIdle || cause == CauseEnd {
		sb.Meters.AutoPaused++
	}
	if err := e.setState(ctx, sb, torpor.StatePaused, e.event(sb, torpor.EventPaused, "cause", cause, "mode", string(mode))); err != nil {
		if !inBetween {
			// The store still says running, and the caller hears that the
			// pause failed: the instance runs again, as a restart's
			// reconcile would make it.
			if terr := e.thawInstance(ctx, rt, sb); terr != nil {
				e.log.Error("thawing after a pause that could not be stored", "sandbox", sb.ID, "err", terr)
			}
		}
		return err
	}
	if mode == torpor.PauseSnapshot {
		e.wakeUploads()
	}
	return nil
}

// recordsPausing tells whether a pause stores the in-between state pausing
// before it stops sb's instance. A pause by freeze of a sandbox without a
// GPU does not: a freeze is undone by a thaw and the runtime says whether
// an instance is frozen, so the one write after the freeze is enough. A
// daemon that dies between the freeze and that write finds the sandbox
// recorded running with its instance frozen, and thaws it (reconcileOne):
// the pause never answered, and the ledger bills it running throughout.
// The in-between record stays where it is needed: a snapshot pause ends
// the instance, a GPU sandbox's lease is suspended before the freeze (and
// the lease manager's own record follows the sandbox's state), and an idle
// pause announces pausing to the proxy before it looks for requests under
// way (see stayForTraffic and RequestStarted).
func recordsPausing(sb *torpor.Sandbox, mode torpor.PauseMode, cause string) bool {
	return mode != torpor.PauseFreeze || sb.Accel != nil || cause == CauseIdle
}

// recordsResuming tells whether a resume of sb stores the in-between state
// resuming before it continues the instance. A thaw of a sandbox without a
// GPU does not, for the reasons a freeze does not (see recordsPausing): a
// daemon that dies between the thaw and the write of running finds the
// sandbox recorded paused with its instance running, and freezes it again
// (reconcileOne). The resume never answered, and the ledger bills the
// sandbox frozen up to where it was recorded running, as it bills every
// resume (a resuming sandbox is metered as paused too).
func recordsResuming(sb *torpor.Sandbox) bool {
	return sb.PauseMode != torpor.PauseFreeze || sb.Accel != nil
}

// stopInstance stops sb's instance for a pause: by freezing it, or by
// writing it to a snapshot on disk, after which its process is gone (so
// it is no longer watched) and the sandbox records where the snapshot is.
func (e *Engine) stopInstance(ctx context.Context, rt torpor.Runtime, sb *torpor.Sandbox, mode torpor.PauseMode) error {
	if mode != torpor.PauseSnapshot {
		// A GPU lease suspends first: a spill checkpoints the worker
		// before anything of the sandbox is frozen.
		if err := e.gpuPause(ctx, sb); err != nil {
			return err
		}
		if err := e.freezeInstance(ctx, rt, sb); err != nil {
			if rerr := e.gpuResume(context.WithoutCancel(ctx), sb); rerr != nil {
				e.log.Error("resuming a GPU lease after a failed freeze", "sandbox", sb.ID, "err", rerr)
			}
			return err
		}
		return nil
	}
	snap, ok := rt.(torpor.Snapshotter)
	if !ok {
		return torpor.Invalid("mode", "the %s runtime cannot pause by snapshot", rt.Kind())
	}
	e.unwatch(sb.ID)
	info, err := e.snapshotInstance(ctx, snap, sb)
	if err != nil {
		e.watch(sb.ID, sb.Handle, rt)
		return err
	}
	sb.Snapshot = &info
	return nil
}

// continueInstance continues sb's paused instance: thaws it, or restores
// it from its snapshot and watches the new instance.
func (e *Engine) continueInstance(ctx context.Context, rt torpor.Runtime, sb *torpor.Sandbox) error {
	if sb.PauseMode != torpor.PauseSnapshot {
		// The GPU lease comes back first (thaw, restore, re-reserve), so
		// nothing of the sandbox runs before its GPU state is back.
		if err := e.gpuResume(ctx, sb); err != nil {
			return err
		}
		return e.thawInstance(ctx, rt, sb)
	}
	snap, ok := rt.(torpor.Snapshotter)
	if !ok {
		return torpor.Errorf(torpor.EInternal, "the %s runtime cannot restore snapshots", rt.Kind())
	}
	handle, err := e.restoreInstance(ctx, snap, sb)
	if err != nil {
		return err
	}
	sb.Handle = handle // the snapshot is dropped once its interval is billed (see meter)
	e.watch(sb.ID, handle, rt)
	if en, ok := rt.(torpor.EgressEnforcer); ok && !sb.Network.Empty() {
		// The runtime attaches with the rules it recorded; given again
		// for a snapshot that came from elsewhere (an archive).
		if err := en.SetEgress(ctx, ref(sb), sb.Network.Clone()); err != nil {
			e.log.Warn("applying egress rules after a restore", "sandbox", sb.ID, "err", err)
		}
	}
	return nil
}

func supports(rt torpor.Runtime, mode torpor.PauseMode) bool {
	for _, m := range rt.PauseModes() {
		if m == mode {
			return true
		}
	}
	return false
}

// Start continues a paused sandbox where it stopped, or boots a hibernated
// (or failed) one fresh on its disk. A running sandbox is returned as it is.
func (e *Engine) Start(ctx context.Context, tenant, id string) (*torpor.Sandbox, error) {
	return e.withSandbox(ctx, tenant, id, func(sb *torpor.Sandbox) error {
		return e.start(ctx, sb, CauseAPI)
	})
}

func (e *Engine) start(ctx context.Context, sb *torpor.Sandbox, cause string) error {
	if sb.State == torpor.StateArchived && sb.Archive != nil && sb.Archive.Kind == archiveSnapshot {
		// Its disk and memory are in its archive: back to paused, then
		// resumed where it stopped (archive.go).
		if err := e.restoreSnapshotArchive(ctx, sb, cause); err != nil {
			return err
		}
		err := e.resume(ctx, sb, cause)
		if ferr := e.finishRestore(ctx, sb); ferr != nil && err == nil {
			err = ferr
		}
		return err
	}
	switch sb.State {
	case torpor.StateRunning:
		return nil
	case torpor.StatePaused, torpor.StateResuming:
		return e.resume(ctx, sb, cause)
	case torpor.StateHibernated, torpor.StateFailed, torpor.StateStarting, torpor.StateArchived:
		if sb.State == torpor.StateFailed && sb.Failure != nil && sb.Failure.Code == torpor.FailureLost {
			// Its disk went with its node: booting it would make it anew,
			// empty, under the same name.
			return &torpor.Error{Code: torpor.EConflict, State: sb.State, Reason: torpor.FailureLost,
				Message: fmt.Sprintf("sandbox %s was lost with its node (%s); it cannot start again, delete it", sb.ID, sb.Failure.Message)}
		}
		if err := e.checkVolumesFree(ctx, sb); err != nil {
			return err
		}
		if sb.State == torpor.StateHibernated || sb.State == torpor.StateArchived {
			sb.Meters.Resumes++
			if cause == CauseAuto {
				sb.Meters.AutoResumed++
			}
		}
		err := e.coldStart(ctx, sb, torpor.StateStarting, torpor.EventStarted, cause)
		// Restored from its archive (or failed booting on the restored
		// disk): the archive is not needed any more.
		if ferr := e.finishRestore(ctx, sb); ferr != nil && err == nil {
			err = ferr
		}
		return err
	case torpor.StateArchiving:
		return &torpor.Error{Code: torpor.EConflict, State: sb.State, Reason: "state", RetryAfter: 5 * time.Second,
			Message: fmt.Sprintf("sandbox %s is being archived; start it once it is archived", sb.ID)}
	case torpor.StateTerminated:
		return gone(sb)
	}
	return torpor.WrongState("start", sb.State)
}

func (e *Engine) resume(ctx context.Context, sb *torpor.Sandbox, cause string) error {
	defer e.observeIfRunning(sb, "resume", cause, time.Now())
	rt, err := e.runtime(sb.Runtime.Kind)
	if err != nil {
		return err
	}
	if err := e.reserve(ctx, sb, torpor.StateResuming); err != nil {
		return err
	}
	if err := e.fetchSnapshot(ctx, rt, sb); err != nil {
		e.hold(sb, torpor.StatePaused)
		return err
	}
	inBetween := recordsResuming(sb)
	if inBetween {
		e.fail("resuming.before-store")
		if err := e.setState(ctx, sb, torpor.StateResuming); err != nil {
			e.hold(sb, torpor.StatePaused)
			return err
		}
	}
	e.fail("resuming.before-runtime")
	if err := e.continueInstance(ctx, rt, sb); err != nil {
		var te *torpor.Error
		if errors.As(err, &te) && te.Reason == torpor.FailureSnapshot {
			// Never boot it afresh as if it had resumed: it is failed,
			// and its disk is kept for a start.
			sb.Snapshot, sb.Handle = nil, ""
			if rerr := e.recordFailure(ctx, sb, &torpor.Failure{Code: torpor.FailureSnapshot, Message: te.Message}); rerr != nil {
				return rerr
			}
			return err
		}
		if rerr := e.setState(ctx, sb, torpor.StatePaused); rerr != nil {
			return rerr
		}
		return fmt.Errorf("resume %s: %w", sb.ID, err)
	}
	e.fail("resuming.after-runtime")
	sb.PauseMode = ""
	// It runs on from its snapshot: the uploaded one is old.
	sb.Durability = torpor.DurabilityNode
	sb.LastActivityAt = e.now()
	renewEnd(sb, sb.LastActivityAt)
	sb.Meters.Resumes++
	auto := cause == CauseAuto
	if auto {
		sb.Meters.AutoResumed++
	}
	kv := []string{"cause", cause, "auto", strconv.FormatBool(auto)}
	if sb.Archive != nil {
		kv = append(kv, "restored_from", "archive")
	}
	if err := e.setState(ctx, sb, torpor.StateRunning, e.event(sb, torpor.EventResumed, kv...)); err != nil {
		if !inBetween {
			// The store still says paused, and the caller hears that the
			// resume failed: the instance is frozen again, as a restart's
			// reconcile would make it.
			if ferr := e.freezeInstance(ctx, rt, sb); ferr != nil {
				e.log.Error("freezing after a resume that could not be stored", "sandbox", sb.ID, "err", ferr)
			}
			e.hold(sb, torpor.StatePaused)
		}
		return err
	}
	e.fail("resumed.after-store")
	e.runHooks(ctx, sb, torpor.HookOnResume)
	return nil
}

// coldStart boots sb fresh on its disk through the in-between state via.
func (e *Engine) coldStart(ctx context.Context, sb *torpor.Sandbox, via torpor.State, evType, cause string) error {
	kind := "start"
	if via == torpor.StateRestarting {
		kind = "restart"
	}
	defer e.observeIfRunning(sb, kind, cause, time.Now())
	rt, err := e.runtime(sb.Runtime.Kind)
	if err != nil {
		return err
	}
	tmpl, err := e.store.GetTemplate(ctx, sb.Template)
	if err != nil {
		return fmt.Errorf("template %s of sandbox %s: %w", sb.Template, sb.ID, err)
	}
	if err := e.reserve(ctx, sb, via); err != nil {
		return err
	}
	if err := e.fetchArchive(ctx, rt, sb); err != nil {
		e.hold(sb, sb.State)
		return err
	}
	if err := e.fetchDisk(ctx, rt, sb); err != nil {
		e.hold(sb, sb.State)
		return err
	}
	prev, prevSince, prevDurability := sb.State, sb.StateSince, sb.Durability
	sb.LastActivityAt = e.now()
	// Once it boots its disk is not the one in the object store any more.
	sb.Durability = torpor.DurabilityNode
	e.fail(string(via) + ".before-store")
	if err := e.setState(ctx, sb, via); err != nil {
		// Not stored: sb stays what the store holds, so that no caller
		// takes it for started (an archived sandbox's archive would be
		// dropped while the store still names it).
		sb.State, sb.StateSince, sb.Durability = prev, prevSince, prevDurability
		e.hold(sb, prev)
		return err
	}
	if prev == torpor.StateRunning {
		e.awaitRequests(ctx, sb, kind)
	}
	e.fail(string(via) + ".before-runtime")
	return e.boot(ctx, sb, rt, *tmpl, evType, cause)
}

// Hibernate ends a running or paused sandbox's processes and keeps its disk.
func (e *Engine) Hibernate(ctx context.Context, tenant, id string) (*torpor.Sandbox, error) {
	return e.withSandbox(ctx, tenant, id, func(sb *torpor.Sandbox) error {
		return e.hibernate(ctx, sb, CauseAPI)
	})
}

func (e *Engine) hibernate(ctx context.Context, sb *torpor.Sandbox, cause string) error {
	switch sb.State {
	case torpor.StateHibernated, torpor.StateArchived:
		// An archived sandbox is hibernated already, its disk in its
		// archive.
		return nil
	case torpor.StateRunning, torpor.StatePaused, torpor.StateHibernating:
	case torpor.StateTerminated:
		return gone(sb)
	default:
		return torpor.WrongState("hibernate", sb.State)
	}
	rt, err := e.runtime(sb.Runtime.Kind)
	if err != nil {
		return err
	}
	// A snapshot-paused sandbox that came from another node has its disk
	// only in its uploaded snapshot.
	if err := e.fetchSnapshot(ctx, rt, sb); err != nil {
		return err
	}
	wasRunning := sb.State == torpor.StateRunning
	if wasRunning || sb.State == torpor.StatePaused {
		// A paused sandbox's files can be read without waking it: those
		// reads end too before its instance goes (see drain).
		end, err := e.drain(ctx, sb, "hibernate")
		if err != nil {
			return err
		}
		defer end()
	}
	start := time.Now()
	defer func() {
		if sb.State == torpor.StateHibernated {
			e.fail("hibernated.after-store")
			e.observe("hibernate", cause, start)
		}
	}()
	e.fail("hibernating.before-store")
	if err := e.setState(ctx, sb, torpor.StateHibernating); err != nil {
		return err
	}
	e.fail("hibernating.after-store")
	if wasRunning {
		if stay, err := e.stayForTraffic(ctx, sb, cause); stay || err != nil {
			return err
		}
		e.awaitRequests(ctx, sb, "hibernate")
	}
	e.unwatch(sb.ID)
	e.fail("hibernating.before-runtime")
	e.gpuRelease(ctx, sb)
	if err := e.stopRuntime(ctx, rt, sb); err != nil {
		// The sandbox stays hibernating: a hibernate (or the reconcile
		// after a restart) tries the stop again.
		if serr := e.save(ctx, sb, e.event(sb, "sandbox.hibernate_failed", "error", err.Error())); serr != nil {
			e.log.Error("recording a failed hibernation", "sandbox", sb.ID, "err", serr)
		}
		return fmt.Errorf("hibernate %s: %w", sb.ID, err)
	}
	e.fail("hibernating.after-runtime")
	sb.Handle, sb.PauseMode = "", ""
	if sb.Remote != nil && sb.Remote.Host != "" {
		// What is uploaded is a snapshot, not this disk: the disk goes up
		// in its place.
		sb.Durability = torpor.DurabilityNode
	}
	sb.Meters.Hibernations++
	if cause == CauseIdle || cause == CausePlatform || cause == CauseEnd {
		sb.Meters.AutoHibernated++
	}
	if err := e.setState(ctx, sb, torpor.StateHibernated, e.event(sb, torpor.EventHibernated, "cause", cause)); err != nil {
		return err
	}
	e.wakeUploads()
	return nil
}

// Restart boots a running sandbox again on a fresh instance; its disk stays.
func (e *Engine) Restart(ctx context.Context, tenant, id string) (*torpor.Sandbox, error) {
	return e.withSandbox(ctx, tenant, id, func(sb *torpor.Sandbox) error {
		switch sb.State {
		case torpor.StateRunning, torpor.StateRestarting:
			if sb.State == torpor.StateRunning {
				end, err := e.drain(ctx, sb, "restart")
				if err != nil {
					return err
				}
				defer end()
			}
			return e.coldStart(ctx, sb, torpor.StateRestarting, torpor.EventRestarted, CauseAPI)
		case torpor.StateTerminated:
			return gone(sb)
		}
		return torpor.WrongState("restart", sb.State)
	})
}

// Touch records activity on a sandbox.
func (e *Engine) Touch(ctx context.Context, tenant, id string) (*torpor.Sandbox, error) {
	return e.withSandbox(ctx, tenant, id, func(sb *torpor.Sandbox) error {
		if sb.State == torpor.StateTerminated {
			return gone(sb)
		}
		sb.LastActivityAt = e.now()
		return e.save(ctx, sb)
	})
}

// RecordActivity notes traffic or other use of a sandbox that reached it
// other than through an API verb, such as proxied connections. It resets
// the idle clock of a running sandbox and does nothing to one in any other
// state (waking is the caller's business: see Start).
func (e *Engine) RecordActivity(ctx context.Context, id string) error {
	unlock := e.locks.Lock(id)
	defer unlock()
	sb, err := e.store.GetSandbox(ctx, id)
	if err != nil {
		return err
	}
	if sb.State != torpor.StateRunning {
		return nil
	}
	sb.LastActivityAt = e.now()
	return e.save(ctx, sb)
}

// Delete ends a sandbox and removes its disk; the record stays, terminated.
func (e *Engine) Delete(ctx context.Context, tenant, id string) (*torpor.Sandbox, error) {
	return e.withSandbox(ctx, tenant, id, func(sb *torpor.Sandbox) error {
		return e.terminate(ctx, sb, CauseAPI)
	})
}

func (e *Engine) terminate(ctx context.Context, sb *torpor.Sandbox, cause string) error {
	if sb.State == torpor.StateTerminated {
		return nil
	}
	rt, err := e.runtime(sb.Runtime.Kind)
	if err != nil {
		return err
	}
	start := time.Now()
	defer func() {
		if sb.State == torpor.StateTerminated {
			e.fail("terminated.after-store")
			e.observe("terminate", cause, start)
		}
	}()
	if hasHooks(sb, torpor.HookOnTerminate) {
		// Terminate hooks run in a live instance: thaw a paused one first;
		// it is about to go anyway.
		if sb.State == torpor.StatePaused {
			_ = e.thawInstance(ctx, rt, sb)
		}
		if sb.State == torpor.StateRunning || sb.State == torpor.StatePaused {
			e.runHooks(ctx, sb, torpor.HookOnTerminate)
		}
	}
	e.unwatch(sb.ID)
	e.act.forgetCPU(sb.ID)
	e.procMu.Lock()
	delete(e.procs, sb.ID)
	e.procMu.Unlock()
	e.fail("terminating.before-store")
	if err := e.setState(ctx, sb, torpor.StateTerminating); err != nil {
		return err
	}
	e.fail("terminating.before-runtime")
	e.gpuRelease(ctx, sb)
	if err := e.destroyInstance(ctx, rt, sb); err != nil {
		return fmt.Errorf("delete %s: %w", sb.ID, err)
	}
	e.fail("terminating.after-runtime")
	// Its checkpoints go with it (a crash here leaves copies that the
	// reconcile's sweep removes).
	e.dropCheckpoints(ctx, rt, sb)
	if a := sb.Archive; a != nil {
		// Its archive goes while the record still says terminating and
		// names it: a crash here is finished by the reconcile, which
		// removes it again (a missing object is no error).
		e.dropArchive(ctx, a.Key)
		sb.Archive = nil
		e.fail("terminating.after-archive-drop")
	}
	sb.Handle, sb.PauseMode = "", ""
	// One instant: the sandbox's end, its event's and its last usage row's.
	now := e.now()
	sb.TerminatedAt = &now
	sb.State, sb.StateSince = torpor.StateTerminated, now
	ev := e.event(sb, torpor.EventTerminated, "cause", cause)
	ev.Time = now
	remote := sb.Remote
	sb.Remote = nil
	if err := e.save(ctx, sb, ev); err != nil {
		sb.Remote = remote
		return err
	}
	// Its copy in the object store goes after the end is stored: a crash
	// in between leaves objects behind, never a sandbox without them.
	e.dropRemote(ctx, remote)
	return nil
}

// Exec runs a command in a running sandbox and counts as activity, when it
// starts and when it ends. A paused or hibernated sandbox is woken first
// when its policy has auto_resume. A sandbox that stops running while the
// command runs (a pause that outlasted the drain timeout, see drain) is a
// conflict with its state, answered at once (see untilStopped).
func (e *Engine) Exec(ctx context.Context, tenant, id string, req torpor.ExecRequest) (torpor.ExecResult, error) {
	if err := validateExec(req); err != nil {
		return torpor.ExecResult{}, err
	}
	var rt torpor.Runtime
	var stopped <-chan struct{}
	sb, err := e.operate(ctx, tenant, id, "exec in", true, func(sb *torpor.Sandbox) (err error) {
		rt, err = e.runtime(sb.Runtime.Kind)
		stopped = e.runSignal(sb.ID)
		return err
	})
	if err != nil {
		return torpor.ExecResult{}, err
	}
	started := e.now()
	if req.Env, err = e.execEnv(ctx, sb, req.Env); err != nil {
		e.done(tenant, id, started)
		return torpor.ExecResult{}, err
	}
	var streams execIO
	streams.wrap(&req)
	return untilStopped(e, ctx, sb, stopped, "the command", func(ctx context.Context) (res torpor.ExecResult, err error) {
		err = e.gpuJob(ctx, sb, func() (err error) {
			res, err = rt.Exec(ctx, ref(sb), req)
			return err
		})
		return res, err
	}, streams.detach, func() { e.done(tenant, id, started) })
}

// SandboxFS is an optional Runtime capability of runtimes whose
// sandboxes' files are not a directory on the host (a microVM's disk lives
// in its guest): the files API's operations run inside the sandbox, with
// the confinement and errors of package files. A sandbox without a
// running instance (a frozen one included) is a conflict.
type SandboxFS interface {
	SandboxFS(ctx context.Context, ref torpor.InstanceRef) (files.FS, error)
}

// Files prepares an operation on a sandbox's files and returns them,
// confined to the sandbox (see torpor.FileRoot and SandboxFS). Reading the
// files of a paused container does not wake it; writing follows the
// sandbox's auto_resume rule, as every other operation, and so does
// reading those of a runtime that can only reach them through the running
// sandbox. Both count as activity. done must be called when the operation
// ends; it closes the FS.
func (e *Engine) Files(ctx context.Context, tenant, id string, write bool) (fsys files.FS, done func(), err error) {
	var rt torpor.Runtime
	sb, err := e.withSandbox(ctx, tenant, id, func(sb *torpor.Sandbox) (err error) {
		rt, err = e.runtime(sb.Runtime.Kind)
		return err
	})
	if err != nil {
		return nil, nil, err
	}
	_, onHost := rt.(torpor.FileRoot)
	if _, inside := rt.(SandboxFS); !onHost && !inside {
		return nil, nil, torpor.Errorf(torpor.EInvalid, "the %s runtime does not give access to files", rt.Kind())
	}
	sb, err = e.operate(ctx, tenant, id, "use the files of", write || !onHost, func(*torpor.Sandbox) error { return nil })
	if err != nil {
		return nil, nil, err
	}
	started := e.now()
	finish := func() { e.done(tenant, id, started) }
	if sfs, ok := rt.(SandboxFS); ok && !onHost {
		if fsys, err = sfs.SandboxFS(ctx, ref(sb)); err != nil {
			finish()
			return nil, nil, err
		}
	} else {
		dir, err := rt.(torpor.FileRoot).RootFS(ctx, ref(sb))
		if err != nil {
			finish()
			return nil, nil, err
		}
		root, err := files.OpenRoot(dir)
		if err != nil {
			finish()
			return nil, nil, err
		}
		fsys = files.HostFS(root)
	}
	fsys = withoutVolumes(fsys, sb)
	return fsys, func() { fsys.Close(); finish() }, nil
}

// operate prepares an operation on a sandbox (exec, files, code): it wakes
// the sandbox if it sleeps and its policy allows (a paused one only when
// wakePaused), notes the activity, and marks the sandbox busy so that the
// idle engine leaves it alone until done is called.
//
// The activity is noted in memory, not stored: an operation costs no
// write of its own (an fsync, most of what a short exec cost). The idle
// engine and every view of the sandbox see it at once (activity.latest);
// it reaches the store with the sandbox's next write or the next traffic
// flush (trafficFlush), whichever comes first. What a daemon killed in
// between loses, its restart makes up for: reconcile counts the restart
// as activity, so a crash can only put an idle pause off, never bring
// one early (docs/idle.md).
func (e *Engine) operate(ctx context.Context, tenant, id, what string, wakePaused bool, fn func(sb *torpor.Sandbox) error) (*torpor.Sandbox, error) {
	if wakePaused && e.dataDiskFull != nil && e.dataDiskFull() {
		// It would write into the sandbox (a file, or whatever the
		// command does) what a full host cannot keep: refused, as every
		// change is while the data disk is full (diskfull.go).
		return nil, torpor.DiskFull()
	}
	return e.withSandbox(ctx, tenant, id, func(sb *torpor.Sandbox) error {
		if wakePaused || sb.State != torpor.StatePaused {
			if err := e.wake(ctx, sb, what); err != nil {
				return err
			}
		}
		if err := fn(sb); err != nil {
			return err
		}
		if sb.State == torpor.StateRunning {
			e.act.noteTraffic(id, e.now(), 0)
		}
		e.act.opStarted(id)
		return nil
	})
}

// done ends an operation begun with operate at started and notes the
// activity as operate does, unless a pause or hibernation of the sandbox
// is under way (see drain), which makes it moot. It never takes the
// sandbox's lock, which a drain holding that lock relies on.
func (e *Engine) done(tenant, id string, started time.Time) {
	if stopping := e.act.opEnded(id); stopping {
		return
	}
	if now := e.now(); now.After(started) {
		e.act.noteTraffic(id, now, 0)
	}
}

// wake makes sure sb is running for an operation, resuming it when it is
// paused or hibernated and its policy has auto_resume. Callers that arrive
// together queue on the sandbox's lock and share the one resume.
func (e *Engine) wake(ctx context.Context, sb *torpor.Sandbox, what string) error {
	switch sb.State {
	case torpor.StateRunning:
		return nil
	case torpor.StatePaused, torpor.StateHibernated, torpor.StateArchived:
		if !sb.Policy().AutoResume {
			return &torpor.Error{Code: torpor.EConflict, State: sb.State, Reason: "paused",
				Message: fmt.Sprintf("sandbox %s is %s and auto_resume is off; call connect (or start) first", sb.ID, sb.State)}
		}
		start := time.Now()
		if err := e.start(ctx, sb, CauseAuto); err != nil {
			return err
		}
		e.obs.Transition("auto_resume_wait", CauseAuto, time.Since(start))
		if sb.State != torpor.StateRunning {
			return &torpor.Error{Code: torpor.EConflict, State: sb.State, Reason: "state",
				Message: fmt.Sprintf("sandbox %s did not come back: it is %s", sb.ID, sb.State)}
		}
		return nil
	case torpor.StateTerminated:
		return gone(sb)
	}
	return torpor.WrongState(what, sb.State)
}

func validateExec(req torpor.ExecRequest) error {
	if err := torpor.ValidateArgv("cmd", req.Cmd, false); err != nil {
		return err
	}
	if err := torpor.ValidateEnv(req.Env); err != nil {
		return err
	}
	if req.Cwd != "" && (!path.IsAbs(req.Cwd) || strings.ContainsRune(req.Cwd, 0) || len(req.Cwd) > 4096) {
		return torpor.Invalid("cwd", "must be an absolute path")
	}
	if req.User != "" && !userRe.MatchString(req.User) {
		return torpor.Invalid("user", "must be a user name or uid[:gid]")
	}
	if req.Timeout < 0 || req.Timeout > MaxExecTimeout {
		return torpor.Invalid("timeout_seconds", "must be between 0 and %d", int(MaxExecTimeout.Seconds()))
	}
	return nil
}

// observeIfRunning reports a transition that ends in running.
func (e *Engine) observeIfRunning(sb *torpor.Sandbox, kind, cause string, start time.Time) {
	if sb.State == torpor.StateRunning {
		e.observe(kind, cause, start)
	}
}
