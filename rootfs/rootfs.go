// Package rootfs builds the root filesystems that torpor templates are made
// from. The built-in "base" template is Debian's static busybox and the few
// files a shell needs; it is built from the host alone, without the network.
package rootfs

import (
	"bufio"
	"bytes"
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"strings"
)

// BusyboxPath is where Debian's busybox-static package installs busybox.
const BusyboxPath = "/bin/busybox"

// BuildBase builds the root filesystem of the built-in base template in dir.
// It builds in a temporary sibling directory and renames it into place, so
// dir is either absent or complete. When dir already exists BuildBase leaves
// it alone and returns nil: sandboxes may be running on it (it is their
// read-only lower layer), so replacing it under them is the caller's
// explicit decision (remove dir first).
func BuildBase(ctx context.Context, dir string) error {
	return buildBase(ctx, dir, BusyboxPath)
}

func buildBase(ctx context.Context, dir, busybox string) error {
	if _, err := os.Lstat(dir); err == nil {
		return nil
	} else if !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("rootfs: %w", err)
	}
	if err := checkBusybox(busybox); err != nil {
		return err
	}
	parent := filepath.Dir(dir)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	tmp, err := os.MkdirTemp(parent, "."+filepath.Base(dir)+".tmp-")
	if err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	defer os.RemoveAll(tmp) // a no-op once renamed
	if err := populate(ctx, tmp, busybox); err != nil {
		return fmt.Errorf("rootfs: build base in %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, dir); err != nil {
		if _, statErr := os.Lstat(dir); statErr == nil {
			return nil // a concurrent build won the race; its result is as good
		}
		return fmt.Errorf("rootfs: %w", err)
	}
	return nil
}

// checkBusybox returns an error unless the busybox at p is a statically
// linked ELF executable (no program interpreter): it has to run inside
// sandboxes that hold no shared libraries.
func checkBusybox(p string) error {
	f, err := elf.Open(p)
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("rootfs: %s is missing: install Debian's busybox-static package (apt-get install busybox-static)", p)
	}
	if err != nil {
		return fmt.Errorf("rootfs: %s is not an ELF executable: %w", p, err)
	}
	defer f.Close()
	for _, prog := range f.Progs {
		if prog.Type == elf.PT_INTERP {
			return fmt.Errorf("rootfs: %s is dynamically linked; install Debian's busybox-static package (apt-get install busybox-static), which replaces busybox", p)
		}
	}
	return nil
}

// dirs are created in order with their modes (umask does not apply).
var baseDirs = []struct {
	name string
	mode fs.FileMode
}{
	{".", 0o755},
	{"bin", 0o755}, {"sbin", 0o755}, {"usr", 0o755}, {"usr/bin", 0o755}, {"usr/sbin", 0o755},
	{"etc", 0o755}, {"root", 0o700}, {"home", 0o755}, {"mnt", 0o755}, {"run", 0o755},
	{"tmp", fs.ModeSticky | 0o777}, {"var", 0o755}, {"var/tmp", fs.ModeSticky | 0o777},
	{"proc", 0o555}, {"sys", 0o555}, {"dev", 0o755},
	// Mount point of the torpor init and its run directory.
	{".torpor", 0o755},
}

// The files of /etc. There is no /etc/hostname: the runtime sets the host
// name in the sandbox's UTS namespace.
var baseFiles = []struct {
	name, content string
}{
	{"etc/passwd", "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n"},
	{"etc/group", "root:x:0:\nnobody:x:65534:\n"},
	{"etc/hosts", "127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"},
	{"etc/shells", "/bin/sh\n/bin/ash\n"},
	{"etc/profile", "export PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n"},
}

func populate(ctx context.Context, root, busybox string) error {
	for _, d := range baseDirs {
		p := filepath.Join(root, d.name)
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
		if err := os.Chmod(p, d.mode); err != nil {
			return err
		}
	}
	for _, f := range baseFiles {
		if err := os.WriteFile(filepath.Join(root, f.name), []byte(f.content), 0o644); err != nil {
			return err
		}
	}
	if err := copyFile(busybox, filepath.Join(root, "bin/busybox"), 0o755); err != nil {
		return err
	}
	applets, err := listApplets(ctx, busybox)
	if err != nil {
		return err
	}
	have := map[string]bool{}
	for _, a := range applets {
		if err := linkApplet(root, a); err != nil {
			return err
		}
		have[path.Base(a)] = true
	}
	for _, s := range shims {
		if have[path.Base(s.name)] {
			continue
		}
		if err := os.WriteFile(filepath.Join(root, s.name), []byte(s.script), 0o755); err != nil {
			return err
		}
	}
	return nil
}

// shims stand in for common commands that Debian's busybox-static is built
// without; each is written only when busybox lacks the applet.
var shims = []struct {
	name, script string
}{
	{"usr/bin/nohup", `#!/bin/sh
# nohup: run a command immune to hangups (busybox-static has no nohup applet).
if [ $# -eq 0 ]; then
	echo "usage: nohup COMMAND [ARG]..." >&2
	exit 127
fi
if [ -t 1 ]; then
	exec >>nohup.out
fi
if [ -t 2 ]; then
	exec 2>&1
fi
trap '' HUP
exec "$@"
`},
}

// listApplets returns the applets' install paths relative to the root, e.g.
// "bin/sh", from `busybox --list-full` (or `--list`, then into bin/).
func listApplets(ctx context.Context, busybox string) ([]string, error) {
	out, err := exec.CommandContext(ctx, busybox, "--list-full").Output()
	prefix := ""
	if err != nil {
		if out, err = exec.CommandContext(ctx, busybox, "--list").Output(); err != nil {
			return nil, fmt.Errorf("list busybox applets: %w", err)
		}
		prefix = "bin/"
	}
	var applets []string
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		if a := strings.TrimSpace(sc.Text()); a != "" {
			applets = append(applets, prefix+a)
		}
	}
	if len(applets) == 0 {
		return nil, errors.New("busybox lists no applets")
	}
	return applets, nil
}

// linkApplet makes root/rel a symlink to /bin/busybox, skipping names that
// would leave the root or that already exist (busybox itself).
func linkApplet(root, rel string) error {
	clean := path.Clean("/" + rel)[1:]
	if clean == "" || clean != strings.TrimPrefix(rel, "/") || clean == "bin/busybox" {
		return nil
	}
	p := filepath.Join(root, clean)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		return err
	}
	if err := os.Symlink("/bin/busybox", p); err != nil && !errors.Is(err, fs.ErrExist) {
		return err
	}
	return nil
}

func copyFile(src, dst string, mode fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Chmod(mode); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
