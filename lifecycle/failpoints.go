package lifecycle

import "strings"

// The engine calls Config.Failpoint at every step of every transition,
// named <transition>.<step>, so that crash tests can kill the daemon there
// and check what a restart makes of it. The transition is named by the
// state it passes through (pausing, resuming, hibernating, starting,
// restarting, terminating; a new sandbox's first write is create) and its
// steps are, in order:
//
//   - before-store: nothing of the transition is stored yet;
//   - after-store: its in-between state is stored, where something comes
//     between that write and the runtime call (otherwise before-runtime is
//     the same point);
//   - before-runtime: the runtime is about to act;
//   - after-runtime: the runtime acted; where the transition lands is not
//     stored yet (it is the point before that write too).
//
// After the write that ends it, the point is named by where it landed, as
// its event is: paused, resumed, started, restarted, hibernated,
// terminated, with the step after-store. A boot (create, start from
// hibernated or failed, and a restart's boot) reaches starting.after-runtime
// or restarting.after-runtime and started.after-store or
// restarted.after-store. The idle engine's pauses, hibernations and kills
// go through the same verbs, and so through the same points.
//
// A pause by freeze and a resume from one (of a sandbox without a GPU)
// store no in-between state (see recordsPausing): they pass no
// pausing.before-store, pausing.after-store or resuming.before-store, and
// their before-runtime and after-runtime points come before the one write
// that stores where they land. The idle engine's pauses by freeze still
// store pausing first, and so pass pausing's points (InBetweenFailpoints).
//
// A create that claims a warm pool's member (pool.go) boots nothing and
// passes none of create's or starting's points: its transition is named
// claim, and its runtime call is the thaw, which comes before its one
// write, so its steps are:
//
//   - after-thaw: the member's instance runs, and its record is still
//     the pool's, frozen (a restart removes it; no tenant heard of it);
//   - after-store: the claimant's record is stored, running, and its
//     on-start hooks have not run yet.
//
// An archive (archive.go) stores archiving with its archive's key
// (archiving.before-store, archiving.after-store), writes the archive
// (archiving.after-upload), stores archived (archived.after-store) and then
// removes the working copy. A start of an archived sandbox imports its
// archive (restoring.before-import, restoring.after-import) before the
// boot's points, and once the boot is stored removes the archive
// (restored.before-drop); a delete of an archived sandbox removes it after
// the runtime's destroy, before terminated is stored
// (terminating.after-archive-drop).
//
// Checkpoints, forks and restores (checkpoint.go, docs/fork.md): a
// checkpoint stores its entry creating (checkpointing.before-store,
// .after-store), copies the disk (checkpointing.after-copy) and stores it
// ready; a checkpoint's delete drops its entry before its copy
// (checkpoint-delete.after-store); a fork stores its forks' ids in its
// parent (forking.before-store, .after-store), copies a parent's disk when
// no checkpoint is named (forking.after-checkpoint), makes and boots each
// fork (forking.after-clone, then starting's boot points), and commits (forking.before-commit,
// .after-commit); a restore stores the checkpoint's name
// (restoring-checkpoint.before-store, .after-store), replaces the disk
// (restoring-checkpoint.after-copy) and boots a running sandbox again
// through restarting's points.
var failpoints = []string{
	"create.before-store",
	"create.before-runtime",
	"starting.after-runtime",
	"started.after-store",

	"pausing.before-store",
	"pausing.after-store",
	"pausing.before-runtime",
	"pausing.after-runtime",
	"paused.after-store",

	"resuming.before-store",
	"resuming.before-runtime",
	"resuming.after-runtime",
	"resumed.after-store",

	"hibernating.before-store",
	"hibernating.after-store",
	"hibernating.before-runtime",
	"hibernating.after-runtime",
	"hibernated.after-store",

	"starting.before-store",
	"starting.before-runtime",

	"restarting.before-store",
	"restarting.before-runtime",
	"restarting.after-runtime",
	"restarted.after-store",

	"terminating.before-store",
	"terminating.before-runtime",
	"terminating.after-runtime",
	"terminated.after-store",

	"claim.after-thaw",
	"claim.after-store",

	"archiving.before-store",
	"archiving.after-store",
	"archiving.after-upload",
	"archived.after-store",

	"restoring.before-import",
	"restoring.after-import",
	"restored.before-drop",
	"terminating.after-archive-drop",

	"checkpointing.before-store",
	"checkpointing.after-store",
	"checkpointing.after-copy",
	"checkpoint-delete.after-store",
	"forking.before-store",
	"forking.after-store",
	"forking.after-checkpoint",
	"forking.after-clone",
	"forking.before-commit",
	"forking.after-commit",
	"restoring-checkpoint.before-store",
	"restoring-checkpoint.after-store",
	"restoring-checkpoint.after-copy",
}

// Failpoints returns the name of every point at which the engine calls
// Config.Failpoint, grouped by transition, so that a crash test can go
// through all of them and a point added later cannot be left out (the
// lifecycle tests fail on a point reached that this list lacks).
func Failpoints() []string { return append([]string(nil), failpoints...) }

// inBetween are the points of the in-between records that a pause by
// freeze and a resume from one skip (see the list above).
var inBetween = []string{"pausing.before-store", "pausing.after-store", "resuming.before-store"}

// InBetweenFailpoints returns the points, among Failpoints, that the
// pauses and resumes of a runtime that only freezes (and of sandboxes
// without a GPU) reach only through the idle engine (the pausing ones) or
// never (resuming.before-store), so that its crash matrix knows them.
func InBetweenFailpoints() []string { return append([]string(nil), inBetween...) }

// landed names the point after the write that ends a boot, by the event
// that write records (sandbox.started: "started.after-store").
func landed(evType string) string {
	return strings.TrimPrefix(evType, "sandbox.") + ".after-store"
}
