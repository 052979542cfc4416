package runc

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

func needMount(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (mounts overlayfs)")
	}
	if err := checkOverlay(); err != nil {
		t.Skipf("needs overlayfs: %v", err)
	}
}

// mountTest mounts lowers at a fresh target and unmounts it at the end.
func mountTest(t *testing.T, lowers []string, mount func(lowers []string, upper, work, target string) error) string {
	t.Helper()
	base := t.TempDir()
	upper, work, target := filepath.Join(base, "upper"), filepath.Join(base, "work"), filepath.Join(base, "root")
	for _, d := range []string{upper, work, target} {
		os.Mkdir(d, 0o755)
	}
	if err := mount(lowers, upper, work, target); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unmountAll(target) })
	return target
}

// Layers stack in order, and overlayfs honours the whiteouts and opaque
// directories that the template importer writes.
func TestMountLayersHonoursWhiteouts(t *testing.T) {
	needMount(t)
	dir := t.TempDir()
	bottom, top := filepath.Join(dir, "bottom"), filepath.Join(dir, "top")
	for _, p := range []string{"bottom/etc", "bottom/data", "top/etc", "top/data"} {
		os.MkdirAll(filepath.Join(dir, p), 0o755)
	}
	os.WriteFile(filepath.Join(bottom, "etc/secret"), []byte("s"), 0o644)
	os.WriteFile(filepath.Join(bottom, "etc/keep"), []byte("k"), 0o644)
	os.WriteFile(filepath.Join(bottom, "data/old"), []byte("o"), 0o644)
	os.WriteFile(filepath.Join(top, "data/new"), []byte("n"), 0o644)
	if err := unix.Mknod(filepath.Join(top, "etc/secret"), unix.S_IFCHR, 0); err != nil {
		t.Fatal(err)
	}
	if err := unix.Setxattr(filepath.Join(top, "data"), "trusted.overlay.opaque", []byte("y"), 0); err != nil {
		t.Fatal(err)
	}
	root := mountTest(t, []string{bottom, top}, func(l []string, u, w, tg string) error {
		return mountLayers(l, u, w, tg, filepath.Join(dir, "l"))
	})
	if _, err := os.Stat(filepath.Join(root, "etc/secret")); err == nil {
		t.Error("the whited-out file is visible")
	}
	if _, err := os.Stat(filepath.Join(root, "etc/keep")); err != nil {
		t.Error(err)
	}
	entries, _ := os.ReadDir(filepath.Join(root, "data"))
	if len(entries) != 1 || entries[0].Name() != "new" {
		t.Errorf("opaque dir shows %v, want [new]", entries)
	}
}

// manyLayers makes n layers with long paths; layer i holds file i.
func manyLayers(t *testing.T, n int) []string {
	dir := filepath.Join(t.TempDir(), strings.Repeat("long-directory-name-", 4))
	var out []string
	for i := 0; i < n; i++ {
		l := filepath.Join(dir, fmt.Sprintf("sha256-%064d", i), "fs")
		os.MkdirAll(l, 0o755)
		os.WriteFile(filepath.Join(l, fmt.Sprintf("f%d", i)), nil, 0o644)
		out = append(out, l)
	}
	return out
}

func checkAllLayers(t *testing.T, root string, n int) {
	t.Helper()
	for i := 0; i < n; i++ {
		if _, err := os.Stat(filepath.Join(root, fmt.Sprintf("f%d", i))); err != nil {
			t.Errorf("layer %d is not in the mount: %v", i, err)
		}
	}
}

// A list of layers longer than mount(2)'s page of options still mounts.
func TestMountLayersLongList(t *testing.T) {
	needMount(t)
	lowers := manyLayers(t, 60)
	if len(lowerOption(lowers)) <= maxMountData {
		t.Fatalf("the test's layer list (%d bytes) fits in one page", len(lowerOption(lowers)))
	}
	linkDir := filepath.Join(t.TempDir(), "l")
	root := mountTest(t, lowers, func(l []string, u, w, tg string) error { return mountLayers(l, u, w, tg, linkDir) })
	checkAllLayers(t, root, 60)
}

// The new mount API path, used when even short links do not fit.
func TestMountOverlayFD(t *testing.T) {
	needMount(t)
	lowers := manyLayers(t, 5)
	base := t.TempDir()
	upper, work, target := filepath.Join(base, "upper"), filepath.Join(base, "work"), filepath.Join(base, "root")
	for _, d := range []string{upper, work, target} {
		os.Mkdir(d, 0o755)
	}
	if err := mountOverlayFD(lowers, upper, work, target); err != nil {
		t.Skipf("the kernel has no lowerdir+ (Linux 6.8): %v", err)
	}
	t.Cleanup(func() { unmountAll(target) })
	checkAllLayers(t, target, 5)
}
