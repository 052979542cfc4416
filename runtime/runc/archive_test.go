package runc

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/runtime/diskarchive"
)

// moveDisk exports the disk of the stopped sandbox ref from r and imports
// it into a new runtime over another directory, which it returns.
func moveDisk(t *testing.T, r *Runtime, ref torpor.InstanceRef) (*Runtime, []byte) {
	t.Helper()
	ctx := context.Background()
	var stream bytes.Buffer
	if _, err := r.ExportDisk(ctx, ref, &stream); err != nil {
		t.Fatalf("ExportDisk: %v", err)
	}
	other, err := New(testConfig(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := other.ImportDisk(ctx, ref.SandboxID, bytes.NewReader(stream.Bytes())); err != nil {
		t.Fatalf("ImportDisk: %v", err)
	}
	return other, stream.Bytes()
}

func streamKind(t *testing.T, stream []byte) diskarchive.Kind {
	t.Helper()
	rd, err := diskarchive.NewReader(bytes.NewReader(stream))
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	return rd.Kind
}

// TestDiskImageMovesSparse: a disk image travels as the data it holds
// (not its disk_mib), and is made again as prepareDisk makes one: a
// sparse file of its size, mode 0600, the daemon's. The other runtime
// boots the sandbox with its files; a refused import leaves a sandbox the
// disk it had; an import into a running sandbox is a conflict.
func TestDiskImageMovesSparse(t *testing.T) {
	needDisks(t)
	ctx := context.Background()
	r, base := newTestRuntime(t)
	if r.mkfs == "" {
		t.Skip("the host cannot mount disk images")
	}
	spec := func(s *torpor.BootSpec) { s.Resources.DiskMiB = 512 }
	ref := bootOne(t, r, base, spec)
	sum := execOut(t, r, ref, "sh", "-c", "dd if=/dev/urandom of=/root/data bs=1M count=3 2>/dev/null && md5sum /root/data")
	if err := r.Stop(ctx, ref); err != nil {
		t.Fatal(err)
	}
	other, stream := moveDisk(t, r, ref)
	if k := streamKind(t, stream); k != diskarchive.Image {
		t.Fatalf("the stream holds a %s, want an image", k)
	}
	if len(stream) > 16<<20 {
		t.Errorf("the stream of a 512 MiB disk holding 3 MiB is %d bytes", len(stream))
	}
	image := other.diskImage(ref.SandboxID)
	fi, err := os.Stat(image)
	if err != nil {
		t.Fatal(err)
	}
	st := fi.Sys().(*syscall.Stat_t)
	if fi.Size() != 512<<20 || fi.Mode().Perm() != 0o600 || st.Uid != uint32(os.Geteuid()) {
		t.Errorf("imported image: size %d, mode %v, owner %d; want 512 MiB, 0600, %d", fi.Size(), fi.Mode().Perm(), st.Uid, os.Geteuid())
	}
	if a, b := allocated(t, image), allocated(t, r.diskImage(ref.SandboxID)); a > b+(1<<20) {
		t.Errorf("the imported image takes %d bytes, the original %d", a, b)
	}
	ref2 := bootOne(t, other, base, func(s *torpor.BootSpec) { spec(s); s.SandboxID = ref.SandboxID })
	if got := execOut(t, other, ref2, "md5sum", "/root/data"); got != sum {
		t.Errorf("md5sum on the imported disk: %q, want %q", got, sum)
	}
	if err := other.ImportDisk(ctx, ref.SandboxID, bytes.NewReader(stream)); !torpor.IsCode(err, torpor.EConflict) {
		t.Errorf("ImportDisk into a running sandbox: err = %v, want a conflict", err)
	}

	// A refused stream leaves the disk the sandbox had.
	if err := other.Stop(ctx, ref2); err != nil {
		t.Fatal(err)
	}
	if err := other.ImportDisk(ctx, ref.SandboxID, bytes.NewReader(stream[:len(stream)-100])); err == nil {
		t.Fatal("ImportDisk of a cut stream succeeded")
	}
	ref2 = bootOne(t, other, base, func(s *torpor.BootSpec) { spec(s); s.SandboxID = ref.SandboxID })
	if got := execOut(t, other, ref2, "md5sum", "/root/data"); got != sum {
		t.Errorf("md5sum after a refused import: %q, want %q", got, sum)
	}
	if es, _ := filepath.Glob(filepath.Join(other.sandboxDir(ref.SandboxID), "*.import")); len(es) != 0 {
		t.Errorf("a refused import left %v", es)
	}
}

// TestDiskOfDirectoriesMoves: a disk of directories travels as its upper
// directory's tree and comes back as one (no image), with the template's
// files the sandbox deleted still deleted.
func TestDiskOfDirectoriesMoves(t *testing.T) {
	needHost(t)
	ctx := context.Background()
	r, base := newTestRuntime(t)
	ref := bootOne(t, r, base, nil)
	execOut(t, r, ref, "sh", "-c", "echo moved > /etc/moved && rm /etc/shells && mkdir -p /srv/a/b && chmod 700 /srv/a")
	if err := r.Stop(ctx, ref); err != nil {
		t.Fatal(err)
	}
	other, stream := moveDisk(t, r, ref)
	if k := streamKind(t, stream); k != diskarchive.Dir {
		t.Fatalf("the stream holds a %s, want a tree", k)
	}
	if _, err := os.Stat(other.diskImage(ref.SandboxID)); err == nil {
		t.Error("the imported disk of directories is an image")
	}
	ref2 := bootOne(t, other, base, func(s *torpor.BootSpec) { s.SandboxID = ref.SandboxID })
	got := execOut(t, other, ref2, "sh", "-c", "cat /etc/moved; test -e /etc/shells || echo gone; stat -c %a /srv/a; ls /srv/a")
	if want := "moved\ngone\n700\nb\n"; got != want {
		t.Errorf("files on the imported disk: %q, want %q", got, want)
	}
}

// TestExportDiskHeldInAnotherMountNamespace: a process that copied the
// host's mounts while the sandbox ran (unshare -m) keeps its disk's file
// system alive after Stop, with what the sandbox wrote last perhaps not yet
// in the image; the export still carries all of it.
func TestExportDiskHeldInAnotherMountNamespace(t *testing.T) {
	needDisks(t)
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Skip("needs unshare (util-linux)")
	}
	ctx := context.Background()
	r, base := newTestRuntime(t)
	if r.mkfs == "" {
		t.Skip("the host cannot mount disk images")
	}
	spec := func(s *torpor.BootSpec) { s.Resources.DiskMiB = 128 }
	ref := bootOne(t, r, base, spec)
	holder := exec.Command(unshare, "--mount", "--propagation", "private", "sleep", "600")
	if err := holder.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { holder.Process.Kill(); holder.Wait() })
	// Written after the copy, and not synced: in the file system's cache.
	sum := execOut(t, r, ref, "sh", "-c", "dd if=/dev/urandom of=/root/late bs=1M count=2 2>/dev/null && md5sum /root/late")
	if err := r.Stop(ctx, ref); err != nil {
		t.Fatal(err)
	}
	dev, err := boundLoop(r.diskImage(ref.SandboxID))
	if err != nil {
		t.Fatal(err)
	}
	if dev == nil {
		t.Fatal("the disk's file system did not outlive Stop in the other namespace: the test proves nothing")
	}
	dev.Close()
	other, _ := moveDisk(t, r, ref)
	ref2 := bootOne(t, other, base, func(s *torpor.BootSpec) { spec(s); s.SandboxID = ref.SandboxID })
	if got := execOut(t, other, ref2, "sh", "-c", "md5sum /root/late"); got != sum {
		t.Errorf("md5sum on the imported disk: %q, want %q", got, sum)
	}
}
