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
)

// Volumes (docs/volumes.md) are kept as disks are (disk.go): each is an
// ext4 file system of its size in a sparse image file,
// Config.Dir/volumes/ID/volume.img, loop-mounted at volumes/ID/mnt while
// the daemon runs, so that a full volume is ENOSPC inside it and never
// fills the host's disk beyond its size. The volume's root is the
// directory data/ in its file system (lost+found stays out of sight); a
// sandbox's mount is a bind of it, read-only where the mount asks, and
// several sandboxes' binds of one volume are one file system with one
// page cache.

var (
	_ torpor.VolumeHost    = (*Runtime)(nil)
	_ torpor.VolumeDevices = (*Runtime)(nil)
)

// SetVolumeHolder tells the runtime who holds volumes as VM drives.
func (r *Runtime) SetVolumeHolder(holder func(id string) (string, bool)) {
	r.volumeHolder.Store(&holder)
}

// heldBy answers the VM sandbox that holds volume id, if one does.
func (r *Runtime) heldBy(id string) (string, bool) {
	if h := r.volumeHolder.Load(); h != nil {
		return (*h)(id)
	}
	return "", false
}

// TakeVolume unmounts the volume from the host and returns its image,
// for a VM's drive (the caller holds it from then on: heldBy). A host
// mount still in use (a container sandbox's bind, an open files call)
// keeps the loop device bound after the unmount: the volume is then
// mounted again and the answer is a conflict.
func (r *Runtime) TakeVolume(ctx context.Context, id string) (string, error) {
	if err := checkVolumeID(id); err != nil {
		return "", err
	}
	defer r.volumes.Lock(id)()
	image := r.volumeImage(id)
	if _, err := os.Lstat(image); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", torpor.Errorf(torpor.ENotFound, "the data of volume %s is not on this node", id)
		}
		return "", err
	}
	if err := unmountAll(r.volumeMount(id)); err != nil {
		return "", err
	}
	if dev, err := boundLoop(image); err != nil || dev != nil {
		if dev != nil {
			dev.Close()
		}
		if merr := mountImage(image, r.volumeMount(id), false); merr != nil {
			r.log.Warn("runc: mounting a volume again", "volume", id, "err", merr)
		}
		return "", &torpor.Error{Code: torpor.EConflict, Reason: "volume_in_use",
			Message: fmt.Sprintf("volume %s is in use on the host (a container sandbox mounts it, or a files call is open): a VM can mount a volume only while nothing else does", id)}
	}
	return image, nil
}

const (
	volumeImageName = "volume.img"
	volumeMountName = "mnt"
	volumeRootName  = "data"
)

func (r *Runtime) volumeDir(id string) string { return filepath.Join(r.dir, "volumes", id) }
func (r *Runtime) volumeImage(id string) string {
	return filepath.Join(r.volumeDir(id), volumeImageName)
}
func (r *Runtime) volumeMount(id string) string {
	return filepath.Join(r.volumeDir(id), volumeMountName)
}

// checkVolumeID refuses an id that could name a path outside the
// volumes' directory.
func checkVolumeID(id string) error {
	if !torpor.ValidID(id) {
		return torpor.Invalid("id", "invalid volume id %q", id)
	}
	return nil
}

// MakeVolume makes the volume's image of sizeMiB if it has none, and
// mounts it.
func (r *Runtime) MakeVolume(ctx context.Context, id string, sizeMiB int64) error {
	if err := checkVolumeID(id); err != nil {
		return err
	}
	if r.mkfs == "" {
		return torpor.Errorf(torpor.EUnavailable, "this server cannot make volumes: %s", r.noDisks)
	}
	defer r.volumes.Lock(id)()
	image := r.volumeImage(id)
	if _, err := os.Lstat(image); errors.Is(err, fs.ErrNotExist) {
		if err := os.MkdirAll(r.volumeDir(id), 0o700); err != nil {
			return err
		}
		if err := r.newDiskImage(ctx, image, sizeMiB); err != nil {
			return fmt.Errorf("volume of %d MiB: %w", sizeMiB, err)
		}
		if err := mountImage(image, r.volumeMount(id), true); err != nil {
			return err
		}
	} else if err != nil {
		return err
	}
	_, err := r.mountVolume(id)
	return err
}

// VolumeDir mounts the volume where it is not mounted (after the host
// restarted) and returns its root.
func (r *Runtime) VolumeDir(ctx context.Context, id string) (string, error) {
	if err := checkVolumeID(id); err != nil {
		return "", err
	}
	defer r.volumes.Lock(id)()
	return r.mountVolume(id)
}

// mountVolume is VolumeDir with the volume's lock held. A volume a VM
// holds is not mounted (a conflict naming the VM).
func (r *Runtime) mountVolume(id string) (string, error) {
	if sb, held := r.heldBy(id); held {
		return "", torpor.VolumeHeld(id, sb)
	}
	image := r.volumeImage(id)
	if _, err := os.Lstat(image); err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return "", torpor.Errorf(torpor.ENotFound, "the data of volume %s is not on this node", id)
		}
		return "", err
	}
	if err := mountImage(image, r.volumeMount(id), false); err != nil {
		return "", err
	}
	// The root is made writable by every user (as a new volume has no
	// owner inside any sandbox: E2B's run commands as "user"); what is
	// below it, and a mode set on it later, are the sandboxes' own.
	root := filepath.Join(r.volumeMount(id), volumeRootName)
	switch err := os.Mkdir(root, 0o777); {
	case err == nil:
		if err := os.Chmod(root, 0o777); err != nil {
			return "", err
		}
	case !errors.Is(err, fs.ErrExist):
		return "", err
	}
	return root, nil
}

// GrowVolume grows the volume's image to sizeMiB and its file system
// with it, mounted (ext4 grows online): the sandboxes that mount it see
// the new size at once. A smaller size is refused: an ext4 file system
// does not shrink while mounted.
func (r *Runtime) GrowVolume(ctx context.Context, id string, sizeMiB int64) error {
	if err := checkVolumeID(id); err != nil {
		return err
	}
	defer r.volumes.Lock(id)()
	if _, err := r.mountVolume(id); err != nil {
		return err
	}
	image := r.volumeImage(id)
	fi, err := os.Stat(image)
	if err != nil {
		return err
	}
	size := sizeMiB << 20
	// An image as large already is one whose file system did not grow
	// with it (a refused grow): growing it is tried again.
	if size < fi.Size() {
		return torpor.Invalid("size_mib", "a volume cannot shrink (it is %d MiB)", fi.Size()>>20)
	}
	old := fi.Size()
	if err := os.Truncate(image, size); err != nil {
		return err
	}
	err = r.growOnline(ctx, id)
	if errors.Is(err, errNoOnlineResize) {
		err = r.growOffline(ctx, id)
	}
	var ng notGrown
	if errors.As(err, &ng) {
		// The file system was not touched (resize2fs never ran on it):
		// it ends where it did, so the image goes back to its old size,
		// losing nothing, and the volume is as it was before the call.
		if terr := os.Truncate(image, old); terr != nil {
			r.log.Warn("runc: a volume whose grow was refused keeps its larger image", "volume", id, "err", terr)
		} else if dev, _ := boundLoop(image); dev != nil {
			_ = unix.IoctlSetInt(int(dev.Fd()), unix.LOOP_SET_CAPACITY, 0)
			dev.Close()
		}
		return ng.error
	}
	return err
}

// notGrown is a grow's failure that left the file system as it was
// (resize2fs did not run on it), so that its image may shrink back.
type notGrown struct{ error }

func (e notGrown) Unwrap() error { return e.error }

// errNoOnlineResize: the kernel refused to grow a mounted ext4 (the
// daemon lacks CAP_SYS_RESOURCE, as in some containers).
var errNoOnlineResize = errors.New("no online resize")

// e2prog returns the path of an e2fsprogs program.
func (r *Runtime) e2prog(name string) (string, error) {
	p := filepath.Join(filepath.Dir(r.mkfs), name)
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	if p, err := exec.LookPath(name); err == nil {
		return p, nil
	}
	return "", fmt.Errorf("no %s (apt-get install e2fsprogs)", name)
}

func e2run(ctx context.Context, prog string, args ...string) (string, error) {
	out, err := exec.CommandContext(ctx, prog, args...).CombinedOutput()
	if err != nil && strings.Contains(string(out), "No space left on device") {
		err = unix.ENOSPC
	}
	return strings.TrimSpace(string(out)), err
}

// growOnline grows the mounted file system to its image's new size.
func (r *Runtime) growOnline(ctx context.Context, id string) error {
	image := r.volumeImage(id)
	dev, err := boundLoop(image)
	if err != nil || dev == nil {
		return fmt.Errorf("grow volume %s: no loop device holds it (%v)", id, err)
	}
	defer dev.Close()
	if err := unix.IoctlSetInt(int(dev.Fd()), unix.LOOP_SET_CAPACITY, 0); err != nil {
		return notGrown{fmt.Errorf("grow volume %s: LOOP_SET_CAPACITY: %w", id, err)}
	}
	resize, err := r.e2prog("resize2fs")
	if err != nil {
		return err
	}
	if out, err := e2run(ctx, resize, dev.Name()); err != nil {
		if strings.Contains(out, "Permission denied") || strings.Contains(out, "Operation not permitted") {
			return errNoOnlineResize
		}
		return fmt.Errorf("resize2fs: %w: %s", err, out)
	}
	return nil
}

// growOffline grows the file system unmounted: possible only while no
// sandbox's instance holds a bind of it (a running or paused one does; a
// hibernated one does not). Either way it is mounted again after.
func (r *Runtime) growOffline(ctx context.Context, id string) error {
	image := r.volumeImage(id)
	if err := unmountAll(r.volumeMount(id)); err != nil {
		return err
	}
	defer r.mountVolume(id)
	if dev, err := boundLoop(image); err != nil || dev != nil {
		if dev != nil {
			dev.Close()
		}
		return notGrown{&torpor.Error{Code: torpor.EConflict, Reason: "in_use",
			Message: "this server cannot grow a volume that a running or paused sandbox mounts (the daemon lacks CAP_SYS_RESOURCE): hibernate those sandboxes, resize, and start them again"}}
	}
	fsck, err := r.e2prog("e2fsck")
	if err != nil {
		return err
	}
	// 1: errors corrected, which a clean unmount leaves none of.
	if out, err := e2run(ctx, fsck, "-f", "-p", image); err != nil {
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 1 {
			return fmt.Errorf("e2fsck: %w: %s", err, out)
		}
	}
	resize, err := r.e2prog("resize2fs")
	if err != nil {
		return err
	}
	if out, err := e2run(ctx, resize, image); err != nil {
		return fmt.Errorf("resize2fs: %w: %s", err, out)
	}
	return nil
}

// VolumeUsed returns the bytes in use in the volume's file system (what
// `df` inside shows).
func (r *Runtime) VolumeUsed(ctx context.Context, id string) (int64, error) {
	root, err := r.VolumeDir(ctx, id)
	if err != nil {
		return 0, err
	}
	var st unix.Statfs_t
	if err := unix.Statfs(root, &st); err != nil {
		return 0, err
	}
	return int64(st.Blocks-st.Bfree) * st.Bsize, nil
}

// RemoveVolume unmounts the volume and removes its image. Nothing is
// removed while its file system is still mounted there.
func (r *Runtime) RemoveVolume(ctx context.Context, id string) error {
	if err := checkVolumeID(id); err != nil {
		return err
	}
	defer r.volumes.Lock(id)()
	if err := unmountAll(r.volumeMount(id)); err != nil {
		return err
	}
	if mounted(r.volumeMount(id)) {
		return fmt.Errorf("remove volume %s: still mounted", id)
	}
	return os.RemoveAll(r.volumeDir(id))
}

// VolumeIDs lists the volumes whose images are in the runtime's
// directory. The engine, at its start, removes those no record names
// (a delete or create cut short) and mounts the others again
// (lifecycle's sweepVolumes): the runtime alone does not know which
// images are a volume's, so it mounts none by itself.
func (r *Runtime) VolumeIDs(ctx context.Context) ([]string, error) {
	if r.mkfs == "" {
		return nil, nil
	}
	ents, err := os.ReadDir(filepath.Join(r.dir, "volumes"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, ent := range ents {
		if id := ent.Name(); ent.IsDir() && checkVolumeID(id) == nil && !strings.HasSuffix(id, ".tmp") {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

// volumeBinds mounts the volumes a boot asks for and returns their
// binds into the sandbox.
func (r *Runtime) volumeBinds(ctx context.Context, vols []torpor.VolumeBind) ([]ociMount, error) {
	var out []ociMount
	for _, v := range vols {
		root, err := r.VolumeDir(ctx, v.ID)
		if err != nil {
			return nil, fmt.Errorf("volume at %s: %w", v.Path, err)
		}
		opts := []string{"rbind", "nosuid", "nodev", "rw"}
		if v.ReadOnly {
			opts[3] = "ro"
		}
		out = append(out, ociMount{Destination: v.Path, Type: "bind", Source: root, Options: opts})
	}
	return out, nil
}

// unmountVolumes unmounts every volume's host mount (see Cleanup).
func (r *Runtime) unmountVolumes() error {
	images, _ := filepath.Glob(filepath.Join(r.dir, "volumes", "*", volumeImageName))
	var errs []error
	for _, img := range images {
		id := filepath.Base(filepath.Dir(img))
		if checkVolumeID(id) != nil {
			continue
		}
		unlock := r.volumes.Lock(id)
		if err := unmountAll(r.volumeMount(id)); err != nil {
			errs = append(errs, fmt.Errorf("runc: volume %s: %w", id, err))
		}
		unlock()
	}
	return errors.Join(errs...)
}
