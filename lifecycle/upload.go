package lifecycle

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/torpor-dev/torpor"
)

// manifest is what the object store keeps beside a sandbox's uploaded
// disk (or VM memory snapshot), written after it: a disk without its
// manifest was never finished and is never read.
type manifest struct {
	Format  int    `json:"format"`
	Sandbox string `json:"sandbox"`
	Runtime string `json:"runtime"`
	// Kind is what was uploaded: manifestDisk (a hibernated sandbox's disk,
	// at Disk; also when empty) or manifestSnapshot (a snapshot-paused
	// sandbox's whole state, disk and memory, at Snapshot).
	Kind     string `json:"kind,omitempty"`
	Template string `json:"template"`
	Boots    int    `json:"boots"`
	Disk     string `json:"disk,omitempty"`
	Snapshot string `json:"snapshot,omitempty"`
	// DiskBytes is the size of the object uploaded (Disk or Snapshot).
	DiskBytes int64  `json:"disk_bytes"`
	Node      string `json:"node"`
	// Host is the Host of the node that made a snapshot: only a node of
	// the same Host resumes it.
	Host string `json:"host,omitempty"`
	// UploadedAt is when the upload ended.
	UploadedAt time.Time `json:"uploaded_at"`
}

const manifestFormat = 1

// The kinds of a manifest.
const (
	manifestDisk     = "disk"
	manifestSnapshot = "snapshot"
)

// object is the key of what the manifest lists.
func (m manifest) object() string {
	if m.Kind == manifestSnapshot {
		return m.Snapshot
	}
	return m.Disk
}

// The upload's retry waits, doubling from the first to the last.
const (
	uploadRetryFirst = time.Second
	uploadRetryLast  = time.Minute
)

// wakeUploads tells the uploader a sandbox was hibernated (or paused by
// snapshot).
func (e *Engine) wakeUploads() {
	if e.fleet == nil || e.fleet.cfg.Objects == nil {
		return
	}
	select {
	case e.fleet.uploadWake <- struct{}{}:
	default:
	}
}

// runUploads uploads the disks of this node's hibernated sandboxes, and
// the snapshots of its snapshot-paused ones whose runtime can export them
// (torpor.SnapshotArchiver), that are only here (durability node) once
// they have been so for UploadAfter, retrying a failing upload with a
// growing wait, until ctx ends. It works from the store, so an upload cut
// short by a crash is made again after the restart.
func (e *Engine) runUploads(ctx context.Context) {
	f := e.fleet
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		e.uploadDue(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-f.uploadWake:
		}
	}
}

// uploadDue uploads every disk and snapshot that is due.
func (e *Engine) uploadDue(ctx context.Context) {
	f := e.fleet
	if e.leaseErr() != nil {
		return
	}
	sbs, err := e.store.ListSandboxes(ctx, torpor.SandboxFilter{Node: e.node, States: []torpor.State{torpor.StateHibernated, torpor.StatePaused}})
	if err != nil {
		if ctx.Err() == nil {
			e.log.Warn("fleet: listing disks to upload", "err", err)
		}
		return
	}
	now := e.now()
	for _, sb := range sbs {
		if ctx.Err() != nil {
			return
		}
		if sb.Durability == torpor.DurabilityRemote || sb.Tenant == torpor.PoolTenant || now.Sub(sb.StateSince) < f.cfg.UploadAfter {
			continue
		}
		if sb.State == torpor.StatePaused && e.snapshotArchiver(sb) == nil {
			continue // frozen, or a runtime whose snapshots stay here
		}
		f.mu.Lock()
		b := f.uploadFail[sb.ID]
		f.mu.Unlock()
		if now.Before(b.next) {
			continue
		}
		err := e.upload(ctx, sb.ID)
		f.mu.Lock()
		if err == nil {
			delete(f.uploadFail, sb.ID)
		} else {
			b.wait = min(max(2*b.wait, uploadRetryFirst), uploadRetryLast)
			b.next = e.now().Add(b.wait)
			f.uploadFail[sb.ID] = b
		}
		f.mu.Unlock()
		if err != nil && ctx.Err() == nil {
			e.log.Warn("fleet: upload failed; it is tried again", "sandbox", sb.ID, "retry_in", b.wait, "err", err)
		}
	}
}

// upload puts the disk of hibernated sandbox id (or the whole state of a
// snapshot-paused one: its disk and memory snapshot) in the object store,
// then its manifest, then records durability remote. The transfer holds
// no lock: a sandbox that changed meanwhile keeps its record, and the
// objects of that upload are removed.
func (e *Engine) upload(ctx context.Context, id string) error {
	f := e.fleet
	if f == nil || f.cfg.Objects == nil {
		return torpor.Errorf(torpor.EUnavailable, "no object store is configured")
	}
	defer f.uploads.Lock(id)()
	sb, err := e.store.GetSandbox(ctx, id)
	if err != nil {
		return err
	}
	if sb.Node != e.node || (sb.State != torpor.StateHibernated && sb.State != torpor.StatePaused) {
		return nil
	}
	if sb.Durability == torpor.DurabilityRemote {
		return nil
	}
	rt, err := e.runtime(sb.Runtime.Kind)
	if err != nil {
		return err
	}
	// A key of this attempt's own: one cut short leaves objects no
	// record names, never half of a recorded upload.
	prefix := fmt.Sprintf("sandboxes/%s/%d-%d-%s", id, sb.Boots, sb.Version, torpor.NewID("", 6))
	m := manifest{Format: manifestFormat, Sandbox: id, Runtime: rt.Kind(), Kind: manifestDisk, Template: sb.Template, Boots: sb.Boots, Node: e.node}
	var export func(w io.Writer) (int64, error)
	if sb.State == torpor.StatePaused {
		snap := e.snapshotArchiver(sb)
		if snap == nil {
			return torpor.Errorf(torpor.EUnavailable, "sandbox %s is paused by %s in the %s runtime, whose state cannot be exported", id, sb.PauseMode, rt.Kind())
		}
		m.Kind, m.Snapshot, m.Host = manifestSnapshot, prefix+"/snapshot", e.snapshotHost()
		export = func(w io.Writer) (int64, error) { return snap.ExportSnapshot(ctx, ref(sb), w) }
	} else {
		arch, ok := rt.(torpor.DiskArchiver)
		if !ok {
			return torpor.Errorf(torpor.EUnavailable, "the %s runtime cannot export a disk", rt.Kind())
		}
		m.Disk = prefix + "/disk"
		export = func(w io.Writer) (int64, error) { return arch.ExportDisk(ctx, ref(sb), w) }
	}
	pr, pw := io.Pipe()
	done := make(chan int64, 1)
	go func() {
		n, err := export(pw)
		pw.CloseWithError(err)
		done <- n
	}()
	err = f.cfg.Objects.Put(ctx, m.object(), pr, -1)
	pr.CloseWithError(io.ErrClosedPipe)
	m.DiskBytes = <-done
	if err != nil {
		return fmt.Errorf("upload the %s of %s: %w", m.Kind, id, err)
	}
	m.UploadedAt = e.now()
	mj, _ := json.Marshal(m)
	manifestKey := prefix + "/manifest.json"
	if err := f.cfg.Objects.Put(ctx, manifestKey, strings.NewReader(string(mj)), int64(len(mj))); err != nil {
		e.dropObjects(ctx, m.object())
		return fmt.Errorf("upload the manifest of %s: %w", id, err)
	}
	e.fail("upload.after-manifest")
	unlock := e.locks.Lock(id)
	defer unlock()
	cur, err := e.store.GetSandbox(ctx, id)
	if err != nil {
		return err
	}
	if !sameState(cur, sb) || cur.Node != e.node {
		// It started, or moved, while its disk went up: that copy is old.
		e.dropObjects(ctx, m.object(), manifestKey)
		return nil
	}
	old := cur.Remote
	cur.Durability = torpor.DurabilityRemote
	cur.Remote = &torpor.RemoteState{Manifest: manifestKey, Bytes: m.DiskBytes, Boots: sb.Boots, UploadedAt: m.UploadedAt, Host: m.Host}
	if err := e.save(ctx, cur, e.event(cur, torpor.EventUploaded, "bytes", itoa(m.DiskBytes), "manifest", manifestKey, "kind", m.Kind)); err != nil {
		// A commit whose answer was lost may have stored the record that
		// names these objects: they go only when the store says it does
		// not (a leaked object beats a lost disk).
		if again, gerr := e.store.GetSandbox(context.WithoutCancel(ctx), id); gerr == nil && (again.Remote == nil || again.Remote.Manifest != manifestKey) {
			e.dropObjects(ctx, m.object(), manifestKey)
		}
		return err
	}
	e.log.Info("fleet: "+m.Kind+" uploaded", "sandbox", id, "bytes", m.DiskBytes, "to", f.cfg.Objects.Where())
	if old != nil && old.Manifest != manifestKey {
		e.dropRemote(ctx, old)
	}
	return nil
}

// fetchDisk makes sb's disk on this node from the object store, when the
// sandbox's state is there and its disk is not here.
func (e *Engine) fetchDisk(ctx context.Context, rt torpor.Runtime, sb *torpor.Sandbox) error {
	if e.fleet == nil || sb.Durability != torpor.DurabilityRemote || sb.Remote == nil {
		return nil
	}
	st, err := rt.Inspect(ctx, ref(sb))
	if err != nil {
		return err
	}
	if st.DiskExists {
		return nil
	}
	objs := e.fleet.cfg.Objects
	if objs == nil {
		return torpor.Errorf(torpor.EUnavailable, "sandbox %s's disk is in an object store this node has none of (object_store)", sb.ID)
	}
	arch, ok := rt.(torpor.DiskArchiver)
	if !ok {
		return torpor.Errorf(torpor.EUnavailable, "the %s runtime cannot import a disk", rt.Kind())
	}
	m, err := e.readManifest(ctx, sb.Remote.Manifest)
	if err != nil {
		return err
	}
	if m.Sandbox != sb.ID {
		return fmt.Errorf("the manifest %s is of sandbox %s, not %s", sb.Remote.Manifest, m.Sandbox, sb.ID)
	}
	if m.Kind == manifestSnapshot {
		// Its disk travels in its snapshot, which a boot drops.
		return e.importSnapshot(ctx, rt, sb, m)
	}
	r, err := objs.Get(ctx, m.Disk)
	if err != nil {
		return fmt.Errorf("download the disk of %s: %w", sb.ID, err)
	}
	defer r.Close()
	start := time.Now()
	if err := arch.ImportDisk(ctx, sb.ID, r); err != nil {
		return fmt.Errorf("import the disk of %s: %w", sb.ID, err)
	}
	e.log.Info("fleet: disk downloaded", "sandbox", sb.ID, "bytes", m.DiskBytes, "took", time.Since(start))
	return nil
}

func (e *Engine) readManifest(ctx context.Context, key string) (manifest, error) {
	var m manifest
	r, err := e.fleet.cfg.Objects.Get(ctx, key)
	if err != nil {
		return m, fmt.Errorf("read manifest %s: %w", key, err)
	}
	defer r.Close()
	if err := json.NewDecoder(io.LimitReader(r, 1<<20)).Decode(&m); err != nil {
		return m, fmt.Errorf("read manifest %s: %w", key, err)
	}
	if m.Format != manifestFormat {
		return m, fmt.Errorf("manifest %s has format %d; this node reads %d", key, m.Format, manifestFormat)
	}
	return m, nil
}

// dropRemote removes an upload's objects (its manifest first, so that a
// half-removed upload is never read).
func (e *Engine) dropRemote(ctx context.Context, r *torpor.RemoteState) {
	if e.fleet == nil || e.fleet.cfg.Objects == nil || r == nil {
		return
	}
	m, err := e.readManifest(ctx, r.Manifest)
	keys := []string{r.Manifest}
	if err == nil {
		keys = append(keys, m.object())
	}
	e.dropObjects(ctx, keys...)
}

func (e *Engine) dropObjects(ctx context.Context, keys ...string) {
	for _, k := range keys {
		if err := e.fleet.cfg.Objects.Delete(context.WithoutCancel(ctx), k); err != nil {
			e.log.Warn("fleet: removing an object", "key", k, "err", err)
		}
	}
}

// sameState reports whether cur is the state of sandbox sb was in: not
// started, paused, hibernated or moved since, whatever else its record
// says now (the settlement of its usage writes it every settle_seconds,
// which a long upload outlasts).
func sameState(cur, sb *torpor.Sandbox) bool {
	return cur.State == sb.State && cur.StateSince.Equal(sb.StateSince) && cur.Boots == sb.Boots &&
		cur.Node == sb.Node && cur.NodeEpoch == sb.NodeEpoch && cur.PauseMode == sb.PauseMode
}

// snapshotArchiver is sb's runtime as a torpor.SnapshotArchiver when sb
// is paused by snapshot in a runtime that can export it (nil otherwise).
func (e *Engine) snapshotArchiver(sb *torpor.Sandbox) torpor.SnapshotArchiver {
	if sb.State != torpor.StatePaused || sb.PauseMode != torpor.PauseSnapshot || sb.Accel != nil {
		return nil
	}
	rt, err := e.runtime(sb.Runtime.Kind)
	if err != nil {
		return nil
	}
	snap, _ := rt.(torpor.SnapshotArchiver)
	return snap
}

// snapshotHost is this node's Host: FleetConfig.Self's, else what its
// runtimes that export snapshots say of the host, by kind ("" when none
// does).
func (e *Engine) snapshotHost() string {
	if e.fleet != nil && e.fleet.cfg.Self.Host != "" {
		return e.fleet.cfg.Self.Host
	}
	var parts []string
	for _, kind := range slices.Sorted(maps.Keys(e.runtimes)) {
		if snap, ok := e.runtimes[kind].(torpor.SnapshotArchiver); ok {
			parts = append(parts, kind+": "+snap.Host())
		}
	}
	return strings.Join(parts, " | ")
}

// remoteHost is the Host a node needs to take sb from the object store:
// that of the node that uploaded its snapshot, for a snapshot-paused
// sandbox ("" for a disk, which any node starts).
func remoteHost(sb *torpor.Sandbox) string {
	if sb.State != torpor.StatePaused || sb.Remote == nil {
		return ""
	}
	return sb.Remote.Host
}

// releasable reports whether sb's state is all in the object store, so
// that another node can take it: a hibernated sandbox's disk, or a
// snapshot-paused one's disk and memory.
func releasable(sb *torpor.Sandbox) bool {
	if sb.Durability != torpor.DurabilityRemote || sb.Remote == nil {
		return false
	}
	return sb.State == torpor.StateHibernated || (sb.State == torpor.StatePaused && sb.PauseMode == torpor.PauseSnapshot && sb.Remote.Host != "")
}

// movable reports whether sb, when no live node holds it, is one a node
// may take (hibernated, or paused by snapshot): releasable, unless its
// record is not yet settled.
func movable(sb *torpor.Sandbox) bool {
	return sb.State == torpor.StateHibernated || (sb.State == torpor.StatePaused && sb.PauseMode == torpor.PauseSnapshot && sb.Durability == torpor.DurabilityRemote)
}

// fetchSnapshot makes the disk and snapshot of snapshot-paused sb on this
// node from the object store, when its state is there and not here (it
// came from another node), ahead of its resume.
func (e *Engine) fetchSnapshot(ctx context.Context, rt torpor.Runtime, sb *torpor.Sandbox) error {
	if e.fleet == nil || sb.Durability != torpor.DurabilityRemote || sb.Remote == nil || sb.PauseMode != torpor.PauseSnapshot {
		return nil
	}
	st, err := rt.Inspect(ctx, ref(sb))
	if err != nil {
		return err
	}
	if st.DiskExists {
		return nil
	}
	if e.fleet.cfg.Objects == nil {
		return torpor.Errorf(torpor.EUnavailable, "sandbox %s's snapshot is in an object store this node has none of (object_store)", sb.ID)
	}
	m, err := e.readManifest(ctx, sb.Remote.Manifest)
	if err != nil {
		return err
	}
	if m.Sandbox != sb.ID || m.Kind != manifestSnapshot {
		return fmt.Errorf("the manifest %s is of the %s of sandbox %s, not the snapshot of %s", sb.Remote.Manifest, m.Kind, m.Sandbox, sb.ID)
	}
	return e.importSnapshot(ctx, rt, sb, m)
}

// importSnapshot downloads the snapshot manifest m lists into rt, and
// records where sb's snapshot is now.
func (e *Engine) importSnapshot(ctx context.Context, rt torpor.Runtime, sb *torpor.Sandbox, m manifest) error {
	snap, ok := rt.(torpor.SnapshotArchiver)
	if !ok {
		return torpor.Errorf(torpor.EUnavailable, "the %s runtime cannot import a snapshot", rt.Kind())
	}
	if host := e.snapshotHost(); m.Host != host {
		return &torpor.Error{Code: torpor.EUnavailable, RetryAfter: 5 * time.Second,
			Message: fmt.Sprintf("sandbox %s's snapshot was made on a host of %q and node %s is %q; send the request to a node of that host", sb.ID, m.Host, e.node, host)}
	}
	r, err := e.fleet.cfg.Objects.Get(ctx, m.Snapshot)
	if err != nil {
		return fmt.Errorf("download the snapshot of %s: %w", sb.ID, err)
	}
	defer r.Close()
	start := time.Now()
	info, err := snap.ImportSnapshot(ctx, sb.ID, r)
	if err != nil {
		return fmt.Errorf("import the snapshot of %s: %w", sb.ID, err)
	}
	sb.Snapshot = &info
	e.log.Info("fleet: snapshot downloaded", "sandbox", sb.ID, "bytes", m.DiskBytes, "took", time.Since(start))
	return nil
}
