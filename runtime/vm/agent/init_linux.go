package agent

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor/runtime/vm/proto"
)

// Paths of the initramfs the runtime builds (runtime/vm's initramfs.go).
const (
	// ModuleOrder lists the kernel modules to load, one path a line,
	// dependencies first.
	ModuleOrder = "/modules/order"
	// RootDevice is the sandbox's disk.
	RootDevice = "/dev/vda"
	newRoot    = "/newroot"
	// devWait bounds the wait for the virtio devices to appear.
	devWait = 30 * time.Second
)

// bootGuest turns the initramfs into the sandbox: it mounts /dev, /proc
// and /sys, loads the virtio modules, mounts the sandbox's disk and makes
// it the root (freeing the initramfs), and mounts what a Linux userland
// expects on it.
func bootGuest() error {
	for _, m := range []struct{ src, dst, typ string }{
		{"devtmpfs", "/dev", "devtmpfs"},
		{"proc", "/proc", "proc"},
		{"sysfs", "/sys", "sysfs"},
	} {
		if err := os.MkdirAll(m.dst, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(m.src, m.dst, m.typ, unix.MS_NOSUID, ""); err != nil && !errors.Is(err, unix.EBUSY) {
			return fmt.Errorf("mount %s: %w", m.dst, err)
		}
	}
	if err := loadModules(ModuleOrder); err != nil {
		return err
	}
	if err := waitFor(func() bool { _, err := os.Stat(RootDevice); return err == nil }); err != nil {
		return fmt.Errorf("no disk %s: %w", RootDevice, err)
	}
	if err := waitFor(func() bool { _, err := findPort(portName()); return err == nil }); err != nil {
		return fmt.Errorf("no virtio-serial port %s: %w", portName(), err)
	}
	if err := os.MkdirAll(newRoot, 0o755); err != nil {
		return err
	}
	if err := unix.Mount(RootDevice, newRoot, "ext4", 0, ""); err != nil {
		return fmt.Errorf("mount the sandbox disk: %w", err)
	}
	if err := growRoot(newRoot); err != nil {
		// The sandbox still runs, on a smaller disk: say so on the console.
		fmt.Fprintf(os.Stderr, "torpor-agent: %v\n", err)
	}
	for _, d := range []string{"/dev", "/proc", "/sys"} {
		if err := os.MkdirAll(newRoot+d, 0o755); err != nil {
			return err
		}
		if err := unix.Mount(d, newRoot+d, "", unix.MS_MOVE, ""); err != nil {
			return fmt.Errorf("move %s: %w", d, err)
		}
	}
	freeInitramfs()
	if err := unix.Chdir(newRoot); err != nil {
		return err
	}
	if err := unix.Mount(".", "/", "", unix.MS_MOVE, ""); err != nil {
		return fmt.Errorf("move the root: %w", err)
	}
	if err := unix.Chroot("."); err != nil {
		return fmt.Errorf("chroot: %w", err)
	}
	if err := unix.Chdir("/"); err != nil {
		return err
	}
	for _, m := range []struct{ src, dst, typ, opts string }{
		{"devpts", "/dev/pts", "devpts", "newinstance,ptmxmode=0666,mode=0620,gid=5"},
		{"shm", "/dev/shm", "tmpfs", "mode=1777"},
		{"mqueue", "/dev/mqueue", "mqueue", ""},
		{"cgroup2", "/sys/fs/cgroup", "cgroup2", ""},
	} {
		_ = os.MkdirAll(m.dst, 0o755)
		if err := unix.Mount(m.src, m.dst, m.typ, unix.MS_NOSUID|unix.MS_NOEXEC, m.opts); err != nil && m.typ == "cgroup2" {
			return fmt.Errorf("mount %s: %w", m.dst, err)
		}
	}
	if err := installSelf(); err != nil {
		return err
	}
	_ = os.Symlink("/proc/self/fd", "/dev/fd")
	_ = os.Symlink("/dev/pts/ptmx", "/dev/ptmx")
	_ = os.MkdirAll("/tmp", 0o1777)
	if err := loopbackUp(); err != nil {
		return err
	}
	return netUp()
}

// installSelf copies the agent (whose initramfs file is gone) to a tmpfs
// at /.torpor, so that it can run again as the code server.
func installSelf() error {
	dir := filepath.Dir(proto.GuestAgentPath)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	if err := unix.Mount("torpor", dir, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "mode=0755,size=32m"); err != nil {
		return fmt.Errorf("mount %s: %w", dir, err)
	}
	src, err := os.Open("/proc/self/exe")
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.OpenFile(proto.GuestAgentPath, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return err
	}
	if err := dst.Close(); err != nil {
		return err
	}
	return os.MkdirAll(proto.GuestRunDir, 0o755)
}

// loadModules loads the modules listed in the order file; a module the
// kernel already has is fine.
func loadModules(order string) error {
	f, err := os.Open(order)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		p := strings.TrimSpace(sc.Text())
		if p == "" {
			continue
		}
		m, err := os.Open(p)
		if err != nil {
			return err
		}
		err = unix.FinitModule(int(m.Fd()), "", 0)
		m.Close()
		if err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("load %s: %w", filepath.Base(p), err)
		}
	}
	return sc.Err()
}

func waitFor(cond func() bool) error {
	deadline := time.Now().Add(devWait)
	for !cond() {
		if time.Now().After(deadline) {
			return errors.New("timed out")
		}
		time.Sleep(2 * time.Millisecond)
	}
	return nil
}

// freeInitramfs removes the initramfs' files (it is a tmpfs-like rootfs
// whose memory only goes back when they are deleted), staying on its
// device: the new root and the moved mounts are left alone.
func freeInitramfs() {
	var root unix.Stat_t
	if unix.Lstat("/", &root) != nil {
		return
	}
	entries, _ := os.ReadDir("/")
	for _, e := range entries {
		p := "/" + e.Name()
		if p == newRoot {
			continue
		}
		removeOnDevice(p, root.Dev)
	}
}

func removeOnDevice(p string, dev uint64) {
	var st unix.Stat_t
	if unix.Lstat(p, &st) != nil || st.Dev != dev {
		return
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		entries, _ := os.ReadDir(p)
		for _, e := range entries {
			removeOnDevice(p+"/"+e.Name(), dev)
		}
		_ = unix.Rmdir(p)
		return
	}
	_ = unix.Unlink(p)
}

// loopbackUp brings up lo (a VM off the host's sandbox network has no
// other interface).
func loopbackUp() error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq("lo")
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return fmt.Errorf("lo flags: %w", err)
	}
	ifr.SetUint16(ifr.Uint16() | unix.IFF_UP)
	if err := unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr); err != nil {
		return fmt.Errorf("lo up: %w", err)
	}
	return nil
}

// findPort returns the device of the virtio-serial port with the given
// name (the guest has no udev to make /dev/virtio-ports links).
func findPort(name string) (string, error) {
	entries, err := os.ReadDir("/sys/class/virtio-ports")
	if err != nil {
		return "", err
	}
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/sys/class/virtio-ports", e.Name(), "name"))
		if err == nil && strings.TrimSpace(string(b)) == name {
			return "/dev/" + e.Name(), nil
		}
	}
	return "", fs.ErrNotExist
}
