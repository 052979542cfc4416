package runc

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/runtime/diskarchive"
	"github.com/torpor-dev/torpor/runtime/instances"
)

var _ torpor.DiskArchiver = (*Runtime)(nil)

// A sandbox's disk travels as a diskarchive stream: its image (disk.img)
// as a sparse image, or, for a disk of directories, the tree of its
// overlay's upper directory (the work directory holds nothing between
// mounts and is made afresh). The image is read only while no file system
// of it is mounted: Stop unmounts the overlay and the disk, and a stopped
// instance that Stop has not removed yet is removed first, as Stop would.

// Names, in the sandbox's directory, of what an import writes before it
// moves it into place; a crash leaves them, and the next import removes
// them.
const (
	importImageName = diskImageName + ".import"
	importTreeName  = "upper.import"
)

// ExportDisk writes the disk of a sandbox whose instance is stopped to w
// and returns the bytes written. A running or frozen instance is a
// conflict (its file system is mounted and changing); a sandbox without a
// disk is not_found. The sandbox's lock is held while the stream is
// written, so no boot mounts the disk meanwhile.
func (r *Runtime) ExportDisk(ctx context.Context, ref torpor.InstanceRef, w io.Writer) (int64, error) {
	var n int64
	err := instances.Locked(&r.locks, ref, checkRef, "runc: export disk", func(id string) error {
		if err := r.quiesce(ctx, id, "export the disk of"); err != nil {
			return err
		}
		var err error
		if _, serr := os.Lstat(r.diskImage(id)); serr == nil {
			if err := r.settleImage(id); err != nil {
				return err
			}
			n, err = diskarchive.WriteImage(ctx, w, r.diskImage(id))
			return err
		}
		upper := r.sandboxPath(id, "upper")
		if fi, serr := os.Lstat(upper); serr == nil && fi.IsDir() {
			n, err = diskarchive.WriteDir(ctx, w, upper)
			return err
		}
		return torpor.Errorf(torpor.ENotFound, "sandbox %s has no disk", id)
	})
	return n, err
}

// ImportDisk makes the disk of sandbox id from a stream ExportDisk wrote,
// replacing any disk it has, ready for a Boot. The stream is written
// beside the disk and moved into place only once all of it has been read
// and found good (see package diskarchive and diskarchive.Import), so a
// refused or failed import leaves the sandbox the disk it had (none, and
// no directory, for a new one). A sandbox
// whose instance runs or is frozen is a conflict; an image on a host that
// cannot mount images (see prepareDisk) is a conflict too.
func (r *Runtime) ImportDisk(ctx context.Context, id string, src io.Reader) error {
	return instances.Locked(&r.locks, torpor.InstanceRef{SandboxID: id}, checkRef, "runc: import disk", func(id string) error {
		if err := r.quiesce(ctx, id, "replace the disk of"); err != nil {
			return err
		}
		return diskarchive.Import(src, r.sandboxDir(id), 0o755, func(rd *diskarchive.Reader) error {
			if rd.Kind == diskarchive.Image && r.mkfs == "" {
				return torpor.Errorf(torpor.EConflict, "the disk of sandbox %s is an image, and this host cannot mount images (see the runtime's warning at start)", id)
			}
			_ = os.Remove(r.sandboxPath(id, importImageName))
			_ = os.RemoveAll(r.sandboxPath(id, importTreeName))
			if rd.Kind == diskarchive.Image {
				return r.importImage(ctx, id, rd)
			}
			return r.importTree(ctx, id, rd)
		})
	})
}

// quiesce makes sure nothing has the sandbox's disk mounted: a live
// instance is a conflict, and a stopped one (or the mounts a crash left)
// is removed as Stop removes it.
func (r *Runtime) quiesce(ctx context.Context, id, verb string) error {
	st, _, err := r.inspect(ctx, id)
	if err != nil {
		return err
	}
	if instances.Live(st) {
		return &torpor.Error{Code: torpor.EConflict, Reason: "state",
			Message: fmt.Sprintf("cannot %s sandbox %s while its instance is %s: stop it first", verb, id, st.State)}
	}
	if st.State == torpor.InstanceStopped || mounted(r.rootfsDir(id)) || mounted(r.diskMount(id)) {
		return r.removeInstance(ctx, id)
	}
	return nil
}

// settleImage writes back what a file system of the sandbox's image that
// outlived its unmount still holds. Stop unmounts the disk, but the file
// system lives on while something else holds it (see boundLoop: a lazy
// unmount of a busy one, a copy of the mount in another mount namespace),
// and what it has not written back yet is not in the image. Mounted again
// through its loop device (the same file system), synced and unmounted, it
// leaves the image whole; nothing writes to it afterwards, as the
// sandbox's processes are gone.
func (r *Runtime) settleImage(id string) error {
	image := r.diskImage(id)
	dev, err := boundLoop(image)
	if err != nil || dev == nil {
		return err
	}
	dev.Close()
	if err := mountImage(image, r.diskMount(id), false); err != nil {
		return err
	}
	err = syncFS(r.diskMount(id))
	if uerr := unmountAll(r.diskMount(id)); err == nil {
		err = uerr
	}
	if err != nil {
		return fmt.Errorf("write back the disk's file system: %w", err)
	}
	return nil
}

// importImage writes the stream's image beside the sandbox's disk, made
// as prepareDisk makes one (a sparse file, mode 0600, the daemon's), and
// moves it into place.
func (r *Runtime) importImage(ctx context.Context, id string, rd *diskarchive.Reader) error {
	tmp := r.sandboxPath(id, importImageName)
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	err = rd.ExtractImage(ctx, f)
	if err == nil {
		err = checkExt4(f)
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		// A loop device still bound to the image it replaces keeps that
		// one (boundLoop matches the inode), never this one.
		err = os.Rename(tmp, r.diskImage(id))
	}
	if err != nil {
		_ = os.Remove(tmp)
		return err
	}
	// A disk of directories it had is replaced too (layerDirs prefers the
	// image; they would only take room).
	for _, d := range []string{"upper", "work"} {
		if err := os.RemoveAll(r.sandboxPath(id, d)); err != nil {
			return err
		}
	}
	return syncDir(r.sandboxDir(id))
}

// checkExt4 refuses an image that is no ext4 file system (its superblock's
// magic), before anything mounts it: a runc disk is one.
func checkExt4(f *os.File) error {
	var magic [2]byte
	if _, err := f.ReadAt(magic[:], 1024+56); err != nil || binary.LittleEndian.Uint16(magic[:]) != 0xef53 {
		return torpor.Invalid("disk", "the disk stream is refused: its image is not an ext4 file system")
	}
	return nil
}

// importTree extracts the stream's tree beside the sandbox's disk and
// makes it the upper directory of a disk of directories, with a new work
// directory.
func (r *Runtime) importTree(ctx context.Context, id string, rd *diskarchive.Reader) error {
	tmp := r.sandboxPath(id, importTreeName)
	if err := os.Mkdir(tmp, 0o755); err != nil {
		return err
	}
	err := rd.ExtractDir(ctx, tmp)
	if err == nil {
		// Its files' contents last before the rename makes them the disk.
		err = syncFS(tmp)
	}
	if err != nil {
		_ = os.RemoveAll(tmp)
		return err
	}
	// The image goes first: while there is one, layerDirs looks in it.
	if err := os.Remove(r.diskImage(id)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	for _, d := range []string{"upper", "work"} {
		if err := os.RemoveAll(r.sandboxPath(id, d)); err != nil {
			return err
		}
	}
	if err := os.Rename(tmp, r.sandboxPath(id, "upper")); err != nil {
		return err
	}
	if err := os.Mkdir(r.sandboxPath(id, "work"), 0o755); err != nil {
		return err
	}
	return syncDir(r.sandboxDir(id))
}

// syncFS flushes the file system that holds dir.
func syncFS(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Syncfs(fd)
}

// syncDir flushes a directory's entries, so that a rename into it lasts.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
