package runc

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/network"
	"github.com/torpor-dev/torpor/rootfs"
	"github.com/torpor-dev/torpor/runtime/runtimetest"
)

func needDisks(t *testing.T) {
	t.Helper()
	needHost(t)
	if _, why := diskSupport(); why != "" {
		t.Skipf("needs disks of a fixed size: %s", why)
	}
}

// allocated is the space the file at p takes on the host's disk.
func allocated(t *testing.T, p string) int64 {
	t.Helper()
	fi, err := os.Stat(p)
	if err != nil {
		t.Fatal(err)
	}
	return fi.Sys().(*syscall.Stat_t).Blocks * 512
}

// TestDiskMiBIsEnforced: a sandbox with disk_mib 64 that writes 100 MiB
// gets "No space left on device" and keeps running; its disk takes no more
// than 64 MiB of the host's, gives back what it deletes, keeps its files
// across a stop and a boot and under a new runtime over the same
// directory, and goes with Destroy.
func TestDiskMiBIsEnforced(t *testing.T) {
	needDisks(t)
	ctx := context.Background()
	r, base := newTestRuntime(t)
	ref := bootOne(t, r, base, func(s *torpor.BootSpec) { s.Resources.DiskMiB = 64 })
	id := ref.SandboxID
	image := r.diskImage(id)

	var out, errb strings.Builder
	res, err := r.Exec(ctx, ref, torpor.ExecRequest{
		Cmd:    []string{"dd", "if=/dev/zero", "of=/big", "bs=1M", "count=100"},
		Stdout: &out, Stderr: &errb, Timeout: time.Minute,
	})
	if err != nil {
		t.Fatal(err)
	}
	if res.ExitCode == 0 || !strings.Contains(errb.String(), "No space left on device") {
		t.Fatalf("dd of 100 MiB into 64: exit %d, %q", res.ExitCode, errb.String())
	}
	if got := execOut(t, r, ref, "echo", "ok"); got != "ok\n" {
		t.Fatalf("after the disk filled: %q", got)
	}
	if st, err := r.Inspect(ctx, ref); err != nil || st.State != torpor.InstanceRunning {
		t.Fatalf("after the disk filled: %+v %v", st, err)
	}
	if got := allocated(t, image); got > 64<<20 {
		t.Errorf("the 64 MiB disk takes %d MiB of the host's", got>>20)
	}
	u, err := r.ResourceUsage(ctx, ref)
	if err != nil || u.DiskBytes == nil || *u.DiskBytes < 40<<20 || *u.DiskBytes > 64<<20 {
		t.Errorf("usage of the full disk: %v %v", u.DiskBytes, err)
	}

	// What the sandbox deletes goes back to the host.
	execOut(t, r, ref, "sh", "-c", "rm /big && sync && echo kept > /kept")
	deadline := time.Now().Add(20 * time.Second)
	for allocated(t, image) > 32<<20 {
		if time.Now().After(deadline) {
			t.Fatalf("the disk still takes %d MiB of the host's after the file went", allocated(t, image)>>20)
		}
		time.Sleep(100 * time.Millisecond)
	}

	// Stopped (hibernated) and booted again: the files, and the limit, stay.
	if err := r.Stop(ctx, ref); err != nil {
		t.Fatal(err)
	}
	if mounted(r.diskMount(id)) {
		t.Fatal("the disk of a stopped sandbox is still mounted")
	}
	if st, err := r.Inspect(ctx, ref); err != nil || !st.DiskExists {
		t.Fatalf("stopped: %+v %v", st, err)
	}
	spec := torpor.BootSpec{SandboxID: id, Template: torpor.Template{Name: "base", RootFS: base}, Resources: torpor.Resources{DiskMiB: 64}}
	if ref.Handle, err = r.Boot(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if got := execOut(t, r, ref, "cat", "/kept"); got != "kept\n" {
		t.Fatalf("after a boot: %q", got)
	}
	df := strings.Fields(execOut(t, r, ref, "df", "-m", "/"))
	if total, _ := strconv.Atoi(df[len(df)-5]); total < 50 || total > 64 {
		t.Errorf("df after a boot: %q", df)
	}

	// A runtime over the same directory (a restarted daemon) adopts it.
	fresh, err := New(testConfigOf(r))
	if err != nil {
		t.Fatal(err)
	}
	if got := execOut(t, fresh, ref, "cat", "/kept"); got != "kept\n" {
		t.Fatalf("under a new runtime: %q", got)
	}
	if err := fresh.Destroy(ctx, ref); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(r.sandboxDir(id)); !os.IsNotExist(err) {
		t.Errorf("the sandbox's directory outlived Destroy: %v", err)
	}
	backing, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	for _, b := range backing {
		if p, _ := os.ReadFile(b); bytes.Contains(p, []byte(image)) {
			t.Errorf("%s still backs %s", image, b)
		}
	}
}

// TestDiskOfDirectoriesStaysOne: a sandbox whose disk is the directories
// of a runtime before disk images keeps them (and its files).
func TestDiskOfDirectoriesStaysOne(t *testing.T) {
	needDisks(t)
	r, base := newTestRuntime(t)
	id := torpor.NewID("rc_", 10)
	if err := os.MkdirAll(r.sandboxPath(id, "upper"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(r.sandboxPath(id, "upper/old"), []byte("old\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	ref := bootOne(t, r, base, func(s *torpor.BootSpec) { s.SandboxID = id; s.Resources.DiskMiB = 64 })
	if got := execOut(t, r, ref, "cat", "/old"); got != "old\n" {
		t.Fatalf("the old disk's file: %q", got)
	}
	if _, err := os.Lstat(r.diskImage(id)); !os.IsNotExist(err) {
		t.Errorf("an image was made for a disk of directories: %v", err)
	}
}

func TestCopySparseKeepsHoles(t *testing.T) {
	dir := t.TempDir()
	src, dst := filepath.Join(dir, "src"), filepath.Join(dir, "dst")
	f, err := os.Create(src)
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(64 << 20); err != nil {
		t.Fatal(err)
	}
	for _, off := range []int64{0, 10 << 20, 64<<20 - 4096} {
		if _, err := f.WriteAt(bytes.Repeat([]byte{byte(off>>20) + 1}, 4096), off); err != nil {
			t.Fatal(err)
		}
	}
	f.Close()
	if err := copySparse(src, dst); err != nil {
		t.Fatal(err)
	}
	a, _ := os.ReadFile(src)
	b, _ := os.ReadFile(dst)
	if !bytes.Equal(a, b) {
		t.Fatal("the copy differs")
	}
	if got := allocated(t, dst); got > 1<<20 {
		t.Errorf("the copy of 12 KiB of data takes %d KiB", got>>10)
	}
}

func TestBlankImagesArePruned(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	for i := 0; i < maxBlankImages+3; i++ {
		p := filepath.Join(dir, "ext4-"+string(rune('a'+i))+"m.img")
		if err := os.WriteFile(p, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		at := now.Add(time.Duration(i) * time.Minute)
		os.Chtimes(p, at, at)
	}
	keep := filepath.Join(dir, "ext4-am.img") // the oldest, but just made
	pruneBlankImages(dir, keep)
	left, _ := filepath.Glob(filepath.Join(dir, "*m.img"))
	if len(left) != maxBlankImages+1 {
		t.Fatalf("%d images left: %q", len(left), left)
	}
	for _, gone := range []string{"ext4-bm.img", "ext4-cm.img"} {
		if _, err := os.Stat(filepath.Join(dir, gone)); !os.IsNotExist(err) {
			t.Errorf("%s kept", gone)
		}
	}
	if _, err := os.Stat(keep); err != nil {
		t.Errorf("the image to keep went: %v", err)
	}
}

// BenchmarkBootDisk measures a boot to a running entrypoint, on the
// sandbox network, with a disk of directories (disk_mib 0: no limit) and
// with an image of the default 2 GiB (copied from the blank one and
// loop-mounted while the network namespace is made), alternating, so
// that both see the same load.
func BenchmarkBootDisk(b *testing.B) {
	needHost(b)
	if _, why := diskSupport(); why != "" {
		b.Skipf("needs disks of a fixed size: %s", why)
	}
	ctx := context.Background()
	n, err := network.New(ctx, runtimetest.Network(b, "tpb", 218))
	if err != nil {
		b.Fatal(err)
	}
	cfg := testConfig(b)
	cfg.Network = n
	r, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	base := filepath.Join(b.TempDir(), "base")
	if err := rootfs.BuildBase(ctx, base); err != nil {
		b.Fatal(err)
	}
	lat := map[int64][]time.Duration{}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		mib := int64(2048 * (i % 2))
		spec := torpor.BootSpec{
			SandboxID: torpor.NewID("rc_", 10),
			Template:  torpor.Template{Name: "base", RootFS: base},
			Resources: torpor.Resources{DiskMiB: mib},
		}
		start := time.Now()
		if _, err := r.Boot(ctx, spec); err != nil {
			b.Fatal(err)
		}
		lat[mib] = append(lat[mib], time.Since(start))
		b.StopTimer()
		if err := r.Destroy(ctx, torpor.InstanceRef{SandboxID: spec.SandboxID}); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
	for mib, name := range map[int64]string{0: "dirs", 2048: "image"} {
		l := lat[mib]
		if len(l) == 0 {
			continue
		}
		slices.Sort(l)
		b.ReportMetric(float64(l[len(l)/2].Microseconds())/1000, name+"-p50-ms")
		b.ReportMetric(float64(l[len(l)*99/100].Microseconds())/1000, name+"-p99-ms")
	}
}
