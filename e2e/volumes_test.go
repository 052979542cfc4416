package e2e

import (
	"context"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/client"
)

// TestVolumes: a tenant's volume, made with the CLI and seeded through
// its files route (the Go client's files calls on client.Volume), is
// mounted by two real runc sandboxes at once, one read-only: what one
// writes the other reads, and the read-only one cannot write. Its files
// stay across pause, hibernate, start, restart and two daemon restarts
// (the second after its mount on the host was taken away, as a reboot
// does); a write beyond its size is ENOSPC inside while its image takes
// no more than its size of the host's disk; it grows; its delete is
// refused while a sandbox mounts it and done after; results are read
// back without a sandbox; another tenant sees none of it.
func TestVolumes(t *testing.T) {
	needs(t)
	ctx := context.Background()
	bin := torporBin(t)
	dataDir := t.TempDir()
	// A test that fails before its volume is deleted leaves it mounted:
	// unmounted after the daemon's shutdown (cleanups run last first), so
	// that the data dir can be removed.
	t.Cleanup(func() {
		mnts, _ := filepath.Glob(filepath.Join(dataDir, "*", "volumes", "*", "mnt"))
		more, _ := filepath.Glob(filepath.Join(dataDir, "volumes", "*", "mnt"))
		for _, m := range append(mnts, more...) {
			_ = syscall.Unmount(m, syscall.MNT_DETACH)
		}
	})
	d := startDaemon(t, bin, dataDir)
	acme := strings.TrimSpace(d.ok("keys", "create", "--tenant", "acme"))
	bravo := strings.TrimSpace(d.ok("keys", "create", "--tenant", "bravo"))
	as := func(d *daemon, key string, args ...string) string {
		t.Helper()
		out, errs, code := d.cliIn(key, "", args...)
		if code != 0 {
			t.Fatalf("torpor %s: exit %d\n%s%s\ndaemon log:\n%s", strings.Join(args, " "), code, out, errs, d.logs.String())
		}
		return out
	}
	refused := func(d *daemon, key, want string, args ...string) {
		t.Helper()
		out, errs, code := d.cliIn(key, "", args...)
		if code == 0 || !strings.Contains(errs, want) {
			t.Fatalf("torpor %s: exit %d, %q%q; want a refusal saying %q", strings.Join(args, " "), code, out, errs, want)
		}
	}
	inside := func(d *daemon, id string, cmd ...string) (string, int) {
		t.Helper()
		out, errs, code := d.cliIn(acme, "", append([]string{"exec", id, "--"}, cmd...)...)
		return strings.TrimSpace(out + errs), code
	}
	mustInside := func(d *daemon, id string, cmd ...string) string {
		t.Helper()
		out, code := inside(d, id, cmd...)
		if code != 0 {
			t.Fatalf("exec %v: exit %d: %s", cmd, code, out)
		}
		return out
	}
	clientOf := func(d *daemon, key string) *client.Client {
		cl, err := client.New("http://"+d.addr, key)
		if err != nil {
			t.Fatal(err)
		}
		return cl
	}

	if out := as(d, acme, "volumes", "create", "data", "64"); !strings.Contains(out, "data 64 MiB") {
		t.Fatalf("volumes create printed %q", out)
	}
	cl := clientOf(d, acme)
	if _, err := cl.WriteFile(ctx, client.Volume("data"), "/in/seed.txt", strings.NewReader("seeded"), nil); err != nil {
		t.Fatal(err)
	}
	a := strings.TrimSpace(as(d, acme, "create", "--volume", "data:/data"))
	b := strings.TrimSpace(as(d, acme, "create", "--volume", "data:/mnt/shared:ro"))
	if got := mustInside(d, a, "cat", "/data/in/seed.txt"); got != "seeded" {
		t.Fatalf("the seed inside = %q", got)
	}
	mustInside(d, a, "sh", "-c", "echo from-a > /data/result.txt")
	if got := mustInside(d, b, "cat", "/mnt/shared/result.txt"); got != "from-a" {
		t.Fatalf("the other sandbox reads %q", got)
	}
	if out, code := inside(d, b, "sh", "-c", "echo x > /mnt/shared/nope"); code == 0 || !strings.Contains(out, "Read-only") {
		t.Fatalf("a write through the read-only mount: %d %q", code, out)
	}
	// The sandbox's files API does not reach its volumes (it would write
	// under the mount point): it names the volume's own route.
	if _, err := cl.WriteFile(ctx, b, "/mnt/shared/nope", strings.NewReader("x"), nil); !torpor.IsCode(err, torpor.EInvalid) || !strings.Contains(err.Error(), "/v1/volumes/data/files") {
		t.Fatalf("a sandbox files write onto its volume: %v, want invalid_argument naming the volume's route", err)
	}
	if _, err := cl.ReadFile(ctx, a, "/data/result.txt"); !torpor.IsCode(err, torpor.EInvalid) {
		t.Fatalf("a sandbox files read on its volume: %v, want invalid_argument", err)
	}

	// The verbs keep its files; each boot mounts it again.
	check := func(d *daemon, when string) {
		t.Helper()
		if got := mustInside(d, a, "cat", "/data/result.txt"); got != "from-a" {
			t.Fatalf("%s: /data/result.txt = %q", when, got)
		}
	}
	as(d, acme, "pause", a)
	as(d, acme, "start", a)
	check(d, "after a pause")
	as(d, acme, "hibernate", a)
	as(d, acme, "start", a)
	check(d, "after hibernate and start")
	as(d, acme, "restart", a)
	check(d, "after a restart")

	// A daemon restart with the sandboxes running.
	d.stop()
	d = startDaemon(t, bin, dataDir)
	check(d, "after a daemon restart")
	// Then with both hibernated: the daemon that stops with no sandbox
	// running takes the volume's mount from the host (as a reboot would),
	// and the next start mounts it again.
	as(d, acme, "hibernate", a)
	as(d, acme, "hibernate", b)
	images, _ := filepath.Glob(filepath.Join(dataDir, "*", "volumes", "*", "volume.img"))
	if more, _ := filepath.Glob(filepath.Join(dataDir, "volumes", "*", "volume.img")); len(more) > 0 {
		images = append(images, more...)
	}
	if len(images) != 1 {
		t.Fatalf("volume images in the data dir: %v", images)
	}
	d.stop()
	mnt := filepath.Join(filepath.Dir(images[0]), "mnt")
	if err := syscall.Unmount(mnt, 0); err == nil {
		t.Fatalf("the daemon stopped with no sandbox running and left the volume mounted at %s", mnt)
	}
	d = startDaemon(t, bin, dataDir)
	if st, err := os.Stat(filepath.Join(mnt, "data", "result.txt")); err != nil || st.Size() != int64(len("from-a\n")) {
		t.Fatalf("the daemon did not mount the volume again at its start: %v", err)
	}
	as(d, acme, "start", a)
	as(d, acme, "start", b)
	check(d, "after a daemon restart with the volume unmounted")
	cl = clientOf(d, acme)
	var v *torpor.Volume

	// Full at its size, inside; the host's disk spends no more.
	if out, code := inside(d, a, "dd", "if=/dev/zero", "of=/data/big", "bs=1M", "count=100"); code == 0 || !strings.Contains(out, "No space left on device") {
		t.Fatalf("100 MiB into a 64 MiB volume: exit %d %q", code, out)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(images[0], &st); err != nil {
		t.Fatal(err)
	}
	if used := st.Blocks * 512; used > 65<<20 {
		t.Fatalf("the 64 MiB volume takes %d bytes of the host's disk", used)
	}
	// Through the files route too: a 409 that says no_space.
	_, err := cl.WriteFile(ctx, client.Volume("data"), "/big2", io.LimitReader(zeroReader{}, 80<<20), nil)
	if te := torpor.AsError(err); te == nil || te.Code != torpor.EConflict || te.Reason != "no_space" {
		t.Fatalf("80 MiB more through the files route: %v, want a conflict with reason no_space", err)
	}
	mustInside(d, a, "rm", "-f", "/data/big", "/data/big2")

	// Inspect: size, used, who mounts it.
	v, err = cl.GetVolume(ctx, "data")
	if err != nil || v.SizeMiB != 64 || v.UsedBytes == nil || len(v.MountedBy) != 2 {
		t.Fatalf("GetVolume = %+v, %v; want 64 MiB, used, mounted by %s and %s", v, err, a, b)
	}
	// Grow it (where the host cannot grow a mounted file system, with
	// the sandboxes hibernated).
	if _, err := cl.ResizeVolume(ctx, "data", 128); torpor.IsCode(err, torpor.EConflict) {
		as(d, acme, "hibernate", a)
		as(d, acme, "hibernate", b)
		as(d, acme, "volumes", "resize", "data", "128")
		as(d, acme, "start", a)
	} else if err != nil {
		t.Fatal(err)
	}
	if out, code := inside(d, a, "dd", "if=/dev/zero", "of=/data/big", "bs=1M", "count=90"); code != 0 {
		t.Fatalf("90 MiB into the grown volume: %s", out)
	}
	check(d, "after the grow")
	refused(d, acme, "", "volumes", "resize", "data", "64")

	// Another tenant sees none of it.
	refused(d, bravo, "not_found", "volumes", "get", "data")
	refused(d, bravo, "volume_mounts.data", "create", "--volume", "data:/data")
	if out := as(d, bravo, "volumes", "ls"); strings.Contains(out, "data") {
		t.Fatalf("bravo's list: %q", out)
	}
	if _, err := clientOf(d, bravo).ReadFile(ctx, client.Volume("data"), "/result.txt"); !torpor.IsCode(err, torpor.ENotFound) {
		t.Fatalf("bravo reads acme's volume: %v", err)
	}

	// Delete refused while mounted, done after; the results are read
	// without a sandbox first.
	refused(d, acme, a, "volumes", "rm", "data")
	as(d, acme, "rm", a)
	as(d, acme, "rm", b)
	r, err := cl.ReadFile(ctx, client.Volume("data"), "/result.txt")
	if err != nil {
		t.Fatal(err)
	}
	got, _ := io.ReadAll(r)
	r.Close()
	if string(got) != "from-a\n" {
		t.Fatalf("the result read without a sandbox: %q", got)
	}
	as(d, acme, "volumes", "rm", "data")
	refused(d, acme, "not_found", "volumes", "get", "data")
	if _, err := os.Stat(filepath.Dir(images[0])); !os.IsNotExist(err) {
		t.Fatalf("the volume's data after its delete: %v", err)
	}
}

// TestVolumesInVM: a volume seeded through its files route is mounted
// by a microVM sandbox as a block device, read-write at one path and
// read-only at another. While the VM holds it (running, and paused by
// snapshot) the volume is the VM's alone: its files route and a
// container sandbox that would mount it are refused with 409 naming the
// VM. Its files stay across the snapshot and restore; once the VM is
// hibernated what it wrote is read through the files route, and the
// volume goes with its delete. One boot and one restore, for TCG's sake.
func TestVolumesInVM(t *testing.T) {
	env := needsVM(t)
	ctx := context.Background()
	dataDir := t.TempDir()
	t.Cleanup(func() {
		mnts, _ := filepath.Glob(filepath.Join(dataDir, "*", "volumes", "*", "mnt"))
		for _, m := range mnts {
			_ = syscall.Unmount(m, syscall.MNT_DETACH)
		}
	})
	d := startDaemon(t, torporBin(t), dataDir, env...)
	cl, err := client.New("http://"+d.addr, d.key)
	if err != nil {
		t.Fatal(err)
	}
	d.ok("volumes", "create", "data", "32")
	if _, err := cl.WriteFile(ctx, client.Volume("data"), "/seed.txt", strings.NewReader("seeded"), nil); err != nil {
		t.Fatal(err)
	}
	id := strings.TrimSpace(d.ok("create", "--isolation", "vm", "--memory", "192", "--volume", "data:/data", "--volume", "data:/ro:ro"))
	if out := d.ok("exec", id, "--", "sh", "-c", "cat /data/seed.txt; echo from-vm > /data/out.txt; sync; (echo x > /ro/w) 2>&1; true"); !strings.Contains(out, "seeded") || !strings.Contains(out, "Read-only file system") {
		t.Fatalf("inside the VM: %q", out)
	}
	held := func(when string) {
		t.Helper()
		if _, err := cl.ReadFile(ctx, client.Volume("data"), "/seed.txt"); !torpor.IsCode(err, torpor.EConflict) || !strings.Contains(err.Error(), id) {
			t.Fatalf("%s: the volume's files route = %v, want a conflict naming %s", when, err, id)
		}
		out, errs, code := d.cliIn(d.key, "", "create", "--volume", "data:/data")
		if code == 0 || !strings.Contains(errs, id) {
			t.Fatalf("%s: a container sandbox mounting the VM's volume: exit %d %q %q", when, code, out, errs)
		}
	}
	held("running")
	d.ok("pause", id)
	held("paused")
	if out := d.ok("exec", id, "--", "cat", "/data/out.txt"); out != "from-vm\n" {
		t.Fatalf("after the restore: %q", out)
	}
	d.ok("hibernate", id)
	r, err := cl.ReadFile(ctx, client.Volume("data"), "/out.txt")
	if err != nil {
		t.Fatalf("the volume's files after the VM hibernated: %v", err)
	}
	b, _ := io.ReadAll(r)
	r.Close()
	if string(b) != "from-vm\n" {
		t.Fatalf("what the VM wrote, read on the host: %q", b)
	}
	d.ok("rm", id)
	d.ok("volumes", "rm", "data")
}
