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

// waitSpare waits until the runtime has a spare disk of sizeMiB ready.
func waitSpare(t *testing.T, r *Runtime, sizeMiB int64) spareDisk {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		r.spares.mu.Lock()
		s, ok := r.spares.ready[sizeMiB]
		off := r.spares.off
		r.spares.mu.Unlock()
		if ok {
			return s
		}
		if off {
			t.Skip("the host cannot make detached mounts (fsmount(2))")
		}
		if time.Now().After(deadline) {
			t.Fatalf("no spare disk of %d MiB", sizeMiB)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestSpareDiskTakenByTheNextBoot: after a boot with a disk, the runtime
// makes a spare of its size, which the next new sandbox of that size takes
// (its image moves into the sandbox's directory, mounted, with the limit);
// the sandbox writes, stops, boots again and is destroyed as any other.
// A spare left by a process that is gone is removed by New.
func TestSpareDiskTakenByTheNextBoot(t *testing.T) {
	needDisks(t)
	ctx := context.Background()
	r, base := newTestRuntime(t)
	bootOne(t, r, base, func(s *torpor.BootSpec) { s.Resources.DiskMiB = 64 })
	spare := waitSpare(t, r, 64)

	ref := bootOne(t, r, base, func(s *torpor.BootSpec) { s.Resources.DiskMiB = 64 })
	id := ref.SandboxID
	if _, err := os.Stat(spare.image); !os.IsNotExist(err) {
		t.Fatalf("the spare's image %s is still there: %v", spare.image, err)
	}
	if !mounted(r.diskMount(id)) {
		t.Fatal("the disk made of a spare is not mounted")
	}
	execOut(t, r, ref, "sh", "-c", "echo kept > /kept")
	if got := execOut(t, r, ref, "sh", "-c", "dd if=/dev/zero of=/big bs=1M count=100 2>&1; echo"); !strings.Contains(got, "No space left on device") {
		t.Fatalf("100 MiB into a 64 MiB disk made of a spare: %q", got)
	}
	if err := r.Stop(ctx, ref); err != nil {
		t.Fatal(err)
	}
	spec := torpor.BootSpec{SandboxID: id, Template: torpor.Template{Name: "base", RootFS: base}, Resources: torpor.Resources{DiskMiB: 64}}
	var err error
	if ref.Handle, err = r.Boot(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if got := execOut(t, r, ref, "cat", "/kept"); got != "kept\n" {
		t.Fatalf("after a boot: %q", got)
	}
	image := r.diskImage(id)
	if err := r.Destroy(ctx, ref); err != nil {
		t.Fatal(err)
	}
	backing, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, b := range backing {
		if p, _ := os.ReadFile(b); strings.TrimSpace(string(p)) == image {
			t.Errorf("%s still backs %s", image, b)
		}
	}

	// A spare whose process is gone (pid 2^22 + 1 is above pid_max).
	stale := filepath.Join(r.dir, "disks", sparePrefix+"4194305.1.img")
	if err := os.WriteFile(stale, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := New(testConfigOf(r)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(stale); !os.IsNotExist(err) {
		t.Errorf("a stale spare outlived New: %v", err)
	}
	if s := waitSpare(t, r, 64); s.image == "" {
		t.Fatal("no spare")
	} else if _, err := os.Stat(s.image); err != nil {
		t.Errorf("New removed the spare of a live runtime: %v", err)
	}
}
