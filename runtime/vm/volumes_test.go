package vm

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/torpor-dev/torpor"
)

// testVolumes is a volume host of plain ext4 images for the tests: it
// hands out images and counts the takes.
type testVolumes struct {
	mu     sync.Mutex
	images map[string]string
	takes  int
}

func (v *testVolumes) TakeVolume(ctx context.Context, id string) (string, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	img, ok := v.images[id]
	if !ok {
		return "", torpor.Errorf(torpor.ENotFound, "no volume %s", id)
	}
	v.takes++
	return img, nil
}

func (v *testVolumes) SetVolumeHolder(func(string) (string, bool)) {}

// makeVolumeImage makes an ext4 image of 32 MiB whose data/ holds the
// file seed.txt.
func makeVolumeImage(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	src := filepath.Join(dir, "src")
	if err := os.MkdirAll(filepath.Join(src, "data"), 0o777); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(src, "data", "seed.txt"), []byte("seeded"), 0o644); err != nil {
		t.Fatal(err)
	}
	img := filepath.Join(dir, "volume.img")
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-d", src, img, "32M").CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	return img
}

// TestVolumes boots one VM with two volumes, one mounted twice: the
// volumes' data/ is at each path, written read-write and refused
// read-only (EROFS); the machine has one drive a volume; the sandbox
// holds its volumes while it runs and while its snapshot waits, and a
// restore keeps the drives and mounts; after the VM ends, what it wrote
// is in the image.
func TestVolumes(t *testing.T) {
	needHost(t)
	if _, err := exec.LookPath("debugfs"); err != nil {
		t.Skip("needs debugfs (e2fsprogs)")
	}
	cfg := testConfig(t)
	r := newRuntime(t, cfg)
	vols := &testVolumes{images: map[string]string{"vol_a": makeVolumeImage(t), "vol_b": makeVolumeImage(t)}}
	r.UseVolumeDevices(vols)
	ctx := testCtx(t)
	spec := torpor.BootSpec{SandboxID: torpor.NewID("rt_", 12), Template: baseTemplate(t),
		Resources: torpor.Resources{VCPUs: 1, MemoryMiB: 192},
		Volumes: []torpor.VolumeBind{
			{ID: "vol_a", SizeMiB: 32, Path: "/data"},
			{ID: "vol_b", SizeMiB: 32, Path: "/models", ReadOnly: true},
			{ID: "vol_a", SizeMiB: 32, Path: "/again", ReadOnly: true},
		}}
	h, err := r.Boot(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	ref := torpor.InstanceRef{SandboxID: spec.SandboxID, Handle: h}
	var m machine
	if ok, err := r.loadJSON(ref.SandboxID, "machine.json", &m); !ok || err != nil {
		t.Fatalf("machine.json: %v", err)
	}
	if len(m.Volumes) != 2 || m.Volumes[0].ID != "vol_a" || m.Volumes[0].ReadOnly || m.Volumes[1].ID != "vol_b" || !m.Volumes[1].ReadOnly {
		t.Fatalf("the machine's volumes: %+v", m.Volumes)
	}
	if out := sh(t, r, ref, "cat /data/seed.txt /models/seed.txt /again/seed.txt"); out != "seededseededseeded" {
		t.Fatalf("the seeded files: %q", out)
	}
	sh(t, r, ref, "echo from-the-vm > /data/out.txt && sync")
	if out := sh(t, r, ref, "cat /again/out.txt; (echo x > /models/w) 2>&1; (echo x > /again/w) 2>&1; true"); !strings.Contains(out, "from-the-vm") || strings.Count(out, "Read-only file system") != 2 {
		t.Fatalf("read-only mounts: %q", out)
	}
	for _, id := range []string{"vol_a", "vol_b"} {
		if sb, held := r.VolumeHolder(id); !held || sb != ref.SandboxID {
			t.Fatalf("holder of %s while running: %q %v", id, sb, held)
		}
	}
	if _, held := r.VolumeHolder("vol_c"); held {
		t.Fatal("a volume no machine has is held")
	}

	if _, err := r.Snapshot(ctx, ref); err != nil {
		t.Fatal(err)
	}
	if sb, held := r.VolumeHolder("vol_a"); !held || sb != ref.SandboxID {
		t.Fatalf("holder while paused: %q %v", sb, held)
	}
	takes := vols.takes
	if ref.Handle, err = r.Restore(ctx, ref); err != nil {
		t.Fatal(err)
	}
	if vols.takes != takes+2 {
		t.Fatalf("a restore took %d volumes, want 2", vols.takes-takes)
	}
	if out := sh(t, r, ref, "cat /data/out.txt; grep -c ' /models ' /proc/mounts"); out != "from-the-vm\n1\n" {
		t.Fatalf("after the restore: %q", out)
	}
	sh(t, r, ref, "echo after-restore >> /data/out.txt && sync")

	if err := r.Stop(ctx, ref); err != nil {
		t.Fatal(err)
	}
	if sb, held := r.VolumeHolder("vol_a"); held {
		t.Fatalf("holder after the stop: %q", sb)
	}
	out, err := exec.Command("debugfs", "-R", "cat /data/out.txt", vols.images["vol_a"]).Output()
	if err != nil || string(out) != "from-the-vm\nafter-restore\n" {
		t.Fatalf("the image after the VM: %q %v", out, err)
	}
}
