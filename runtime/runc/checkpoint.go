package runc

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/runtime/instances"
)

var _ torpor.Checkpointer = (*Runtime)(nil)

// Checkpoints (docs/fork.md) are copies of a sandbox's disk kept under
// Config.Dir/checkpoints/<id>/<name>, apart from the sandbox's directory
// (so that a Destroy of its working copy, as an archive does, keeps
// them): disk.img, a copy of its image, or upper/, a copy of the upper
// directory of a disk of directories. An image is copied with FICLONE
// (a reflink: the copy shares the image's blocks until either is
// written) where the file system allows, else by its data segments (the
// holes stay holes); a tree with `cp -a --reflink=auto`.
//
// A copy is written under <name>~tmp and renamed into place: a crash
// leaves a name that is no checkpoint name, which the engine's reconcile
// removes (ListCheckpoints lists it).
//
// The disk of a running instance is copied frozen: its cgroup is frozen,
// the disk's file system synced, the copy made, and the instance thawed.
// The copy is consistent as after a power cut at that moment (an ext4
// image's journal is replayed when it is next mounted).

const tmpSuffix = "~tmp"

func (r *Runtime) checkpointsDir() string { return filepath.Join(r.dir, "checkpoints") }

func (r *Runtime) checkpointDir(id, name string) string {
	return filepath.Join(r.checkpointsDir(), id, name)
}

// checkCheckpointName accepts a checkpoint's name or a leftover's.
func checkCheckpointName(name string) error {
	base := strings.TrimSuffix(name, tmpSuffix)
	if !torpor.ValidCheckpointName(base) {
		return torpor.Invalid("name", "invalid checkpoint name %q", name)
	}
	return nil
}

// Checkpoint copies the sandbox's disk as checkpoint name.
func (r *Runtime) Checkpoint(ctx context.Context, ref torpor.InstanceRef, name string) (torpor.CheckpointInfo, error) {
	info := torpor.CheckpointInfo{Name: name, Kind: torpor.CheckpointDisk}
	if err := checkCheckpointName(name); err != nil {
		return info, err
	}
	err := instances.Locked(&r.locks, ref, checkRef, "runc: checkpoint", func(id string) (err error) {
		st, _, err := r.inspect(ctx, id)
		if err != nil {
			return err
		}
		if !st.DiskExists {
			return torpor.Errorf(torpor.ENotFound, "sandbox %s has no disk", id)
		}
		if instances.Live(st) {
			rel := r.cgroupRel(id)
			if st.State == torpor.InstanceRunning {
				if err := r.cg.freeze(ctx, rel); err != nil {
					return fmt.Errorf("freeze: %w", err)
				}
				defer func() {
					if terr := r.cg.thaw(context.WithoutCancel(ctx), rel); terr != nil && err == nil {
						err = fmt.Errorf("thaw: %w", terr)
					}
				}()
			}
			upper, _ := r.layerDirs(id)
			if err := syncFS(upper); err != nil {
				return fmt.Errorf("sync the disk: %w", err)
			}
		} else {
			if err := r.quiesce(ctx, id, "checkpoint"); err != nil {
				return err
			}
			if _, serr := os.Lstat(r.diskImage(id)); serr == nil {
				if err := r.settleImage(id); err != nil {
					return err
				}
			}
		}
		info.Method, info.SizeBytes, err = r.copyDisk(id, r.checkpointDir(id, name))
		return err
	})
	return info, err
}

// copyDisk copies the disk of sandbox id into the directory dst (made
// afresh under dst~tmp and renamed into place) and says how, and the
// bytes the copy takes.
func (r *Runtime) copyDisk(id, dst string) (method string, size int64, err error) {
	tmp := dst + tmpSuffix
	if err := os.RemoveAll(tmp); err != nil {
		return "", 0, err
	}
	if err := os.MkdirAll(tmp, 0o700); err != nil {
		return "", 0, err
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(tmp)
		}
	}()
	if _, serr := os.Lstat(r.diskImage(id)); serr == nil {
		// cloneFile syncs the one file it writes.
		method, err = cloneFile(r.diskImage(id), filepath.Join(tmp, diskImageName))
	} else {
		method, err = "copy", copyTree(r.sandboxPath(id, "upper"), filepath.Join(tmp, "upper"))
		if err == nil {
			// Its many files' contents last before the rename.
			err = syncFS(tmp)
		}
	}
	if err != nil {
		return "", 0, err
	}
	if err := os.RemoveAll(dst); err != nil {
		return "", 0, err
	}
	if err := os.Rename(tmp, dst); err != nil {
		return "", 0, err
	}
	_ = syncDir(filepath.Dir(dst))
	return method, treeBytes(dst), nil
}

// cloneFile copies src to the new file dst, synced: a reflink where the
// file system can make one, else its data segments.
func cloneFile(src, dst string) (string, error) {
	in, err := os.Open(src)
	if err != nil {
		return "", err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return "", err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return "", err
	}
	method := "reflink"
	if err := unix.IoctlFileClone(int(out.Fd()), int(in.Fd())); err != nil {
		method = "copy"
		if err := copyData(in, out, fi.Size()); err != nil {
			out.Close()
			return "", err
		}
	}
	if err := out.Sync(); err != nil {
		out.Close()
		return "", err
	}
	return method, out.Close()
}

// copyTree copies the directory src to dst (absent) with its owners,
// modes, links and extended attributes.
func copyTree(src, dst string) error {
	if fi, err := os.Lstat(src); err != nil || !fi.IsDir() {
		return torpor.Errorf(torpor.ENotFound, "no disk at %s", src)
	}
	out, err := exec.Command("cp", "-a", "--reflink=auto", src, dst).CombinedOutput()
	if err != nil {
		return fmt.Errorf("cp: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// treeBytes is the space the files under dir take (blocks, not sizes).
func treeBytes(dir string) int64 {
	var n int64
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		var st unix.Stat_t
		if unix.Lstat(p, &st) == nil {
			n += st.Blocks * 512
		}
		return nil
	})
	return n
}

// RestoreCheckpoint replaces the disk of a sandbox whose instance is not
// live by a copy of its checkpoint name.
func (r *Runtime) RestoreCheckpoint(ctx context.Context, ref torpor.InstanceRef, name string) error {
	if err := checkCheckpointName(name); err != nil {
		return err
	}
	return instances.Locked(&r.locks, ref, checkRef, "runc: restore checkpoint", func(id string) error {
		if err := r.quiesce(ctx, id, "restore a checkpoint of"); err != nil {
			return err
		}
		return r.diskFromCheckpoint(id, name, id)
	})
}

// CloneCheckpoint makes the disk of sandbox dstID from srcID's
// checkpoint name.
func (r *Runtime) CloneCheckpoint(ctx context.Context, srcID, name, dstID string) error {
	if err := checkCheckpointName(name); err != nil {
		return err
	}
	if _, err := checkRef(torpor.InstanceRef{SandboxID: srcID}); err != nil {
		return err
	}
	return instances.Locked(&r.locks, torpor.InstanceRef{SandboxID: dstID}, checkRef, "runc: clone checkpoint", func(id string) error {
		if err := r.quiesce(ctx, id, "replace the disk of"); err != nil {
			return err
		}
		return r.diskFromCheckpoint(srcID, name, id)
	})
}

// diskFromCheckpoint makes the disk of sandbox dst a copy of src's
// checkpoint name, written beside it and moved into place.
func (r *Runtime) diskFromCheckpoint(src, name, dst string) error {
	cp := r.checkpointDir(src, name)
	if _, err := os.Stat(cp); errors.Is(err, fs.ErrNotExist) {
		return torpor.Errorf(torpor.ENotFound, "sandbox %s has no checkpoint %q", src, name)
	}
	if err := os.MkdirAll(r.sandboxDir(dst), 0o755); err != nil {
		return err
	}
	if _, err := os.Lstat(filepath.Join(cp, diskImageName)); err == nil {
		if r.mkfs == "" {
			return torpor.Errorf(torpor.EConflict, "checkpoint %q is an image, and this host cannot mount images", name)
		}
		tmp := r.sandboxPath(dst, importImageName)
		_ = os.Remove(tmp)
		if _, err := cloneFile(filepath.Join(cp, diskImageName), tmp); err != nil {
			_ = os.Remove(tmp)
			return err
		}
		if err := os.Rename(tmp, r.diskImage(dst)); err != nil {
			_ = os.Remove(tmp)
			return err
		}
		r.cloned.Store(dst, true)
		for _, d := range []string{"upper", "work"} {
			if err := os.RemoveAll(r.sandboxPath(dst, d)); err != nil {
				return err
			}
		}
		return syncDir(r.sandboxDir(dst))
	}
	tmp := r.sandboxPath(dst, importTreeName)
	_ = os.RemoveAll(tmp)
	if err := copyTree(filepath.Join(cp, "upper"), tmp); err != nil {
		_ = os.RemoveAll(tmp)
		return err
	}
	if err := os.Remove(r.diskImage(dst)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	for _, d := range []string{"upper", "work"} {
		if err := os.RemoveAll(r.sandboxPath(dst, d)); err != nil {
			return err
		}
	}
	if err := os.Rename(tmp, r.sandboxPath(dst, "upper")); err != nil {
		return err
	}
	if err := os.Mkdir(r.sandboxPath(dst, "work"), 0o755); err != nil {
		return err
	}
	return syncDir(r.sandboxDir(dst))
}

// DeleteCheckpoint removes checkpoint name of sandbox id.
func (r *Runtime) DeleteCheckpoint(ctx context.Context, id, name string) error {
	if err := checkCheckpointName(name); err != nil {
		return err
	}
	if _, err := checkRef(torpor.InstanceRef{SandboxID: id}); err != nil {
		return err
	}
	if err := os.RemoveAll(r.checkpointDir(id, name)); err != nil {
		return fmt.Errorf("runc: delete checkpoint: %w", err)
	}
	_ = os.Remove(filepath.Join(r.checkpointsDir(), id)) // only once empty
	return nil
}

// ListCheckpoints lists the checkpoints kept (leftovers of a copy cut
// short included, named <name>~tmp).
func (r *Runtime) ListCheckpoints(ctx context.Context) (map[string][]string, error) {
	out := map[string][]string{}
	ids, err := os.ReadDir(r.checkpointsDir())
	if errors.Is(err, fs.ErrNotExist) {
		return out, nil
	}
	if err != nil {
		return nil, fmt.Errorf("runc: list checkpoints: %w", err)
	}
	for _, d := range ids {
		names, err := os.ReadDir(filepath.Join(r.checkpointsDir(), d.Name()))
		if err != nil {
			continue
		}
		for _, n := range names {
			out[d.Name()] = append(out[d.Name()], n.Name())
		}
	}
	return out, nil
}
