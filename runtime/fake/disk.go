package fake

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/runtime/diskarchive"
)

var _ torpor.DiskArchiver = (*Runtime)(nil)

// ExportDisk writes the disk of a sandbox whose instance is stopped or
// missing as the real runtimes do (a diskarchive stream): the tree under
// Host.FilesDir/<id>, or an empty tree without a FilesDir. A running or
// frozen instance is a conflict, a sandbox without a disk not_found.
// FailNext("export_disk") makes it fail.
func (r *Runtime) ExportDisk(ctx context.Context, ref torpor.InstanceRef, w io.Writer) (int64, error) {
	id := ref.SandboxID
	if err := checkID(id); err != nil {
		return 0, err
	}
	r.h.mu.Lock()
	err := r.h.takeFail("export_disk")
	if err == nil {
		err = r.quietLocked("export the disk of", id)
	}
	if err == nil && !r.h.disks[id] {
		err = torpor.Errorf(torpor.ENotFound, "sandbox %s has no disk", id)
	}
	filesDir := r.h.FilesDir
	r.h.mu.Unlock()
	if err != nil {
		return 0, err
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
		return 0, fmt.Errorf("fake: %w", err)
	}
	return diskarchive.WriteDir(ctx, w, dir)
}

// ImportDisk reads a stream ExportDisk wrote and gives the sandbox a disk:
// with a FilesDir, the stream's tree becomes Host.FilesDir/<id> (replacing
// what was there) once all of it is read and found good; without one, the
// stream is only checked. A refused stream leaves the sandbox as it was.
// A running or frozen instance is a conflict. FailNext("import_disk")
// makes it fail.
func (r *Runtime) ImportDisk(ctx context.Context, id string, src io.Reader) error {
	if err := checkID(id); err != nil {
		return err
	}
	r.h.mu.Lock()
	err := r.h.takeFail("import_disk")
	if err == nil {
		err = r.quietLocked("replace the disk of", id)
	}
	filesDir := r.h.FilesDir
	r.h.mu.Unlock()
	if err != nil {
		return err
	}
	rd, err := diskarchive.NewReader(src)
	if err != nil {
		return err
	}
	defer rd.Close()
	if filesDir == "" {
		err = rd.Verify(ctx)
	} else {
		err = importTree(ctx, rd, filesDir, id)
	}
	if err != nil {
		return err
	}
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	r.h.disks[id] = true
	return nil
}

// importTree extracts the stream's tree beside FilesDir/<id> and moves it
// there.
func importTree(ctx context.Context, rd *diskarchive.Reader, filesDir, id string) error {
	if rd.Kind != diskarchive.Dir {
		return torpor.Errorf(torpor.EConflict, "the fake runtime keeps disks as trees, and this stream holds an %s", rd.Kind)
	}
	dst := filepath.Join(filesDir, id)
	tmp := filepath.Join(filesDir, "."+id+".import")
	if err := os.RemoveAll(tmp); err != nil {
		return fmt.Errorf("fake: %w", err)
	}
	if err := os.MkdirAll(tmp, 0o755); err != nil {
		return fmt.Errorf("fake: %w", err)
	}
	if err := rd.ExtractDir(ctx, tmp); err != nil {
		_ = os.RemoveAll(tmp)
		return err
	}
	if err := os.RemoveAll(dst); err != nil {
		return fmt.Errorf("fake: %w", err)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return fmt.Errorf("fake: %w", err)
	}
	return nil
}

// quietLocked refuses a verb that needs the sandbox's instance stopped or
// missing.
func (r *Runtime) quietLocked(verb, id string) error {
	if in, ok := r.h.instances[id]; ok && in.state != torpor.InstanceStopped {
		return &torpor.Error{Code: torpor.EConflict, Reason: "state",
			Message: fmt.Sprintf("cannot %s sandbox %s while its instance is %s: stop it first", verb, id, in.state)}
	}
	return nil
}
