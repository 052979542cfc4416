package runc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// A spare disk is a new sandbox disk made ahead of the boot that takes it:
// an image copied from the blank one of its size, bound to a loop device
// and mounted where nothing sees it (a detached mount, fsmount(2)), with
// the overlay's upper and work directories made. Taking it is a rename of
// the image into the sandbox's directory and a move_mount(2) onto the
// sandbox's disk mount point, instead of the copy, the loop device's
// binding and the mount (4-5 ms of a create, BENCHMARKS.md).
//
// Only the runtime's own descriptors hold a spare: when the daemon exits,
// however it exits, the kernel drops the detached mount and the loop
// device with it, and what is left is the image file, which the next New
// removes. The runtime keeps one spare for each of the maxSpareSizes disk
// sizes it booted last, made after a boot (never beside it) and again
// after each take.

// maxSpareSizes bounds how many disk sizes have a spare.
const maxSpareSizes = 2

// spareSeq numbers the spares' images of this process (runtimes over one
// directory in one process never share a name).
var spareSeq atomic.Uint64

// spareDisk is one spare: its image and its detached mount.
type spareDisk struct {
	image string
	mnt   int
}

// spareSet holds a runtime's spares, by disk size.
type spareSet struct {
	mu      sync.Mutex
	ready   map[int64]spareDisk
	filling map[int64]bool
	sizes   []int64 // the sizes with a spare or one coming, least recently booted first
	// off: the host cannot make them (no fsmount(2)); disks are made as
	// the boot needs them.
	off bool
}

// sparePrefix starts the names of spare images in Config.Dir/disks.
const sparePrefix = "spare."

// removeStaleSpares removes the images of spares that a process no longer
// running left in dir (their mounts and loop devices went with it).
func removeStaleSpares(dir string) {
	names, _ := filepath.Glob(filepath.Join(dir, sparePrefix+"*.img"))
	for _, p := range names {
		f := strings.Split(strings.TrimPrefix(filepath.Base(p), sparePrefix), ".")
		pid, err := strconv.Atoi(f[0])
		if err != nil || pid <= 0 {
			continue
		}
		if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); errors.Is(err, os.ErrNotExist) {
			_ = os.Remove(p)
		}
	}
}

// takeSpare makes the spare of sizeMiB, if there is one, the disk at image,
// mounted at target, and reports whether it did. It does not when it
// cannot: the caller makes the disk itself.
func (r *Runtime) takeSpare(sizeMiB int64, image, target string) bool {
	r.spares.mu.Lock()
	s, ok := r.spares.ready[sizeMiB]
	delete(r.spares.ready, sizeMiB)
	r.spares.mu.Unlock()
	if !ok {
		return false
	}
	defer unix.Close(s.mnt)
	if err := os.MkdirAll(target, 0o755); err != nil || mounted(target) {
		_ = os.Remove(s.image)
		return false
	}
	// The image is renamed first: a crash between the two leaves the
	// sandbox a disk that is not mounted (the kernel drops the detached
	// mount with the daemon), which its next boot mounts; the other way
	// round would leave it mounted from an image it does not have.
	if err := os.Rename(s.image, image); err != nil {
		_ = os.Remove(s.image)
		return false
	}
	if err := unix.MoveMount(s.mnt, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		r.log.Debug("runc: a spare disk could not be mounted; making one", "err", err)
		// The caller makes a new image (a new inode) over this one,
		// whose loop device goes with the descriptor.
		_ = os.Remove(image)
		return false
	}
	return true
}

// fillSpare makes, in the background, the spare of sizeMiB when there is
// none ready or coming, dropping the spare of the size booted longest ago
// beyond maxSpareSizes.
func (r *Runtime) fillSpare(sizeMiB int64) {
	if r.mkfs == "" || sizeMiB <= 0 {
		return
	}
	ss := &r.spares
	ss.mu.Lock()
	if ss.off || ss.filling[sizeMiB] {
		ss.mu.Unlock()
		return
	}
	ss.sizes = append(removeSize(ss.sizes, sizeMiB), sizeMiB)
	var drop []spareDisk
	for len(ss.sizes) > maxSpareSizes && !ss.filling[ss.sizes[0]] {
		if s, ok := ss.ready[ss.sizes[0]]; ok {
			drop = append(drop, s)
			delete(ss.ready, ss.sizes[0])
		}
		ss.sizes = ss.sizes[1:]
	}
	_, have := ss.ready[sizeMiB]
	if !have {
		if ss.ready == nil {
			ss.ready, ss.filling = map[int64]spareDisk{}, map[int64]bool{}
		}
		ss.filling[sizeMiB] = true
	}
	ss.mu.Unlock()
	for _, s := range drop {
		s.close()
	}
	if have {
		return
	}
	go func() {
		s, err := r.makeSpare(sizeMiB)
		ss.mu.Lock()
		defer ss.mu.Unlock()
		delete(ss.filling, sizeMiB)
		if err != nil {
			if errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EPERM) {
				ss.off = true
			}
			r.log.Debug("runc: no spare disk", "disk_mib", sizeMiB, "err", err)
			return
		}
		ss.ready[sizeMiB] = s
	}()
}

func removeSize(sizes []int64, size int64) []int64 {
	out := sizes[:0]
	for _, s := range sizes {
		if s != size {
			out = append(out, s)
		}
	}
	return out
}

// close drops a spare that no boot took.
func (s spareDisk) close() {
	unix.Close(s.mnt)
	_ = os.Remove(s.image)
}

// makeSpare makes a spare disk of sizeMiB.
func (r *Runtime) makeSpare(sizeMiB int64) (spareDisk, error) {
	blank, err := r.blankImage(context.Background(), sizeMiB)
	if err != nil {
		return spareDisk{}, err
	}
	image := filepath.Join(r.dir, "disks", fmt.Sprintf("%s%d.%d.img", sparePrefix, os.Getpid(), spareSeq.Add(1)))
	if err := copySparse(blank, image); err != nil {
		_ = os.Remove(image)
		return spareDisk{}, err
	}
	mnt, err := mountDetached(image)
	if err != nil {
		_ = os.Remove(image)
		return spareDisk{}, err
	}
	for _, d := range []string{"upper", "work"} {
		if err := unix.Mkdirat(mnt, d, 0o755); err != nil {
			s := spareDisk{image, mnt}
			s.close()
			return spareDisk{}, fmt.Errorf("mkdir %s: %w", d, err)
		}
	}
	return spareDisk{image, mnt}, nil
}

// mountDetached mounts the ext4 image as mountImage does, but attached
// nowhere: the file system lives while the returned descriptor is open
// (or once it is moved onto a mount point).
func mountDetached(image string) (int, error) {
	dev, err := attachLoop(image)
	if err != nil {
		return -1, fmt.Errorf("loop device for %s: %w", image, err)
	}
	// The mount holds the device from here on.
	defer dev.Close()
	fsfd, err := unix.Fsopen("ext4", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsopen: %w", err)
	}
	defer unix.Close(fsfd)
	if err := unix.FsconfigSetString(fsfd, "source", dev.Name()); err != nil {
		return -1, fmt.Errorf("fsconfig source: %w", err)
	}
	// As mountImage: noinit_itable, discard.
	for _, flag := range []string{"noinit_itable", "discard"} {
		if err := unix.FsconfigSetFlag(fsfd, flag); err != nil {
			return -1, fmt.Errorf("fsconfig %s: %w", flag, err)
		}
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return -1, fmt.Errorf("mount %s: %w", image, err)
	}
	mnt, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return -1, fmt.Errorf("fsmount %s: %w", image, err)
	}
	return mnt, nil
}
