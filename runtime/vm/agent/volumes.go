package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor/runtime/vm/proto"
)

// volumeStage is where each volume disk's file system is mounted whole,
// on the agent's own tmpfs; its data/ directory is then bound at the
// volume's paths.
const volumeStage = "/.torpor/volumes"

// mountVolumes mounts the sandbox's volumes (proto.Start.Volumes): each
// disk, found by its serial, once (read-only when every mount of it is),
// and its data/ bound at each path, read-only where asked, nosuid and
// nodev, as the runc runtime binds them.
func mountVolumes(vols []proto.Volume) error {
	staged := map[string]string{}
	rw := map[string]bool{}
	for _, v := range vols {
		if !v.ReadOnly {
			rw[v.Serial] = true
		}
	}
	for _, v := range vols {
		root, ok := staged[v.Serial]
		if !ok {
			dev, err := diskBySerial(v.Serial)
			if err != nil {
				return err
			}
			dir := filepath.Join(volumeStage, v.Serial)
			if err := os.MkdirAll(dir, 0o700); err != nil {
				return err
			}
			flags := uintptr(unix.MS_NOSUID | unix.MS_NODEV)
			opts := "discard"
			if !rw[v.Serial] {
				flags |= unix.MS_RDONLY
				opts = ""
			}
			if err := unix.Mount(dev, dir, "ext4", flags, opts); err != nil {
				return fmt.Errorf("mount the volume on %s: %w", dev, err)
			}
			root = filepath.Join(dir, "data")
			if err := os.Mkdir(root, 0o777); err == nil {
				_ = os.Chmod(root, 0o777)
			} else if !errors.Is(err, fs.ErrExist) {
				return fmt.Errorf("the volume's root on %s: %w", dev, err)
			}
			staged[v.Serial] = root
		}
		if err := os.MkdirAll(v.Path, 0o755); err != nil {
			return fmt.Errorf("volume mount point %s: %w", v.Path, err)
		}
		if err := unix.Mount(root, v.Path, "", unix.MS_BIND|unix.MS_REC, ""); err != nil {
			return fmt.Errorf("bind the volume at %s: %w", v.Path, err)
		}
		flags := uintptr(unix.MS_BIND | unix.MS_REMOUNT | unix.MS_NOSUID | unix.MS_NODEV)
		if v.ReadOnly {
			flags |= unix.MS_RDONLY
		}
		if err := unix.Mount("", v.Path, "", flags, ""); err != nil {
			return fmt.Errorf("volume at %s: %w", v.Path, err)
		}
	}
	return nil
}

// diskBySerial returns the device of the virtio disk whose serial is
// serial (/sys/block/vd*/serial).
func diskBySerial(serial string) (string, error) {
	var found string
	err := waitFor(func() bool {
		names, _ := filepath.Glob("/sys/block/vd*/serial")
		for _, n := range names {
			if b, err := os.ReadFile(n); err == nil && strings.TrimSpace(string(b)) == serial {
				found = "/dev/" + filepath.Base(filepath.Dir(n))
				return true
			}
		}
		return false
	})
	if err != nil {
		return "", fmt.Errorf("no volume disk %s: %w", serial, err)
	}
	return found, nil
}
