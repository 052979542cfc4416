package vm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor"
)

// imageKey names a template's image: its digest and layer directories
// (with their identity on disk, so a template rebuilt in place gets a new
// image) and the way images are made.
func (r *Runtime) imageKey(t torpor.Template) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%s\n", t.Digest, imageScheme)
	for _, l := range t.LowerDirs() {
		var st unix.Stat_t
		_ = unix.Stat(l, &st)
		fmt.Fprintf(h, "%s %d %d %d\n", l, st.Ino, st.Ctim.Sec, st.Ctim.Nsec)
	}
	return hex.EncodeToString(h.Sum(nil))[:24]
}

// imageScheme names how images are made; a change makes new ones (the
// sandboxes on older images keep theirs).
const imageScheme = "fitted-4k"

// baseImage returns the template's read-only ext4 image, made once and
// shared by every sandbox of the template: a sparse file little larger
// than the template's files (its layers stacked by a read-only overlay
// mount, whiteouts applied). Each sandbox's disk is an overlay of its
// own size on it, whose file system the guest grows at boot.
func (r *Runtime) baseImage(ctx context.Context, t torpor.Template) (string, error) {
	key := r.imageKey(t)
	img := filepath.Join(r.dir, "images", key+".img")
	defer r.imageMu.Lock(key)()
	if _, err := os.Stat(img); err == nil {
		return img, nil
	}
	lowers := t.LowerDirs()
	src := lowers[0]
	if len(lowers) > 1 {
		mnt, err := os.MkdirTemp(filepath.Join(r.dir, "cache"), "layers-")
		if err != nil {
			return "", err
		}
		defer os.Remove(mnt)
		top := make([]string, len(lowers))
		for i, l := range lowers {
			top[len(lowers)-1-i] = l
		}
		if err := unix.Mount("overlay", mnt, "overlay", unix.MS_RDONLY|unix.MS_NODEV, "lowerdir="+strings.Join(top, ":")); err != nil {
			return "", fmt.Errorf("vm: stack the layers of template %q: %w", t.Name, err)
		}
		defer unix.Unmount(mnt, unix.MNT_DETACH)
		src = mnt
	}
	mib, err := fittedMiB(src)
	if err != nil {
		return "", fmt.Errorf("vm: the files of template %q: %w", t.Name, err)
	}
	tmp := img + ".tmp" + strconv.Itoa(os.Getpid())
	defer os.Remove(tmp)
	// The estimate is generous; should mkfs still run out of room (an
	// odd tree), try again twice as large.
	for attempt := 0; ; attempt++ {
		_ = os.Remove(tmp)
		// 4 KiB blocks and an inode per 16 KiB whatever the size: mke2fs
		// would make a small file system of 1 KiB blocks, poor to grow.
		cmd := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-L", "torpor", "-b", "4096", "-i", "16384",
			"-E", "root_owner=0:0", "-d", src, tmp, strconv.FormatInt(mib, 10)+"M")
		out, err := cmd.CombinedOutput()
		if err == nil {
			break
		}
		if attempt == 2 || ctx.Err() != nil {
			return "", fmt.Errorf("vm: make the disk image of template %q: %v: %s", t.Name, err, bytes.TrimSpace(out))
		}
		mib *= 2
	}
	if err := os.Chmod(tmp, 0o444); err != nil {
		return "", err
	}
	if err := os.Rename(tmp, img); err != nil {
		return "", err
	}
	return img, nil
}

// fittedMiB sizes the image of the files under dir: their blocks and an
// inode each (at the image's 16 KiB per inode), a quarter more for the
// file system's own blocks and some room, and the journal; 32 MiB at
// least.
func fittedMiB(dir string) (int64, error) {
	var blocks, inodes int64
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		inodes++
		switch {
		case d.Type().IsRegular():
			fi, err := d.Info()
			if err != nil {
				return err
			}
			blocks += (fi.Size() + 4095) / 4096
		case d.IsDir(), d.Type()&fs.ModeSymlink != 0:
			blocks++
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	need := max(blocks*4096, inodes*16384)
	mib := (need+need/4)>>20 + 16 + 16 // + room + journal
	return max(mib, 32), nil
}

// ensureDisk makes the sandbox's disk, a qcow2 overlay of diskMiB (0:
// Config.DiskMiB) on the template's image, unless it exists; a disk
// smaller than asked is grown (never shrunk). A size the template's
// files do not fit in is an invalid_argument error.
func (r *Runtime) ensureDisk(ctx context.Context, id string, t torpor.Template, diskMiB int64) error {
	if diskMiB == 0 {
		diskMiB = r.diskMiB
	}
	size := diskMiB << 20
	if r.diskExists(id) {
		have, err := qcow2Size(r.diskPath(id))
		if err != nil {
			return fmt.Errorf("vm: the disk of %s: %w", id, err)
		}
		if have >= size {
			return nil
		}
		cmd := exec.CommandContext(ctx, r.qemuImg, "resize", "-q", "-f", "qcow2", r.diskPath(id), strconv.FormatInt(size, 10))
		if out, err := cmd.CombinedOutput(); err != nil {
			return fmt.Errorf("vm: qemu-img resize: %v: %s", err, bytes.TrimSpace(out))
		}
		return nil
	}
	base, err := r.baseImage(ctx, t)
	if err != nil {
		return err
	}
	fi, err := os.Stat(base)
	if err != nil {
		return err
	}
	if fi.Size() > size {
		return torpor.Invalid("resources.disk_mib", "the files of template %q need a disk of at least %d MiB", t.Name, (fi.Size()+1<<20-1)>>20)
	}
	tmp := r.diskPath(id) + ".tmp"
	_ = os.Remove(tmp)
	cmd := exec.CommandContext(ctx, r.qemuImg, "create", "-q", "-f", "qcow2", "-F", "raw", "-b", base, tmp, strconv.FormatInt(size, 10))
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("vm: qemu-img create: %v: %s", err, bytes.TrimSpace(out))
	}
	return os.Rename(tmp, r.diskPath(id))
}

// qcow2Size reads the virtual size of a qcow2 image from its header.
func qcow2Size(p string) (int64, error) {
	f, err := os.Open(p)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	var h [32]byte
	if _, err := io.ReadFull(f, h[:]); err != nil {
		return 0, err
	}
	if string(h[:4]) != "QFI\xfb" {
		return 0, errors.New("not a qcow2 image")
	}
	return int64(binary.BigEndian.Uint64(h[24:])), nil
}
