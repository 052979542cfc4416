package rootfs

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

func needBusybox(t *testing.T) {
	t.Helper()
	if err := checkBusybox(BusyboxPath); err != nil {
		t.Skipf("needs busybox-static (apt-get install busybox-static): %v", err)
	}
}

func TestBuildBase(t *testing.T) {
	needBusybox(t)
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "templates", "base")
	if err := BuildBase(ctx, dir); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		name string
		mode os.FileMode
	}{
		{"tmp", os.ModeDir | os.ModeSticky | 0o777},
		{"root", os.ModeDir | 0o700},
		{"proc", os.ModeDir | 0o555},
		{".torpor", os.ModeDir | 0o755},
		{".", os.ModeDir | 0o755},
		{"bin/busybox", 0o755},
	} {
		fi, err := os.Lstat(filepath.Join(dir, c.name))
		if err != nil {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		if fi.Mode() != c.mode {
			t.Errorf("%s: mode %v, want %v", c.name, fi.Mode(), c.mode)
		}
	}
	if target, err := os.Readlink(filepath.Join(dir, "bin/sh")); err != nil || target != "/bin/busybox" {
		t.Errorf("bin/sh -> %q, %v; want /bin/busybox", target, err)
	}
	passwd, err := os.ReadFile(filepath.Join(dir, "etc/passwd"))
	if err != nil || !strings.HasPrefix(string(passwd), "root:x:0:0:") || !strings.Contains(string(passwd), "\nnobody:") {
		t.Errorf("etc/passwd = %q, %v", passwd, err)
	}
	if _, err := os.Lstat(filepath.Join(dir, "etc/hostname")); !os.IsNotExist(err) {
		t.Errorf("etc/hostname exists (%v); the runtime sets the host name", err)
	}
	leftovers, _ := filepath.Glob(filepath.Join(filepath.Dir(dir), ".base.tmp-*"))
	if len(leftovers) != 0 {
		t.Errorf("temporary build dirs left: %v", leftovers)
	}

	// The shell works from the tree (chroot is enough to prove the links).
	out, err := exec.Command("chroot", dir, "/bin/sh", "-c", "echo ok; ls /usr/bin/env >/dev/null && echo env; nohup echo nohup").CombinedOutput()
	if os.Geteuid() == 0 {
		if err != nil || string(out) != "ok\nenv\nnohup\n" {
			t.Errorf("chroot sh: %q, %v", out, err)
		}
	}

	// A second build of an existing dir leaves it alone.
	marker := filepath.Join(dir, "root/marker")
	if err := os.WriteFile(marker, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := BuildBase(ctx, dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(marker); err != nil {
		t.Errorf("existing base was rebuilt: %v", err)
	}
}

func TestBuildBaseNeedsStaticBusybox(t *testing.T) {
	ctx := context.Background()
	dir := filepath.Join(t.TempDir(), "base")
	err := buildBase(ctx, dir, filepath.Join(t.TempDir(), "busybox"))
	if err == nil || !strings.Contains(err.Error(), "busybox-static") {
		t.Fatalf("missing busybox: err = %v, want one naming busybox-static", err)
	}
	sh, lookErr := exec.LookPath("ls")
	if lookErr != nil {
		t.Skip("no dynamic executable to try")
	}
	if checkBusybox(sh) == nil {
		t.Skipf("%s is static", sh)
	}
	err = buildBase(ctx, dir, sh)
	if err == nil || !strings.Contains(err.Error(), "dynamically linked") {
		t.Fatalf("dynamic busybox: err = %v", err)
	}
	if _, statErr := os.Lstat(dir); !os.IsNotExist(statErr) {
		t.Errorf("failed build left %s", dir)
	}
}
