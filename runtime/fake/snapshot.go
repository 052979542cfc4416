package fake

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/runtime/diskarchive"
)

var _ torpor.SnapshotArchiver = (*Runtime)(nil)

// A fake snapshot stream is a JSON line (snapshotStream), a line of the
// hex SHA-256 of that line, then the sandbox's disk as ExportDisk writes
// it (a diskarchive stream of its tree).
type snapshotStream struct {
	Host  string          `json:"host"`
	Magic string          `json:"magic"`
	Spec  torpor.BootSpec `json:"spec"`
}

const snapshotMagic = "torpor-fake-snapshot"

// Host is Host.SnapshotHost, or "fake".
func (r *Runtime) Host() string {
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	return r.hostLocked()
}

func (r *Runtime) hostLocked() string {
	if r.h.SnapshotHost != "" {
		return r.h.SnapshotHost
	}
	return "fake"
}

// ExportSnapshot writes a snapshotted sandbox's snapshot (its instance's
// spec, with the host) to w. A sandbox with no snapshot, or whose
// instance runs, is a conflict. FailNext("export_snapshot") makes it
// fail.
func (r *Runtime) ExportSnapshot(ctx context.Context, ref torpor.InstanceRef, w io.Writer) (int64, error) {
	id := ref.SandboxID
	if err := checkID(id); err != nil {
		return 0, err
	}
	r.h.mu.Lock()
	err := r.h.takeFail("export_snapshot")
	in := r.h.snapshots[id]
	filesDir := r.h.FilesDir
	if err == nil {
		err = r.quietLocked("export the snapshot of", id)
	}
	if _, live := r.h.instances[id]; err == nil && (in == nil || live) {
		err = &torpor.Error{Code: torpor.EConflict, Reason: "state", Message: fmt.Sprintf("sandbox %s has no snapshot to export", id)}
	}
	var b []byte
	if err == nil {
		b, err = json.Marshal(snapshotStream{Magic: snapshotMagic, Host: r.hostLocked(), Spec: in.spec})
	}
	r.h.mu.Unlock()
	if err != nil {
		return 0, err
	}
	sum := sha256.Sum256(b)
	b = append(append(append(b, '\n'), hex.EncodeToString(sum[:])...), '\n')
	n, err := w.Write(b)
	if err != nil {
		return int64(n), err
	}
	var dir string
	if filesDir != "" {
		dir = filepath.Join(filesDir, id)
		err = os.MkdirAll(dir, 0o755)
	} else {
		dir, err = os.MkdirTemp("", "fake-disk-")
		defer os.RemoveAll(dir)
	}
	if err != nil {
		return int64(n), fmt.Errorf("fake: %w", err)
	}
	m, err := diskarchive.WriteDir(ctx, w, dir)
	return int64(n) + m, err
}

// ImportSnapshot gives sandbox id the disk and snapshot of a stream
// ExportSnapshot wrote on a host of the same Host, once all of it is read
// and found good; another host's is a FailureSnapshot conflict, and a
// refused stream leaves the sandbox as it was. A running or frozen
// instance is a conflict. FailNext("import_snapshot") makes it fail.
func (r *Runtime) ImportSnapshot(ctx context.Context, id string, src io.Reader) (torpor.SnapshotInfo, error) {
	if err := checkID(id); err != nil {
		return torpor.SnapshotInfo{}, err
	}
	refused := torpor.Invalid("snapshot", "the snapshot stream is refused: it is not a whole fake snapshot")
	br := bufio.NewReader(io.LimitReader(src, 1<<30))
	line, err := br.ReadBytes('\n')
	if err != nil {
		return torpor.SnapshotInfo{}, refused
	}
	digest, err := br.ReadBytes('\n')
	if err != nil {
		return torpor.SnapshotInfo{}, refused
	}
	line, digest = bytes.TrimSuffix(line, []byte("\n")), bytes.TrimSuffix(digest, []byte("\n"))
	var s snapshotStream
	if err := json.Unmarshal(line, &s); err != nil || s.Magic != snapshotMagic {
		return torpor.SnapshotInfo{}, refused
	}
	r.h.mu.Lock()
	err = r.h.takeFail("import_snapshot")
	if err == nil {
		err = r.quietLocked("replace the snapshot of", id)
	}
	if host := r.hostLocked(); err == nil && s.Host != host {
		err = &torpor.Error{Code: torpor.EConflict, Reason: torpor.FailureSnapshot,
			Message: fmt.Sprintf("the snapshot of %s was made on host %q, and this one is %q", id, s.Host, host)}
	}
	filesDir := r.h.FilesDir
	r.h.mu.Unlock()
	if err != nil {
		return torpor.SnapshotInfo{}, err
	}
	if sum := sha256.Sum256(line); hex.EncodeToString(sum[:]) != string(digest) {
		return torpor.SnapshotInfo{}, refused
	}
	rd, err := diskarchive.NewReader(br)
	if err != nil {
		return torpor.SnapshotInfo{}, err
	}
	defer rd.Close()
	if filesDir == "" {
		err = rd.Verify(ctx)
	} else {
		err = importTree(ctx, rd, filesDir, id)
	}
	if err != nil {
		return torpor.SnapshotInfo{}, err
	}
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	s.Spec.SandboxID = id
	in := &instance{state: torpor.InstanceRunning, done: closed(), spec: s.Spec}
	r.h.snapshots[id] = in
	r.h.disks[id] = true
	return snapshotInfo(id, in), nil
}
