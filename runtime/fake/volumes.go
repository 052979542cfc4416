package fake

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/torpor-dev/torpor"
)

var (
	_ torpor.VolumeHost    = (*Runtime)(nil)
	_ torpor.VolumeDevices = (*Runtime)(nil)
)

// SetVolumeHolder records who holds volumes as VM drives: VolumeDir of
// a held volume is then a conflict, as on a real host.
func (r *Runtime) SetVolumeHolder(holder func(id string) (string, bool)) {
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	r.h.volumeHolder = holder
}

// TakeVolume returns the volume's directory as its "image".
func (r *Runtime) TakeVolume(ctx context.Context, id string) (string, error) {
	dir, err := r.volumeDir(id)
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return "", torpor.Errorf(torpor.ENotFound, "the data of volume %s is not on this node", id)
	}
	return dir, nil
}

// The fake keeps a volume as the directory FilesDir/.volumes/<id>, of no
// fixed size, and its size beside it; without a FilesDir it keeps none.

func (r *Runtime) volumeDir(id string) (string, error) {
	if err := checkID(id); err != nil {
		return "", err
	}
	if r.h.FilesDir == "" {
		return "", torpor.Errorf(torpor.EUnavailable, "the fake runtime has no FilesDir for volumes")
	}
	return filepath.Join(r.h.FilesDir, ".volumes", id), nil
}

// MakeVolume makes the volume's directory.
func (r *Runtime) MakeVolume(ctx context.Context, id string, sizeMiB int64) error {
	dir, err := r.volumeDir(id)
	if err != nil {
		return err
	}
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("fake: %w", err)
	}
	// A failure leaves the directory made, as a real make cut short
	// leaves a part-made image.
	return r.h.takeFail("make_volume")
}

// VolumeIDs lists the volumes' directories.
func (r *Runtime) VolumeIDs(ctx context.Context) ([]string, error) {
	if r.h.FilesDir == "" {
		return nil, nil
	}
	ents, err := os.ReadDir(filepath.Join(r.h.FilesDir, ".volumes"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	var ids []string
	for _, ent := range ents {
		ids = append(ids, ent.Name())
	}
	return ids, err
}

// VolumeDir returns the volume's directory; not_found when it has none,
// a conflict while a VM holds it.
func (r *Runtime) VolumeDir(ctx context.Context, id string) (string, error) {
	dir, err := r.volumeDir(id)
	if err != nil {
		return "", err
	}
	r.h.mu.Lock()
	holder := r.h.volumeHolder
	r.h.mu.Unlock()
	if holder != nil {
		if sb, held := holder(id); held {
			return "", torpor.VolumeHeld(id, sb)
		}
	}
	if _, err := os.Stat(dir); errors.Is(err, fs.ErrNotExist) {
		return "", torpor.Errorf(torpor.ENotFound, "the data of volume %s is not on this node", id)
	}
	return dir, nil
}

// GrowVolume does nothing but check that the volume is there.
func (r *Runtime) GrowVolume(ctx context.Context, id string, sizeMiB int64) error {
	_, err := r.VolumeDir(ctx, id)
	return err
}

// VolumeUsed sums the sizes of the volume's regular files.
func (r *Runtime) VolumeUsed(ctx context.Context, id string) (int64, error) {
	dir, err := r.VolumeDir(ctx, id)
	if err != nil {
		return 0, err
	}
	var n int64
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if fi, err := d.Info(); err == nil {
				n += fi.Size()
			}
		}
		return nil
	})
	return n, err
}

// RemoveVolume removes the volume's directory.
func (r *Runtime) RemoveVolume(ctx context.Context, id string) error {
	dir, err := r.volumeDir(id)
	if err != nil {
		return err
	}
	return os.RemoveAll(dir)
}
