package vm

import (
	"errors"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/torpor-dev/torpor"
)

// TestDiskSize: a VM's disk is the size its resources ask for (the
// configured default when they say 0), and its root file system fills
// it; a larger size at a later boot grows disk and file system, keeping
// the files; a size the template's files do not fit in is refused.
func TestDiskSize(t *testing.T) {
	needHost(t)
	cfg := testConfig(t)
	r := newRuntime(t, cfg)
	tmpl := baseTemplate(t)
	ctx := testCtx(t)

	small := torpor.BootSpec{SandboxID: torpor.NewID("rt_", 12), Template: tmpl, Resources: torpor.Resources{DiskMiB: 1}}
	_, err := r.Boot(ctx, small)
	var te *torpor.Error
	if !errors.As(err, &te) || te.Code != torpor.EInvalid || te.Param != "resources.disk_mib" {
		t.Fatalf("boot on a 1 MiB disk: %v", err)
	}

	// The default size, without booting.
	def := torpor.NewID("rt_", 12)
	if err := os.MkdirAll(r.sandboxDir(def), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := r.ensureDisk(ctx, def, tmpl, 0); err != nil {
		t.Fatal(err)
	}
	if got, err := qcow2Size(r.diskPath(def)); err != nil || got != cfg.DiskMiB<<20 {
		t.Fatalf("default disk: %d bytes (%v), want %d MiB", got, err, cfg.DiskMiB)
	}

	spec := torpor.BootSpec{SandboxID: torpor.NewID("rt_", 12), Template: tmpl,
		Resources: torpor.Resources{VCPUs: 1, MemoryMiB: 192, DiskMiB: 512}}
	h, err := r.Boot(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	ref := torpor.InstanceRef{SandboxID: spec.SandboxID, Handle: h}
	checkDF(t, r, ref, 512)
	sh(t, r, ref, "echo kept > /kept && sync")

	if err := r.Stop(ctx, ref); err != nil {
		t.Fatal(err)
	}
	spec.Resources.DiskMiB = 1024
	if ref.Handle, err = r.Boot(ctx, spec); err != nil {
		t.Fatal(err)
	}
	checkDF(t, r, ref, 1024)
	if out := sh(t, r, ref, "cat /kept"); out != "kept\n" {
		t.Fatalf("a file after the disk grew: %q", out)
	}
}

// checkDF checks that the guest's root file system is about mib MiB:
// no more, and less only by the file system's own blocks (inode tables,
// journal).
func checkDF(t *testing.T, r *Runtime, ref torpor.InstanceRef, mib int64) {
	t.Helper()
	out := sh(t, r, ref, "df -k / | tail -n 1")
	f := strings.Fields(out)
	if len(f) < 2 {
		t.Fatalf("df: %q", out)
	}
	t.Logf("df -k /: %s", strings.TrimSpace(out))
	kib, err := strconv.ParseInt(f[1], 10, 64)
	if err != nil || kib > mib<<10 || kib < mib<<10*9/10 {
		t.Fatalf("df says the root has %s KiB, want about %d MiB: %q", f[1], mib, out)
	}
}
