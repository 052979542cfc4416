package fake

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"

	"github.com/torpor-dev/torpor"
)

var _ torpor.Checkpointer = (*Runtime)(nil)

// Checkpoints of the fake runtime are names kept per sandbox; with a
// FilesDir, each is a copy of the sandbox's tree under
// FilesDir/.checkpoints/<id>/<name>, which a restore or a clone copies
// back. FailNext("checkpoint"), ("restore_checkpoint"),
// ("clone_checkpoint") make them fail.

func (h *Host) checkpointsLocked(id string) map[string]bool {
	if h.checkpoints == nil {
		h.checkpoints = map[string]map[string]bool{}
	}
	if h.checkpoints[id] == nil {
		h.checkpoints[id] = map[string]bool{}
	}
	return h.checkpoints[id]
}

// HasCheckpoint reports whether sandbox id has checkpoint name.
func (h *Host) HasCheckpoint(id, name string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.checkpoints[id][name]
}

func (h *Host) checkpointDir(id, name string) string {
	return filepath.Join(h.FilesDir, ".checkpoints", id, name)
}

func checkName(name string) error {
	if !torpor.ValidCheckpointName(name) {
		return torpor.Invalid("name", "invalid checkpoint name %q", name)
	}
	return nil
}

func copyTree(src, dst string) error {
	if err := os.RemoveAll(dst); err != nil {
		return err
	}
	if _, err := os.Stat(src); os.IsNotExist(err) {
		return os.MkdirAll(dst, 0o755)
	}
	if err := os.MkdirAll(filepath.Dir(dst), 0o755); err != nil {
		return err
	}
	return os.CopyFS(dst, os.DirFS(src))
}

// Checkpoint records checkpoint name of a sandbox that has a disk.
func (r *Runtime) Checkpoint(ctx context.Context, ref torpor.InstanceRef, name string) (torpor.CheckpointInfo, error) {
	id := ref.SandboxID
	if err := checkID(id); err != nil {
		return torpor.CheckpointInfo{}, err
	}
	if err := checkName(name); err != nil {
		return torpor.CheckpointInfo{}, err
	}
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	if err := r.h.takeFail("checkpoint"); err != nil {
		return torpor.CheckpointInfo{}, err
	}
	if !r.h.disks[id] {
		return torpor.CheckpointInfo{}, torpor.Errorf(torpor.ENotFound, "sandbox %s has no disk", id)
	}
	if r.h.FilesDir != "" {
		if err := copyTree(filepath.Join(r.h.FilesDir, id), r.h.checkpointDir(id, name)); err != nil {
			return torpor.CheckpointInfo{}, fmt.Errorf("fake: checkpoint: %w", err)
		}
	}
	r.h.checkpointsLocked(id)[name] = true
	return torpor.CheckpointInfo{Name: name, Kind: torpor.CheckpointDisk, Method: "copy"}, nil
}

// RestoreCheckpoint gives a sandbox whose instance is not live its
// checkpoint's disk.
func (r *Runtime) RestoreCheckpoint(ctx context.Context, ref torpor.InstanceRef, name string) error {
	id := ref.SandboxID
	if err := checkID(id); err != nil {
		return err
	}
	if err := checkName(name); err != nil {
		return err
	}
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	if err := r.h.takeFail("restore_checkpoint"); err != nil {
		return err
	}
	if err := r.quietLocked("restore a checkpoint of", id); err != nil {
		return err
	}
	if !r.h.checkpoints[id][name] {
		return torpor.Errorf(torpor.ENotFound, "sandbox %s has no checkpoint %q", id, name)
	}
	if r.h.FilesDir != "" {
		if err := copyTree(r.h.checkpointDir(id, name), filepath.Join(r.h.FilesDir, id)); err != nil {
			return fmt.Errorf("fake: restore checkpoint: %w", err)
		}
	}
	r.h.disks[id] = true
	return nil
}

// CloneCheckpoint gives dstID a disk from srcID's checkpoint.
func (r *Runtime) CloneCheckpoint(ctx context.Context, srcID, name, dstID string) error {
	if err := checkID(srcID); err != nil {
		return err
	}
	if err := checkID(dstID); err != nil {
		return err
	}
	if err := checkName(name); err != nil {
		return err
	}
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	if err := r.h.takeFail("clone_checkpoint"); err != nil {
		return err
	}
	if !r.h.checkpoints[srcID][name] {
		return torpor.Errorf(torpor.ENotFound, "sandbox %s has no checkpoint %q", srcID, name)
	}
	if r.h.FilesDir != "" {
		if err := copyTree(r.h.checkpointDir(srcID, name), filepath.Join(r.h.FilesDir, dstID)); err != nil {
			return fmt.Errorf("fake: clone checkpoint: %w", err)
		}
	}
	r.h.disks[dstID] = true
	return nil
}

// DeleteCheckpoint forgets a checkpoint.
func (r *Runtime) DeleteCheckpoint(ctx context.Context, id, name string) error {
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	delete(r.h.checkpoints[id], name)
	if len(r.h.checkpoints[id]) == 0 {
		delete(r.h.checkpoints, id)
	}
	if r.h.FilesDir != "" {
		return os.RemoveAll(r.h.checkpointDir(id, name))
	}
	return nil
}

// ListCheckpoints returns every sandbox's checkpoint names.
func (r *Runtime) ListCheckpoints(ctx context.Context) (map[string][]string, error) {
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	out := map[string][]string{}
	for id, names := range r.h.checkpoints {
		for n := range names {
			out[id] = append(out[id], n)
		}
		sort.Strings(out[id])
	}
	return out, nil
}
