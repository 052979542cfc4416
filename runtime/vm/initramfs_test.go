package vm

import (
	"bytes"
	"compress/gzip"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The guest's modules come with their dependencies, each after what it
// needs.
func TestModuleOrder(t *testing.T) {
	dir := filepath.Join(kernelDir(), "modules")
	if _, err := os.Stat(dir); err != nil {
		t.Skipf("needs the guest kernel's modules in %s (scripts/test.sh fetches them)", dir)
	}
	mods, err := moduleOrder(dir, guestModules)
	if err != nil {
		t.Fatal(err)
	}
	pos := map[string]int{}
	for i, m := range mods {
		pos[strings.TrimSuffix(filepath.Base(m), ".ko")] = i
	}
	for _, m := range append([]string{"virtio", "virtio_ring"}, guestModules...) {
		if _, ok := pos[m]; !ok {
			t.Errorf("%s missing from %v", m, mods)
		}
	}
	if pos["virtio_ring"] > pos["virtio_mmio"] || pos["virtio"] > pos["virtio_console"] {
		t.Errorf("dependencies after their users: %v", mods)
	}
	if _, err := moduleOrder(dir, []string{"no_such_module"}); err == nil {
		t.Error("a missing module was not reported")
	}
}

// The cpio writer's output is the newc format the kernel unpacks: a
// header per entry, names and data padded to 4 bytes, a trailer.
func TestCpioNewc(t *testing.T) {
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	cw := &cpioWriter{w: zw}
	cw.add("bin", 0o040755, 0, nil)
	cw.add("init", 0o100755, 0, []byte("hello"))
	cw.add("TRAILER!!!", 0, 0, nil)
	zw.Close()
	zr, err := gzip.NewReader(&buf)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(zr)
	if len(b)%4 != 0 || !bytes.HasPrefix(b, []byte("070701")) {
		t.Fatalf("not newc: %q", b[:min(len(b), 16)])
	}
	i := bytes.Index(b, []byte("init\x00"))
	if i < 110 || !bytes.Contains(b[i:], []byte("hello")) || !bytes.Contains(b, []byte("TRAILER!!!\x00")) {
		t.Errorf("entries not found in %q", b)
	}
	// The data of "init" starts 4-aligned after its name.
	if j := bytes.Index(b, []byte("hello")); j%4 != 0 {
		t.Errorf("data at offset %d, not 4-aligned", j)
	}
}
