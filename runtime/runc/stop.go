package runc

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/runtime/instances"
)

// Stop ends the instance's processes and removes the container, keeping the
// sandbox's disk. Stopping a missing instance succeeds.
func (r *Runtime) Stop(ctx context.Context, ref torpor.InstanceRef) error {
	return instances.Locked(&r.locks, ref, checkRef, "runc: stop", func(id string) error {
		return r.removeInstance(ctx, id)
	})
}

// Destroy ends the instance and removes everything of the sandbox: its
// disk, bundle, run directory, cgroups and mounts. Destroying a missing
// sandbox succeeds.
func (r *Runtime) Destroy(ctx context.Context, ref torpor.InstanceRef) error {
	return instances.Locked(&r.locks, ref, checkRef, "runc: destroy", func(id string) error {
		if err := r.removeInstance(ctx, id); err != nil {
			return err
		}
		if r.net != nil {
			if err := r.net.Release(ctx, r.netnsPath(id)); err != nil {
				return err
			}
		}
		for _, d := range []string{r.rootfsDir(id), r.diskMount(id)} {
			if mounted(d) {
				return fmt.Errorf("%s is still mounted", d)
			}
		}
		return os.RemoveAll(r.sandboxDir(id))
	})
}

// removeInstance kills the instance (thawing it first: a frozen process
// cannot die), deletes the runc container and its cgroups, unmounts the
// root and the disk and removes the network namespace. The disk and the
// sandbox's address stay. Each step tolerates what is already gone, so this
// is safe after any crash.
func (r *Runtime) removeInstance(ctx context.Context, id string) error {
	rel := r.cgroupRel(id)
	if frozen, err := r.cg.frozen(rel); err == nil && frozen {
		if err := r.cg.thaw(ctx, rel); err != nil {
			return fmt.Errorf("thaw: %w", err)
		}
	}
	in, err := r.findInstance(ctx, id)
	if err != nil {
		return err
	}
	if in != nil {
		if err := in.Kill(ctx); err != nil {
			return fmt.Errorf("kill init: %w", err)
		}
	}
	if _, err := os.Stat(r.runcState(id)); err == nil {
		if _, err := r.runc(ctx, "delete", "--force", id); err != nil {
			if _, statErr := os.Stat(r.runcState(id)); statErr == nil {
				return err
			}
		}
	}
	if err := r.cg.remove(ctx, rel); err != nil {
		return err
	}
	if err := unmountAll(r.rootfsDir(id)); err != nil {
		return err
	}
	if err := unmountAll(r.diskMount(id)); err != nil {
		return err
	}
	if r.net != nil {
		if err := r.net.Detach(ctx, r.netnsPath(id)); err != nil {
			return err
		}
	}
	r.live.drop(id)
	for _, f := range []string{r.instanceFile(id), r.pidFile(id)} {
		if err := os.Remove(f); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

// mountOverlay mounts an overlay of the read-only lower directory and the
// sandbox's upper directory at target.
func mountOverlay(lower, upper, work, target string) error {
	if mounted(target) {
		if err := unmountAll(target); err != nil {
			return err
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", lower, upper, work)
	if err := unix.Mount("overlay", target, "overlay", unix.MS_NODEV, opts); err != nil {
		return fmt.Errorf("mount overlay on %s: %w", target, err)
	}
	return nil
}

// unmountAll unmounts whatever is mounted at target (detaching it when
// busy). Nothing mounted is fine.
func unmountAll(target string) error {
	for i := 0; i < 16; i++ {
		err := unix.Unmount(target, 0)
		if errors.Is(err, unix.EBUSY) {
			err = unix.Unmount(target, unix.MNT_DETACH)
		}
		switch {
		case err == nil:
			continue
		case errors.Is(err, unix.EINVAL), errors.Is(err, unix.ENOENT):
			return nil // not a mount point (any more)
		default:
			return fmt.Errorf("unmount %s: %w", target, err)
		}
	}
	return fmt.Errorf("unmount %s: still mounted", target)
}

// mounted reports whether dir is a mount point (its device differs from
// its parent's).
func mounted(dir string) bool {
	var st, parent unix.Stat_t
	if unix.Lstat(dir, &st) != nil || unix.Lstat(filepath.Dir(dir), &parent) != nil {
		return false
	}
	return st.Dev != parent.Dev
}
