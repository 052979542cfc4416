package runc

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// maxMountData is the most mount(2) passes to a file system as its
// options: one page, less the terminating NUL.
var maxMountData = os.Getpagesize() - 1

// lowerOption returns overlayfs' lowerdir value for lowers given lowest
// first: overlayfs wants the topmost first.
func lowerOption(lowers []string) string {
	top := make([]string, len(lowers))
	for i, l := range lowers {
		top[len(lowers)-1-i] = l
	}
	return strings.Join(top, ":")
}

// mountLayers mounts an overlay of the read-only lowers (lowest first)
// under the sandbox's upper directory at target. A list of layers too long
// for mount(2)'s one page of options is named through short symbolic links
// made in linkDir; when even those do not fit, it is mounted through the
// new mount API, which takes one lower directory per call ("lowerdir+",
// Linux 6.8 and later).
func mountLayers(lowers []string, upper, work, target, linkDir string) error {
	fits := func(lower string) bool {
		return len(fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", lower, upper, work)) <= maxMountData
	}
	if lower := lowerOption(lowers); fits(lower) {
		return mountOverlay(lower, upper, work, target)
	}
	short, err := shortLinks(lowers, linkDir)
	if err != nil {
		return err
	}
	if lower := lowerOption(short); fits(lower) {
		return mountOverlay(lower, upper, work, target)
	}
	if mounted(target) {
		if err := unmountAll(target); err != nil {
			return err
		}
	}
	if err := mountOverlayFD(lowers, upper, work, target); err != nil {
		return fmt.Errorf("mount an overlay of %d layers on %s (too many for mount(2); the new mount API needs Linux 6.8): %w", len(lowers), target, err)
	}
	return nil
}

// shortLinks returns, for each path, a short symbolic link to it in dir
// (named by a hash of the path), making the links that are missing.
func shortLinks(paths []string, dir string) ([]string, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	out := make([]string, len(paths))
	for i, p := range paths {
		sum := sha256.Sum256([]byte(p))
		link := filepath.Join(dir, hex.EncodeToString(sum[:6]))
		if have, err := os.Readlink(link); err != nil || have != p {
			tmp := fmt.Sprintf("%s.tmp%d", link, os.Getpid())
			_ = os.Remove(tmp)
			if err := os.Symlink(p, tmp); err != nil {
				return nil, fmt.Errorf("short layer link: %w", err)
			}
			if err := os.Rename(tmp, link); err != nil {
				return nil, fmt.Errorf("short layer link: %w", err)
			}
		}
		out[i] = link
	}
	return out, nil
}

// mountOverlayFD mounts the overlay with fsopen/fsconfig/fsmount.
func mountOverlayFD(lowers []string, upper, work, target string) error {
	fsfd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return fmt.Errorf("fsopen: %w", err)
	}
	defer unix.Close(fsfd)
	for i := len(lowers) - 1; i >= 0; i-- {
		if err := unix.FsconfigSetString(fsfd, "lowerdir+", lowers[i]); err != nil {
			return fmt.Errorf("fsconfig lowerdir+ %s: %w", lowers[i], err)
		}
	}
	for _, kv := range [][2]string{{"upperdir", upper}, {"workdir", work}} {
		if err := unix.FsconfigSetString(fsfd, kv[0], kv[1]); err != nil {
			return fmt.Errorf("fsconfig %s: %w", kv[0], err)
		}
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return fmt.Errorf("fsconfig create: %w", err)
	}
	mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, unix.MOUNT_ATTR_NODEV)
	if err != nil {
		return fmt.Errorf("fsmount: %w", err)
	}
	defer unix.Close(mfd)
	if err := unix.MoveMount(mfd, "", unix.AT_FDCWD, target, unix.MOVE_MOUNT_F_EMPTY_PATH); err != nil {
		return fmt.Errorf("move_mount: %w", err)
	}
	return nil
}
