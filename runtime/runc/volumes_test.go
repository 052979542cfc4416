package runc

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

// execRes runs cmd in the instance and returns its exit code and output.
func execRes(t *testing.T, r *Runtime, ref torpor.InstanceRef, cmd ...string) (int, string) {
	t.Helper()
	var out strings.Builder
	res, err := r.Exec(context.Background(), ref, torpor.ExecRequest{Cmd: cmd, Stdout: &out, Stderr: &out, Timeout: time.Minute})
	if err != nil {
		t.Fatalf("exec %q: %v", cmd, err)
	}
	return res.ExitCode, out.String()
}

// TestVolumeSharedLimitedAndGrown: a volume seeded on the host is seen by
// two sandboxes that mount it (one read-only, which cannot write); what
// one writes the other reads; a write beyond its size fails with ENOSPC
// inside while the image takes no more than its size of the host's disk;
// it grows online, seen inside at once; it outlives the sandboxes and
// is removed whole.
func TestVolumeSharedLimitedAndGrown(t *testing.T) {
	needDisks(t)
	ctx := context.Background()
	r, base := newTestRuntime(t)
	id := torpor.NewID("vol_", 12)
	t.Cleanup(func() { _ = r.RemoveVolume(context.Background(), id) })
	if err := r.MakeVolume(ctx, id, 32); err != nil {
		t.Fatal(err)
	}
	if err := r.MakeVolume(ctx, id, 32); err != nil {
		t.Fatalf("MakeVolume again: %v", err)
	}
	root, err := r.VolumeDir(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(root, "seed.txt"), []byte("seeded"), 0o644); err != nil {
		t.Fatal(err)
	}
	rw := bootOne(t, r, base, func(s *torpor.BootSpec) {
		s.Volumes = []torpor.VolumeBind{{ID: id, SizeMiB: 32, Path: "/data"}}
	})
	ro := bootOne(t, r, base, func(s *torpor.BootSpec) {
		s.Volumes = []torpor.VolumeBind{{ID: id, SizeMiB: 32, Path: "/mnt/shared", ReadOnly: true}}
	})
	if code, out := execRes(t, r, ro, "cat", "/mnt/shared/seed.txt"); code != 0 || out != "seeded" {
		t.Fatalf("read-only sandbox reads the seed: %d %q", code, out)
	}
	if code, out := execRes(t, r, rw, "sh", "-c", "echo from-rw > /data/note"); code != 0 {
		t.Fatalf("write: %d %q", code, out)
	}
	if code, out := execRes(t, r, ro, "cat", "/mnt/shared/note"); code != 0 || out != "from-rw\n" {
		t.Fatalf("the other sandbox reads: %d %q", code, out)
	}
	if code, out := execRes(t, r, ro, "sh", "-c", "echo x > /mnt/shared/nope"); code == 0 || !strings.Contains(out, "Read-only") {
		t.Fatalf("a write through the read-only mount: %d %q, want refused", code, out)
	}
	code, out := execRes(t, r, rw, "dd", "if=/dev/zero", "of=/data/big", "bs=1M", "count=64")
	if code == 0 || !strings.Contains(out, "No space left on device") {
		t.Fatalf("64 MiB into 32: %d %q, want ENOSPC", code, out)
	}
	if got := allocated(t, r.volumeImage(id)); got > 33<<20 {
		t.Fatalf("the image takes %d bytes of the host's disk, more than its 32 MiB", got)
	}
	used, err := r.VolumeUsed(ctx, id)
	if err != nil || used < 16<<20 {
		t.Fatalf("VolumeUsed = %d, %v; want most of 32 MiB", used, err)
	}
	if err := r.GrowVolume(ctx, id, 16); !torpor.IsCode(err, torpor.EInvalid) {
		t.Fatalf("shrink = %v, want invalid_argument", err)
	}
	if err := r.GrowVolume(ctx, id, 128); torpor.IsCode(err, torpor.EConflict) {
		// This host grows only a volume no instance holds (no
		// CAP_SYS_RESOURCE): the read-only one goes, the other is
		// booted again after.
		t.Logf("grow while mounted: %v", err)
		for _, ref := range []torpor.InstanceRef{rw, ro} {
			if err := r.Stop(ctx, ref); err != nil {
				t.Fatal(err)
			}
		}
		if err := r.GrowVolume(ctx, id, 128); err != nil {
			t.Fatalf("grow with no instance: %v", err)
		}
		h, err := r.Boot(ctx, torpor.BootSpec{SandboxID: rw.SandboxID, Template: torpor.Template{Name: "base", RootFS: base},
			Resources: torpor.Resources{VCPUs: 1, MemoryMiB: 128}, Volumes: []torpor.VolumeBind{{ID: id, SizeMiB: 128, Path: "/data"}}})
		if err != nil {
			t.Fatal(err)
		}
		rw.Handle = h
	} else if err != nil {
		t.Fatalf("grow: %v", err)
	}
	if code, out := execRes(t, r, rw, "dd", "if=/dev/zero", "of=/data/big2", "bs=1M", "count=40"); code != 0 {
		t.Fatalf("40 MiB more after growing to 128: %d %q", code, out)
	}
	if code, out := execRes(t, r, rw, "cat", "/data/note"); code != 0 || out != "from-rw\n" {
		t.Fatalf("files after the grow: %d %q", code, out)
	}
	// The sandboxes go; the volume stays, then goes whole.
	for _, ref := range []torpor.InstanceRef{rw, ro} {
		if err := r.Destroy(ctx, ref); err != nil {
			t.Fatal(err)
		}
	}
	if b, err := os.ReadFile(filepath.Join(root, "note")); err != nil || string(b) != "from-rw\n" {
		t.Fatalf("after the sandboxes: %q, %v", b, err)
	}
	if err := r.RemoveVolume(ctx, id); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(r.volumeDir(id)); !os.IsNotExist(err) {
		t.Fatalf("volume dir after RemoveVolume: %v", err)
	}
	if _, err := r.VolumeDir(ctx, id); !torpor.IsCode(err, torpor.ENotFound) {
		t.Fatalf("VolumeDir after RemoveVolume = %v, want not_found", err)
	}
}
