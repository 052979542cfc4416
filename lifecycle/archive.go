package lifecycle

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/torpor-dev/torpor"
)

// The archive tier (docs/archive.md): a sandbox hibernated for its
// policy's archive_after_hibernated_seconds has its disk exported by its
// runtime (torpor.DiskArchiver: one zstd-compressed stream) into the
// archive store, then its working copy removed from the node. A start
// (or connect, or an auto-resume) imports it back and boots it as from
// hibernated.
//
// Crash safety. The archive's key is stored, with the state archiving,
// before anything is written under it; the working copy goes only once
// archived is stored; the archive object goes only once a state that no
// longer needs it (starting, running, terminated) is stored. reconcileArchive
// puts each cut-short step right after a restart.

// Archive archives a hibernated sandbox now, as its policy's
// archive_after_hibernated_seconds would (docs/archive.md).
func (e *Engine) Archive(ctx context.Context, tenant, id string) (*torpor.Sandbox, error) {
	return e.withSandbox(ctx, tenant, id, func(sb *torpor.Sandbox) error {
		return e.archive(ctx, sb, CauseAPI)
	})
}

// The kinds of archive (torpor.ArchiveInfo.Kind).
const (
	archiveDisk     = "disk"
	archiveSnapshot = "snapshot"
)

// archive packs sb's kept state into its archive and frees the working
// copy: a hibernated sandbox's disk, or a snapshot-paused one's disk and
// memory snapshot (when its runtime can export them,
// torpor.SnapshotArchiver). An archived sandbox is left as it is.
func (e *Engine) archive(ctx context.Context, sb *torpor.Sandbox, cause string) error {
	switch sb.State {
	case torpor.StateArchived:
		return nil
	case torpor.StateHibernated:
	case torpor.StatePaused:
		if sb.PauseMode != torpor.PauseSnapshot || e.snapshotArchiver(sb) == nil {
			return &torpor.Error{Code: torpor.EConflict, State: sb.State, Reason: "state",
				Message: fmt.Sprintf("sandbox %s is paused by %s, which cannot be archived; hibernate it first", sb.ID, sb.PauseMode)}
		}
	case torpor.StateTerminated:
		return gone(sb)
	default:
		return torpor.WrongState("archive", sb.State)
	}
	if e.archives == nil {
		return torpor.Errorf(torpor.EUnavailable, "no archive store is configured")
	}
	rt, err := e.runtime(sb.Runtime.Kind)
	if err != nil {
		return err
	}
	kind := archiveDisk
	var export func(w io.Writer) (int64, error)
	if sb.State == torpor.StatePaused {
		kind = archiveSnapshot
		snap := e.snapshotArchiver(sb)
		if err := e.fetchSnapshot(ctx, rt, sb); err != nil {
			return err
		}
		export = func(w io.Writer) (int64, error) { return snap.ExportSnapshot(ctx, ref(sb), w) }
	} else {
		arch, ok := rt.(torpor.DiskArchiver)
		if !ok {
			return torpor.Errorf(torpor.EUnavailable, "the %s runtime cannot export a disk to archive", rt.Kind())
		}
		if err := e.fetchDisk(ctx, rt, sb); err != nil {
			// Its disk is only in the fleet's object store (it came from
			// another node): it comes here first.
			return err
		}
		export = func(w io.Writer) (int64, error) { return arch.ExportDisk(ctx, ref(sb), w) }
	}
	prev := sb.State
	start := time.Now()
	key := fmt.Sprintf("archives/%s/%d-%s.tar.zst", sb.ID, sb.Boots, torpor.NewID("", 6))
	sb.Archive = &torpor.ArchiveInfo{Key: key, Kind: kind}
	e.fail("archiving.before-store")
	if err := e.setState(ctx, sb, torpor.StateArchiving); err != nil {
		sb.Archive = nil
		return err
	}
	e.fail("archiving.after-store")
	n, err := e.exportArchive(ctx, export, key)
	if err != nil {
		e.dropArchive(ctx, key)
		sb.Archive = nil
		if serr := e.setState(ctx, sb, prev, e.event(sb, EventArchiveFailed, "cause", cause, "error", err.Error())); serr != nil {
			e.log.Error("recording a failed archive", "sandbox", sb.ID, "err", serr)
		}
		return fmt.Errorf("archive %s: %w", sb.ID, err)
	}
	e.fail("archiving.after-upload")
	sb.Archive.Bytes, sb.Archive.ArchivedAt = n, e.now()
	// The fleet's upload of the disk (if any) is a copy the archive
	// replaces.
	// (A snapshot's record is dropped by the meter, once billed.)
	remote := sb.Remote
	sb.Remote, sb.Durability = nil, torpor.DurabilityNode
	if err := e.setState(ctx, sb, torpor.StateArchived, e.event(sb, torpor.EventArchived, "cause", cause, "bytes", itoa(n), "kind", kind)); err != nil {
		sb.Remote = remote
		return err
	}
	e.fail("archived.after-store")
	e.dropRemote(ctx, remote)
	if err := e.destroyInstance(ctx, rt, sb); err != nil {
		// The reconcile after a restart removes it; the archive is what
		// counts now.
		e.log.Warn("removing the working copy of an archived sandbox", "sandbox", sb.ID, "err", err)
	}
	e.observe("archive", cause, start)
	e.log.Info("sandbox archived", "sandbox", sb.ID, "bytes", n, "to", e.archives.Where())
	return nil
}

// EventArchiveFailed: an archive did not finish; the sandbox stays
// hibernated and is archived again after its policy's time.
const EventArchiveFailed = "sandbox.archive_failed"

// exportArchive streams what export writes into the archive store under
// key and returns the bytes written.
func (e *Engine) exportArchive(ctx context.Context, export func(io.Writer) (int64, error), key string) (int64, error) {
	pr, pw := io.Pipe()
	done := make(chan int64, 1)
	go func() {
		n, err := export(pw)
		pw.CloseWithError(err)
		done <- n
	}()
	err := e.archives.Put(ctx, key, pr, -1)
	pr.CloseWithError(io.ErrClosedPipe)
	n := <-done
	return n, err
}

// fetchArchive makes archived sb's disk on this node again from its
// archive, ahead of its boot. The archive object stays until the boot is
// stored (finishRestore).
func (e *Engine) fetchArchive(ctx context.Context, rt torpor.Runtime, sb *torpor.Sandbox) error {
	if sb.State != torpor.StateArchived || sb.Archive == nil {
		return nil
	}
	if e.archives == nil {
		return torpor.Errorf(torpor.EUnavailable, "sandbox %s is archived and this node has no archive store", sb.ID)
	}
	var snap torpor.SnapshotArchiver
	arch, ok := rt.(torpor.DiskArchiver)
	if sb.Archive.Kind == archiveSnapshot {
		snap, ok = rt.(torpor.SnapshotArchiver)
	}
	if !ok {
		return torpor.Errorf(torpor.EUnavailable, "the %s runtime cannot import a %s archive", rt.Kind(), sb.Archive.Kind)
	}
	// A copy found here is one a restore cut short left: never trusted.
	if st, err := rt.Inspect(ctx, ref(sb)); err == nil && st.DiskExists {
		if err := e.destroyInstance(ctx, rt, sb); err != nil {
			return err
		}
	}
	e.fail("restoring.before-import")
	r, err := e.archives.Get(ctx, sb.Archive.Key)
	if err != nil {
		return fmt.Errorf("read the archive of %s: %w", sb.ID, err)
	}
	defer r.Close()
	start := time.Now()
	if snap != nil {
		info, err := snap.ImportSnapshot(ctx, sb.ID, r)
		if err != nil {
			_ = e.destroyInstance(ctx, rt, sb)
			return fmt.Errorf("restore the archive of %s: %w", sb.ID, err)
		}
		sb.Snapshot = &info
	} else if err := arch.ImportDisk(ctx, sb.ID, r); err != nil {
		_ = e.destroyInstance(ctx, rt, sb)
		return fmt.Errorf("restore the archive of %s: %w", sb.ID, err)
	}
	e.fail("restoring.after-import")
	now := e.now()
	sb.RestoredFromArchiveAt = &now
	e.log.Info("sandbox restored from its archive", "sandbox", sb.ID, "bytes", sb.Archive.Bytes, "took", time.Since(start))
	return nil
}

// restoreSnapshotArchive brings archived sb, whose archive holds its disk
// and memory snapshot, back to paused on this node (its archive still
// named, until its resume is stored).
func (e *Engine) restoreSnapshotArchive(ctx context.Context, sb *torpor.Sandbox, cause string) error {
	rt, err := e.runtime(sb.Runtime.Kind)
	if err != nil {
		return err
	}
	if err := e.fetchArchive(ctx, rt, sb); err != nil {
		sb.Snapshot = nil
		return err
	}
	return e.setState(ctx, sb, torpor.StatePaused, e.event(sb, torpor.EventPaused, "cause", cause, "mode", string(torpor.PauseSnapshot), "restored_from", "archive"))
}

// finishRestore removes the archive of sb once a state that does not need
// it is stored (its disk is on the node again).
func (e *Engine) finishRestore(ctx context.Context, sb *torpor.Sandbox) error {
	if sb.Archive == nil || sb.State == torpor.StateArchived || sb.State == torpor.StateArchiving {
		return nil
	}
	// The object goes first: a record that names an archive gone is put
	// right by the reconcile, an archive no record names would be lost.
	e.fail("restored.before-drop")
	e.dropArchive(ctx, sb.Archive.Key)
	sb.Archive = nil
	return e.save(ctx, sb)
}

func (e *Engine) dropArchive(ctx context.Context, key string) {
	if e.archives == nil || key == "" {
		return
	}
	if err := e.archives.Delete(context.WithoutCancel(ctx), key); err != nil {
		e.log.Warn("removing an archive", "key", key, "err", err)
	}
}

// reconcileArchive puts right, after a restart, what an archive or a
// restore cut short left: an archiving sandbox goes back to hibernated,
// or paused for a snapshot's archive (its working copy is still here) and its half-written archive goes; an
// archived one's working copy (not yet removed, or a restore's partial
// import) goes; a sandbox that left the archived state keeps its disk here
// and its archive goes. It reports whether it handled sb.
func (e *Engine) reconcileArchive(ctx context.Context, rt torpor.Runtime, sb *torpor.Sandbox, st torpor.InstanceStatus) (bool, error) {
	switch {
	case sb.State == torpor.StateArchiving:
		key, back := "", e.event(sb, torpor.EventHibernated, "cause", CauseReconcile, "reason", "archive cut short")
		to := torpor.StateHibernated
		if sb.Archive != nil {
			key = sb.Archive.Key
			if sb.Archive.Kind == archiveSnapshot {
				// Its snapshot and disk are still here: paused again.
				to, back = torpor.StatePaused, e.event(sb, torpor.EventPaused, "cause", CauseReconcile, "mode", string(torpor.PauseSnapshot), "reason", "archive cut short")
			}
		}
		// The half-written object goes first: a record naming an object
		// gone is put right again by the next reconcile, an object no
		// record names would stay.
		e.dropArchive(ctx, key)
		sb.Archive = nil
		if err := e.setState(ctx, sb, to, back); err != nil {
			return true, err
		}
		return true, nil
	case sb.State == torpor.StateArchived:
		if st.DiskExists || st.State != torpor.InstanceMissing {
			return true, e.destroyInstance(ctx, rt, sb)
		}
		return true, nil
	case sb.Archive != nil:
		// Cut short between the boot's store and the archive's removal,
		// or a delete's.
		return false, e.finishRestore(ctx, sb)
	}
	return false, nil
}
