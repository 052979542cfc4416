package lifecycle

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/torpor-dev/torpor"
)

// manifest is what the object store keeps beside a sandbox's uploaded
// disk, written after it: a disk without its manifest was never
// finished and is never read.
type manifest struct {
	Format    int    `json:"format"`
	Sandbox   string `json:"sandbox"`
	Runtime   string `json:"runtime"`
	Template  string `json:"template"`
	Boots     int    `json:"boots"`
	Disk      string `json:"disk"`
	DiskBytes int64  `json:"disk_bytes"`
	Node      string `json:"node"`
	// UploadedAt is when the upload ended.
	UploadedAt time.Time `json:"uploaded_at"`
}

const manifestFormat = 1

// The upload's retry waits, doubling from the first to the last.
const (
	uploadRetryFirst = time.Second
	uploadRetryLast  = time.Minute
)

// wakeUploads tells the uploader a sandbox was hibernated.
func (e *Engine) wakeUploads() {
	if e.fleet == nil || e.fleet.cfg.Objects == nil {
		return
	}
	select {
	case e.fleet.uploadWake <- struct{}{}:
	default:
	}
}

// runUploads uploads the disks of this node's hibernated sandboxes that
// are only here (durability node) once they have been hibernated for
// UploadAfter, retrying a failing upload with a growing wait, until ctx
// ends. It works from the store, so an upload cut short by a crash is
// made again after the restart.
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

// uploadDue uploads every disk that is due.
func (e *Engine) uploadDue(ctx context.Context) {
	f := e.fleet
	if e.leaseErr() != nil {
		return
	}
	sbs, err := e.store.ListSandboxes(ctx, torpor.SandboxFilter{Node: e.node, States: []torpor.State{torpor.StateHibernated}})
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

// upload puts the disk of hibernated sandbox id in the object store, then
// its manifest, then records durability remote. The transfer holds no
// lock: a sandbox that changed meanwhile keeps its record, and the objects
// of that upload are removed.
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
	if sb.Node != e.node || sb.State != torpor.StateHibernated {
		return nil
	}
	if sb.Durability == torpor.DurabilityRemote {
		return nil
	}
	rt, err := e.runtime(sb.Runtime.Kind)
	if err != nil {
		return err
	}
	arch, ok := rt.(torpor.DiskArchiver)
	if !ok {
		return torpor.Errorf(torpor.EUnavailable, "the %s runtime cannot export a disk", rt.Kind())
	}
	// A key of this attempt's own: one cut short leaves objects no
	// record names, never half of a recorded upload.
	prefix := fmt.Sprintf("sandboxes/%s/%d-%d-%s", id, sb.Boots, sb.Version, torpor.NewID("", 6))
	m := manifest{Format: manifestFormat, Sandbox: id, Runtime: rt.Kind(), Template: sb.Template, Boots: sb.Boots,
		Disk: prefix + "/disk", Node: e.node}
	pr, pw := io.Pipe()
	done := make(chan int64, 1)
	go func() {
		n, err := arch.ExportDisk(ctx, ref(sb), pw)
		pw.CloseWithError(err)
		done <- n
	}()
	err = f.cfg.Objects.Put(ctx, m.Disk, pr, -1)
	pr.CloseWithError(io.ErrClosedPipe)
	m.DiskBytes = <-done
	if err != nil {
		return fmt.Errorf("upload the disk of %s: %w", id, err)
	}
	m.UploadedAt = e.now()
	mj, _ := json.Marshal(m)
	manifestKey := prefix + "/manifest.json"
	if err := f.cfg.Objects.Put(ctx, manifestKey, strings.NewReader(string(mj)), int64(len(mj))); err != nil {
		e.dropObjects(ctx, m.Disk)
		return fmt.Errorf("upload the manifest of %s: %w", id, err)
	}
	e.fail("upload.after-manifest")
	unlock := e.locks.Lock(id)
	defer unlock()
	cur, err := e.store.GetSandbox(ctx, id)
	if err != nil {
		return err
	}
	if cur.Version != sb.Version || cur.Node != e.node {
		// It started, or moved, while its disk went up: that copy is old.
		e.dropObjects(ctx, m.Disk, manifestKey)
		return nil
	}
	old := cur.Remote
	cur.Durability = torpor.DurabilityRemote
	cur.Remote = &torpor.RemoteState{Manifest: manifestKey, Bytes: m.DiskBytes, Boots: sb.Boots, UploadedAt: m.UploadedAt}
	if err := e.save(ctx, cur, e.event(cur, torpor.EventUploaded, "bytes", itoa(m.DiskBytes), "manifest", manifestKey)); err != nil {
		// A commit whose answer was lost may have stored the record that
		// names these objects: they go only when the store says it does
		// not (a leaked object beats a lost disk).
		if again, gerr := e.store.GetSandbox(context.WithoutCancel(ctx), id); gerr == nil && (again.Remote == nil || again.Remote.Manifest != manifestKey) {
			e.dropObjects(ctx, m.Disk, manifestKey)
		}
		return err
	}
	e.log.Info("fleet: disk uploaded", "sandbox", id, "bytes", m.DiskBytes, "to", f.cfg.Objects.Where())
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
		keys = append(keys, m.Disk)
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
