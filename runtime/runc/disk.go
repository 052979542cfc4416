package runc

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// A sandbox's disk is its writable layer: the overlay's upper and work
// directories. With Resources.DiskMiB set, and where the host can, it is
// an ext4 file system of that size in a sparse image file (disk.img in the
// sandbox's directory), loop-mounted at disk/ while the sandbox has an
// instance: what the sandbox writes fills the image and no more (a write
// beyond fails with ENOSPC inside), and the host spends what is written.
// The file system holds only what the sandbox wrote; the template's files
// are the overlay's read-only lower layers, not counted.
//
// A new image is a copy of an empty file system of its size, formatted
// once per size with mkfs.ext4 and kept under Config.Dir/disks (the most
// recently used maxBlankImages of them): the copy skips the holes, so it
// writes about a megabyte, where formatting takes several times as long.
// A new sandbox's disk is usually made before its boot asks for it, copied
// and mounted already: a spare disk (spare.go).
//
// Disks made before images (directories upper/ and work/ in the
// sandbox's directory), and every disk where the host lacks mkfs.ext4,
// loop devices or ext4, are directories on the host's file system, not
// limited.

// maxBlankImages bounds how many empty file systems (one per disk size)
// the runtime keeps to copy.
const maxBlankImages = 8

// diskImageName and diskMountName are the image and its mount point in
// the sandbox's directory.
const (
	diskImageName = "disk.img"
	diskMountName = "disk"
)

// diskSupport finds out whether the host can give sandboxes disks of a
// fixed size: it returns the path of mkfs.ext4, or "" and why not.
func diskSupport() (string, string) {
	mkfs, err := exec.LookPath("mkfs.ext4")
	if err != nil {
		for _, p := range []string{"/usr/sbin/mkfs.ext4", "/sbin/mkfs.ext4"} {
			if _, serr := os.Stat(p); serr == nil {
				mkfs, err = p, nil
				break
			}
		}
	}
	if err != nil {
		return "", "no mkfs.ext4 (apt-get install e2fsprogs)"
	}
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		return "", "no loop devices (/dev/loop-control: modprobe loop)"
	}
	b, err := os.ReadFile("/proc/filesystems")
	if err != nil || !strings.Contains(string(b), "\text4\n") {
		return "", "the kernel has no ext4 file system"
	}
	return mkfs, ""
}

// probeDisks makes, mounts and removes a small disk image under dir:
// where a loop device cannot be had (a container without udev has
// /dev/loop-control but not the nodes of new devices), sandboxes get
// disks of directories rather than failing to boot.
func probeDisks(ctx context.Context, dir, mkfs string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	image, target := filepath.Join(dir, fmt.Sprintf("probe.%d.img", os.Getpid())), filepath.Join(dir, fmt.Sprintf("probe.%d", os.Getpid()))
	defer os.Remove(image)
	defer os.Remove(target)
	_ = os.Remove(image)
	if err := formatImage(ctx, mkfs, image, 16); err != nil {
		return err
	}
	if err := mountImage(image, target, true); err != nil {
		return err
	}
	return unmountAll(target)
}

func (r *Runtime) diskImage(id string) string { return r.sandboxPath(id, diskImageName) }
func (r *Runtime) diskMount(id string) string { return r.sandboxPath(id, diskMountName) }

// layerDirs returns the sandbox's upper and work directories: in its image
// when it has one, else in its directory.
func (r *Runtime) layerDirs(id string) (upper, work string) {
	if _, err := os.Lstat(r.diskImage(id)); err == nil {
		return filepath.Join(r.diskMount(id), "upper"), filepath.Join(r.diskMount(id), "work")
	}
	return r.sandboxPath(id, "upper"), r.sandboxPath(id, "work")
}

// diskExists reports whether the sandbox has a disk: an image, or the
// directories of a disk made before images.
func (r *Runtime) diskExists(id string) bool {
	if _, err := os.Lstat(r.diskImage(id)); err == nil {
		return true
	}
	_, err := os.Stat(r.sandboxPath(id, "upper"))
	return err == nil
}

// prepareDisk makes the sandbox's disk if it has none (an image of
// sizeMiB where the runtime can, else directories) and mounts its image,
// and returns its upper and work directories.
func (r *Runtime) prepareDisk(ctx context.Context, id string, sizeMiB int64) (upper, work string, err error) {
	steps := stepsOf(ctx)
	t := time.Now()
	image := r.diskImage(id)
	fresh := false
	_, err = os.Lstat(image)
	switch {
	case err == nil:
		// An image a checkpoint's copy just made is as new as a fresh one.
		_, fresh = r.cloned.LoadAndDelete(id)
	case !errors.Is(err, fs.ErrNotExist):
		return "", "", err
	case r.diskExists(id) || r.mkfs == "" || sizeMiB <= 0:
		// A disk of directories stays one; where no image can be made,
		// a new disk is one too.
		image = ""
	default:
		// A spare comes mounted (mountImage finds it so); else one is made.
		if !r.takeSpare(sizeMiB, image, r.diskMount(id)) {
			if err := r.newDiskImage(ctx, image, sizeMiB); err != nil {
				return "", "", fmt.Errorf("disk of %d MiB: %w", sizeMiB, err)
			}
		}
		fresh = true
		t = steps.since("disk_image", t)
	}
	if image != "" {
		if err := mountImage(image, r.diskMount(id), fresh); err != nil {
			return "", "", err
		}
		t = steps.since("disk_mount", t)
	}
	upper, work = r.layerDirs(id)
	for _, d := range []string{upper, work} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			return "", "", err
		}
	}
	steps.since("disk_dirs", t)
	return upper, work, nil
}

// newDiskImage makes an image of an empty ext4 file system of sizeMiB at
// dst: a copy of the blank one of that size, formatted first if there is
// none.
func (r *Runtime) newDiskImage(ctx context.Context, dst string, sizeMiB int64) error {
	tmp := dst + ".tmp"
	_ = os.Remove(tmp) // left by a crash
	for attempt := 0; ; attempt++ {
		blank, err := r.blankImage(ctx, sizeMiB)
		if err != nil {
			return err
		}
		err = copySparse(blank, tmp)
		if err == nil {
			return os.Rename(tmp, dst)
		}
		os.Remove(tmp)
		// Pruned between the two (the least recently used of many sizes):
		// made again.
		if !errors.Is(err, fs.ErrNotExist) || attempt > 0 {
			return err
		}
	}
}

// blankImage returns the empty file system of sizeMiB to copy, formatting
// it when it is missing (and dropping the least recently used beyond
// maxBlankImages).
func (r *Runtime) blankImage(ctx context.Context, sizeMiB int64) (string, error) {
	dir := filepath.Join(r.dir, "disks")
	p := filepath.Join(dir, "ext4-"+strconv.FormatInt(sizeMiB, 10)+"m.img")
	defer r.blanks.Lock(p)()
	if _, err := os.Stat(p); err == nil {
		now := time.Now()
		_ = os.Chtimes(p, now, now) // recently used
		return p, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	tmp := fmt.Sprintf("%s.%d.tmp", p, os.Getpid())
	if err := formatImage(ctx, r.mkfs, tmp, sizeMiB); err != nil {
		os.Remove(tmp)
		return "", err
	}
	if err := os.Rename(tmp, p); err != nil {
		return "", err
	}
	pruneBlankImages(dir, p)
	return p, nil
}

// formatImage makes a sparse file of sizeMiB at p holding an empty ext4
// file system: 4 KiB blocks and an inode per 16 KiB at every size (as a
// large file system has them; `df` inside shows about 58 MiB of 64, 1.9
// GiB of 2), no blocks reserved for root (a sandbox's root may not use
// them), the inode tables and journal left for the kernel to initialise
// as they are used, and no discards (the file is new).
func formatImage(ctx context.Context, mkfs, p string, sizeMiB int64) error {
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	err = f.Truncate(sizeMiB << 20)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	out, err := exec.CommandContext(ctx, mkfs, "-q", "-F", "-b", "4096", "-i", "16384", "-m", "0", "-L", "torpor-disk",
		"-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard", p).CombinedOutput()
	if err != nil {
		// mkfs tells a full host disk only in its words: said as ENOSPC,
		// the failure is the full data disk (torpor.IsDiskFull).
		if strings.Contains(string(out), "No space left on device") {
			err = unix.ENOSPC
		}
		return fmt.Errorf("mkfs.ext4: %w: %s", err, strings.TrimSpace(string(out)))
	}
	return nil
}

// pruneBlankImages removes the least recently used blank images of dir
// beyond maxBlankImages, never keep.
func pruneBlankImages(dir, keep string) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	type blank struct {
		path string
		used int64
	}
	var all []blank
	for _, e := range entries {
		if !strings.HasSuffix(e.Name(), "m.img") {
			continue
		}
		if fi, err := e.Info(); err == nil {
			all = append(all, blank{filepath.Join(dir, e.Name()), fi.ModTime().UnixNano()})
		}
	}
	sort.Slice(all, func(i, j int) bool { return all[i].used > all[j].used })
	for i, b := range all {
		if i >= maxBlankImages && b.path != keep {
			os.Remove(b.path)
		}
	}
}

// copySparse copies the file src to a new file dst, writing only its data
// segments: the holes of a sparse image stay holes.
func copySparse(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	fi, err := in.Stat()
	if err != nil {
		return err
	}
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if err := copyData(in, out, fi.Size()); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

func copyData(in, out *os.File, size int64) error {
	if err := out.Truncate(size); err != nil {
		return err
	}
	for off := int64(0); off < size; {
		data, err := unix.Seek(int(in.Fd()), off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // only a hole is left
		}
		if err != nil {
			return err
		}
		hole, err := unix.Seek(int(in.Fd()), data, unix.SEEK_HOLE)
		if err != nil {
			return err
		}
		if _, err := in.Seek(data, io.SeekStart); err != nil {
			return err
		}
		if _, err := out.Seek(data, io.SeekStart); err != nil {
			return err
		}
		if _, err := io.CopyN(out, in, hole-data); err != nil {
			return err
		}
		off = hole
	}
	return nil
}

// mountImage mounts the ext4 image at target (made when missing) through
// a loop device that goes when the file system is unmounted; an image
// mounted there already stays as it is. A fresh image, made by the
// caller, is bound to no loop device yet (its inode is new): the search
// for one, which reads every loop device of the host (30 ms where there
// are a thousand), is skipped.
func mountImage(image, target string, fresh bool) error {
	if err := os.MkdirAll(target, 0o755); err != nil {
		return err
	}
	if mounted(target) {
		return nil
	}
	var dev *os.File
	var err error
	if !fresh {
		dev, err = boundLoop(image)
	}
	if err == nil && dev == nil {
		dev, err = attachLoop(image)
	}
	if err != nil {
		return fmt.Errorf("loop device for %s: %w", image, err)
	}
	defer dev.Close()
	// noinit_itable: the inode tables are not zeroed in the background
	// (which would allocate them in the image); discard: what the sandbox
	// deletes goes back to the host.
	if err := unix.Mount(dev.Name(), target, "ext4", unix.MS_NODEV, "noinit_itable,discard"); err != nil {
		return fmt.Errorf("mount %s on %s: %w", image, target, err)
	}
	return nil
}

// boundLoop returns, opened, a loop device that is still bound to image,
// or nil when none is. An earlier instance's file system of the image
// lives on there after its unmount when something still holds it: a file
// the daemon had open in it (a files API call in flight, so the unmount
// could only detach it), or a copy of the mount in a mount namespace made
// while it was mounted (a process that unshared its mounts: a build's, a
// systemd service's), which lasts as long as that namespace. Mounting
// that device again mounts the same file system; mounting the image
// through a second device would make a second one over the same blocks,
// and each would write its own bitmaps and journal over the other's.
func boundLoop(image string) (*os.File, error) {
	var st unix.Stat_t
	if err := unix.Stat(image, &st); err != nil {
		return nil, err
	}
	real, err := filepath.EvalSymlinks(image)
	if err != nil {
		return nil, err
	}
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, f := range files {
		// The kernel names the backing file by its path (links resolved);
		// the device's own record of its inode is what counts.
		if b, err := os.ReadFile(f); err != nil || strings.TrimSpace(string(b)) != real {
			continue
		}
		dev, err := os.OpenFile("/dev/"+filepath.Base(filepath.Dir(filepath.Dir(f))), os.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			continue
		}
		// Open, the device stays bound (autoclear waits for its last
		// user): check that it is bound to this very file.
		if info, err := unix.IoctlLoopGetStatus64(int(dev.Fd())); err == nil && info.Inode == st.Ino && info.Device == st.Dev {
			return dev, nil
		}
		dev.Close()
	}
	return nil, nil
}

// attachLoop binds the file at path to a free loop device and returns the
// device, open: the binding lasts while the device is open or mounted
// (LO_FLAGS_AUTOCLEAR), so nothing is left when the caller's mount fails
// or the daemon dies before it.
func attachLoop(path string) (*os.File, error) {
	backing, err := os.OpenFile(path, os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer backing.Close()
	ctl, err := os.OpenFile("/dev/loop-control", os.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer ctl.Close()
	for attempt := 0; ; attempt++ {
		n, err := unix.IoctlRetInt(int(ctl.Fd()), unix.LOOP_CTL_GET_FREE)
		if err != nil {
			return nil, fmt.Errorf("LOOP_CTL_GET_FREE: %w", err)
		}
		dev, err := os.OpenFile("/dev/loop"+strconv.Itoa(n), os.O_RDWR|unix.O_CLOEXEC, 0)
		if err != nil {
			return nil, err
		}
		err = configureLoop(dev, backing)
		if err == nil {
			return dev, nil
		}
		dev.Close()
		// Another process took the device between the two calls.
		if !errors.Is(err, unix.EBUSY) || attempt >= 16 {
			return nil, err
		}
	}
}

// configureLoop binds backing to the loop device dev with autoclear, by
// LOOP_CONFIGURE (Linux 5.8), else LOOP_SET_FD and LOOP_SET_STATUS64.
func configureLoop(dev, backing *os.File) error {
	cfg := unix.LoopConfig{Fd: uint32(backing.Fd())}
	cfg.Info.Flags = unix.LO_FLAGS_AUTOCLEAR
	err := unix.IoctlLoopConfigure(int(dev.Fd()), &cfg)
	if !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOTTY) {
		return err
	}
	if err := unix.IoctlSetInt(int(dev.Fd()), unix.LOOP_SET_FD, int(backing.Fd())); err != nil {
		return err
	}
	if err := unix.IoctlLoopSetStatus64(int(dev.Fd()), &unix.LoopInfo64{Flags: unix.LO_FLAGS_AUTOCLEAR}); err != nil {
		_ = unix.IoctlSetInt(int(dev.Fd()), unix.LOOP_CLR_FD, 0)
		return err
	}
	return nil
}

// diskBytes returns the space the sandbox's disk holds: the blocks in use
// in its mounted image (what `df` inside shows), else the blocks the
// files of its upper directory take.
func (r *Runtime) diskBytes(ctx context.Context, id string) (int64, error) {
	if _, err := os.Lstat(r.diskImage(id)); err == nil {
		if !mounted(r.diskMount(id)) {
			return 0, errors.New("the disk is not mounted")
		}
		var st unix.Statfs_t
		if err := unix.Statfs(r.diskMount(id), &st); err != nil {
			return 0, err
		}
		return int64(st.Blocks-st.Bfree) * st.Bsize, nil
	}
	upper, _ := r.layerDirs(id)
	return diskUsage(ctx, upper)
}
