package vm

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"testing"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/runtime/diskarchive"
)

// qemuInfo is what qemu-img says of an image.
func qemuInfo(t *testing.T, p string) (format, backing string, size int64) {
	t.Helper()
	out, err := exec.Command("qemu-img", "info", "--output=json", p).Output()
	if err != nil {
		t.Fatalf("qemu-img info %s: %v", p, err)
	}
	var info struct {
		Format  string `json:"format"`
		Backing string `json:"backing-filename"`
		Size    int64  `json:"virtual-size"`
	}
	if err := json.Unmarshal(out, &info); err != nil {
		t.Fatal(err)
	}
	return info.Format, info.Backing, info.Size
}

// TestImportedDiskStandsAlone: an imported disk is a qcow2 image of the
// exported disk's size with no backing file (the template's image is the
// exporting node's own), and a stream whose image is itself a qcow2
// image naming a host file as its backing file is taken as raw bytes:
// nothing in a stream makes QEMU open a host file.
func TestImportedDiskStandsAlone(t *testing.T) {
	needHost(t)
	ctx := context.Background()
	r := newRuntime(t, testConfig(t))
	tmpl := baseTemplate(t)
	id := torpor.NewID("vm_", 10)
	ref := torpor.InstanceRef{SandboxID: id}
	t.Cleanup(func() { _ = r.Destroy(context.Background(), ref) })
	if err := os.MkdirAll(r.sandboxDir(id), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := r.ensureDisk(ctx, id, tmpl, 96); err != nil {
		t.Fatal(err)
	}
	var stream bytes.Buffer
	if _, err := r.ExportDisk(ctx, ref, &stream); err != nil {
		t.Fatal(err)
	}
	other := newRuntime(t, testConfig(t))
	if err := other.ImportDisk(ctx, id, bytes.NewReader(stream.Bytes())); err != nil {
		t.Fatal(err)
	}
	format, backing, size := qemuInfo(t, other.diskPath(id))
	if format != "qcow2" || backing != "" || size != 96<<20 {
		t.Errorf("imported disk: format %q, backing %q, size %d; want qcow2, none, %d", format, backing, size, 96<<20)
	}

	hostile := filepath.Join(t.TempDir(), "hostile.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", "/etc/hostname", hostile, "64M").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img create: %v: %s", err, out)
	}
	var hs bytes.Buffer
	if _, err := diskarchive.WriteImage(ctx, &hs, hostile); err != nil {
		t.Fatal(err)
	}
	if err := other.ImportDisk(ctx, id, &hs); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(hostile)
	if err != nil {
		t.Fatal(err)
	}
	// Its bytes, raw, in whole sectors.
	want := (fi.Size() + 511) &^ 511
	if format, backing, size := qemuInfo(t, other.diskPath(id)); format != "qcow2" || backing != "" || size != want {
		t.Errorf("disk imported from a qcow2 image: format %q, backing %q, size %d; want qcow2, none, %d", format, backing, size, want)
	}
}
