package vm

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor"
)

// validateTemplate checks the template's read-only directories before
// anything is built from them.
func validateTemplate(t torpor.Template) error {
	lowers := t.LowerDirs()
	if len(lowers) == 0 {
		return torpor.Invalid("template", "template %q has no root filesystem", t.Name)
	}
	for _, l := range lowers {
		if !filepath.IsAbs(l) || strings.ContainsAny(l, ",:\\\x00") {
			return torpor.Invalid("template", "template %q has no usable root filesystem path", t.Name)
		}
		if fi, err := os.Stat(l); err != nil || !fi.IsDir() {
			return torpor.Invalid("template", "root filesystem of template %q is missing", t.Name)
		}
	}
	return nil
}

// imageKey names a template's image: its digest and layer directories
// (with their identity on disk, so a template rebuilt in place gets a new
// image) and the disk size.
func (r *Runtime) imageKey(t torpor.Template) string {
	h := sha256.New()
	fmt.Fprintf(h, "%s\n%d\n", t.Digest, r.diskMiB)
	for _, l := range t.LowerDirs() {
		var st unix.Stat_t
		_ = unix.Stat(l, &st)
		fmt.Fprintf(h, "%s %d %d %d\n", l, st.Ino, st.Ctim.Sec, st.Ctim.Nsec)
	}
	return hex.EncodeToString(h.Sum(nil))[:24]
}

// baseImage returns the template's read-only ext4 image, made once and
// shared by every sandbox of the template: a sparse file of the disk's
// size holding the template's files (its layers stacked by a read-only
// overlay mount, whiteouts applied).
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
	tmp := img + ".tmp" + strconv.Itoa(os.Getpid())
	cmd := exec.CommandContext(ctx, "mkfs.ext4", "-q", "-F", "-L", "torpor", "-E", "root_owner=0:0",
		"-d", src, tmp, strconv.FormatInt(r.diskMiB, 10)+"M")
	if out, err := cmd.CombinedOutput(); err != nil {
		os.Remove(tmp)
		return "", fmt.Errorf("vm: make the disk image of template %q: %v: %s", t.Name, err, bytes.TrimSpace(out))
	}
	if err := os.Chmod(tmp, 0o444); err != nil {
		os.Remove(tmp)
		return "", err
	}
	if err := os.Rename(tmp, img); err != nil {
		os.Remove(tmp)
		return "", err
	}
	return img, nil
}

// ensureDisk makes the sandbox's disk, a qcow2 overlay on the template's
// image, unless it exists.
func (r *Runtime) ensureDisk(ctx context.Context, id string, t torpor.Template) error {
	if r.diskExists(id) {
		return nil
	}
	base, err := r.baseImage(ctx, t)
	if err != nil {
		return err
	}
	tmp := r.diskPath(id) + ".tmp"
	_ = os.Remove(tmp)
	cmd := exec.CommandContext(ctx, r.qemuImg, "create", "-q", "-f", "qcow2", "-F", "raw", "-b", base, tmp)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("vm: qemu-img create: %v: %s", err, bytes.TrimSpace(out))
	}
	return os.Rename(tmp, r.diskPath(id))
}
