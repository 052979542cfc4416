package lifecycle_test

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/files"
	"github.com/torpor-dev/torpor/lifecycle"
	"github.com/torpor-dev/torpor/runtime/fake"
)

// volumeEnv is an env whose fake host keeps files (and volumes) and
// whose tenants acme and other exist.
func volumeEnv(t *testing.T) *env {
	t.Helper()
	e := newEnv(t)
	e.host.FilesDir = t.TempDir()
	for _, tn := range []string{"acme", "other"} {
		if err := e.store.CreateTenant(ctx, torpor.Tenant{Name: tn, CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	return e
}

// A volume is made with its data; a sandbox that mounts it gets it at
// every boot (create, start from hibernation, restart, after a daemon
// restart), with its path and read-only flag; the volume shows its
// users, cannot be deleted while one is not terminated, and goes with
// its data after.
func TestVolumeMountedAtEveryBoot(t *testing.T) {
	e := volumeEnv(t)
	v, err := e.eng.CreateVolume(ctx, "acme", "data", 64)
	if err != nil {
		t.Fatal(err)
	}
	if v.ID == "" || v.SizeMiB != 64 || v.UsedBytes == nil {
		t.Fatalf("CreateVolume = %+v", v)
	}
	if _, err := e.eng.CreateVolume(ctx, "acme", "data", 64); !torpor.IsCode(err, torpor.EConflict) {
		t.Fatalf("second create = %v, want a conflict", err)
	}
	fsys, err := e.eng.VolumeFS(ctx, "acme", "data")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fsys.Write("/seed.txt", strings.NewReader("seeded"), files.WriteOptions{}); err != nil {
		t.Fatal(err)
	}
	fsys.Close()
	mounts := []torpor.VolumeMount{{Name: "data", Path: "/data", ReadOnly: true}}
	sb := e.create(torpor.CreateRequest{VolumeMounts: mounts})
	want := []torpor.VolumeBind{{ID: v.ID, SizeMiB: 64, Path: "/data", ReadOnly: true}}
	check := func(when string) {
		t.Helper()
		got := e.host.Spec(sb.ID).Volumes
		if len(got) != 1 || got[0] != want[0] {
			t.Fatalf("%s: boot's volumes = %+v, want %+v", when, got, want)
		}
	}
	check("create")
	if got := e.get(sb.ID).VolumeMounts; len(got) != 1 || got[0] != mounts[0] {
		t.Fatalf("the sandbox's volume_mounts = %+v", got)
	}
	if _, err := e.eng.Hibernate(ctx, "acme", sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.eng.Start(ctx, "acme", sb.ID); err != nil {
		t.Fatal(err)
	}
	check("start from hibernation")
	e.restart()
	if _, err := e.eng.Restart(ctx, "acme", sb.ID); err != nil {
		t.Fatal(err)
	}
	check("restart after a daemon restart")

	got, err := e.eng.GetVolume(ctx, "acme", "data")
	if err != nil || len(got.MountedBy) != 1 || got.MountedBy[0] != sb.ID || *got.UsedBytes != int64(len("seeded")) {
		t.Fatalf("GetVolume = %+v, %v; want mounted by %s, 6 bytes used", got, err, sb.ID)
	}
	if err := e.eng.DeleteVolume(ctx, "acme", "data"); !torpor.IsCode(err, torpor.EConflict) || !strings.Contains(err.Error(), sb.ID) {
		t.Fatalf("delete while mounted = %v, want a conflict naming %s", err, sb.ID)
	}
	if _, err := e.eng.Delete(ctx, "acme", sb.ID); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(e.host.FilesDir, ".volumes", v.ID)
	if b, err := os.ReadFile(filepath.Join(dir, "seed.txt")); err != nil || string(b) != "seeded" {
		t.Fatalf("the volume after its sandbox: %q, %v", b, err)
	}
	if err := e.eng.DeleteVolume(ctx, "acme", "data"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("the volume's data after its delete: %v", err)
	}
}

// Another tenant's volume is not there for a create, a get, a resize, a
// delete or its files; a missing volume is an invalid create; sizes
// only grow.
func TestVolumesTenantScopedAndChecked(t *testing.T) {
	e := volumeEnv(t)
	if _, err := e.eng.CreateVolume(ctx, "other", "theirs", 32); err != nil {
		t.Fatal(err)
	}
	_, err := e.eng.Create(ctx, "acme", torpor.CreateRequest{Template: "base", VolumeMounts: []torpor.VolumeMount{{Name: "theirs", Path: "/x"}}})
	if !torpor.IsCode(err, torpor.EInvalid) {
		t.Fatalf("create mounting another tenant's volume = %v, want invalid_argument", err)
	}
	if _, err := e.eng.GetVolume(ctx, "acme", "theirs"); !torpor.IsCode(err, torpor.ENotFound) {
		t.Fatalf("get = %v", err)
	}
	if _, err := e.eng.ResizeVolume(ctx, "acme", "theirs", 64); !torpor.IsCode(err, torpor.ENotFound) {
		t.Fatalf("resize = %v", err)
	}
	if err := e.eng.DeleteVolume(ctx, "acme", "theirs"); !torpor.IsCode(err, torpor.ENotFound) {
		t.Fatalf("delete = %v", err)
	}
	if _, err := e.eng.VolumeFS(ctx, "acme", "theirs"); !torpor.IsCode(err, torpor.ENotFound) {
		t.Fatalf("files = %v", err)
	}
	if list, err := e.eng.ListVolumes(ctx, "acme"); err != nil || len(list) != 0 {
		t.Fatalf("list = %+v, %v", list, err)
	}
	if _, err := e.eng.ResizeVolume(ctx, "other", "theirs", 16); !torpor.IsCode(err, torpor.EInvalid) {
		t.Fatalf("shrink = %v, want invalid_argument", err)
	}
	if v, err := e.eng.ResizeVolume(ctx, "other", "theirs", 64); err != nil || v.SizeMiB != 64 {
		t.Fatalf("grow = %+v, %v", v, err)
	}
	// Two mounts of one volume take its lock once.
	if _, err := e.eng.CreateVolume(ctx, "acme", "mine", 32); err != nil {
		t.Fatal(err)
	}
	e.create(torpor.CreateRequest{VolumeMounts: []torpor.VolumeMount{{Name: "mine", Path: "/a"}, {Name: "mine", Path: "/b", ReadOnly: true}}})
}

// noVolumes is a runtime that cannot mount volumes (as the VM runtime
// cannot yet).
type noVolumes struct{ torpor.Runtime }

func (noVolumes) Kind() string { return "novol" }

// A create with volume_mounts on a runtime that cannot mount them is a
// 400 that says so, and makes nothing.
func TestVolumeMountsRefusedWhereTheRuntimeCannot(t *testing.T) {
	var host *fake.Host
	e := newEnv(t, func(c *lifecycle.Config) {
		host = fake.NewHost()
		c.Runtimes = append(c.Runtimes, noVolumes{fake.New(host)})
	})
	e.host.FilesDir = t.TempDir()
	if err := e.store.CreateTenant(ctx, torpor.Tenant{Name: "acme", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if _, err := e.eng.CreateVolume(ctx, "acme", "data", 32); err != nil {
		t.Fatal(err)
	}
	_, err := e.eng.Create(ctx, "acme", torpor.CreateRequest{Template: "base", Runtime: torpor.RuntimeConfig{Kind: "novol"},
		VolumeMounts: []torpor.VolumeMount{{Name: "data", Path: "/data"}}})
	if !torpor.IsCode(err, torpor.EInvalid) || !strings.Contains(err.Error(), "cannot mount volumes") {
		t.Fatalf("create = %v, want invalid_argument saying the runtime cannot mount volumes", err)
	}
	if sbs, _ := e.store.ListSandboxes(ctx, torpor.SandboxFilter{}); len(sbs) != 0 {
		t.Fatalf("sandboxes after the refusal: %d", len(sbs))
	}
}

// A create whose data could not be made leaves none; a volume's data
// that no record names (a delete or create cut short between the two)
// is removed at the daemon's start, and a named volume's is kept.
func TestVolumeDataNoRecordNamesIsSwept(t *testing.T) {
	e := volumeEnv(t)
	vdir := filepath.Join(e.host.FilesDir, ".volumes")
	e.host.FailNext("make_volume", errors.New("disk on fire"))
	if _, err := e.eng.CreateVolume(ctx, "acme", "broken", 32); err == nil {
		t.Fatal("CreateVolume succeeded with a failing make")
	}
	if ents, _ := os.ReadDir(vdir); len(ents) != 0 {
		t.Fatalf("a failed create left %d volume dirs", len(ents))
	}
	if _, err := e.eng.GetVolume(ctx, "acme", "broken"); !torpor.IsCode(err, torpor.ENotFound) {
		t.Fatalf("GetVolume of the failed create = %v, want not_found", err)
	}
	v, err := e.eng.CreateVolume(ctx, "acme", "data", 32)
	if err != nil {
		t.Fatal(err)
	}
	orphan := filepath.Join(vdir, "vol_orphan")
	if err := os.MkdirAll(orphan, 0o755); err != nil {
		t.Fatal(err)
	}
	e.restart()
	if _, err := os.Stat(orphan); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the orphan's data after a restart: %v, want it removed", err)
	}
	if _, err := os.Stat(filepath.Join(vdir, v.ID)); err != nil {
		t.Fatalf("the named volume's data after a restart: %v", err)
	}
}

// vmVolumes stands for the vm runtime: its sandboxes mount volumes as
// devices, and the test says which volumes it holds.
type vmVolumes struct {
	torpor.Runtime
	mu    sync.Mutex
	vd    torpor.VolumeDevices
	holds map[string]string
}

func (*vmVolumes) Kind() string { return "vmish" }
func (v *vmVolumes) UseVolumeDevices(vd torpor.VolumeDevices) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.vd = vd
}
func (v *vmVolumes) VolumeHolder(id string) (string, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	sb, ok := v.holds[id]
	return sb, ok
}
func (v *vmVolumes) hold(id, sb string) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if sb == "" {
		delete(v.holds, id)
	} else {
		v.holds[id] = sb
	}
}

// A volume a VM sandbox holds is its alone: its files, a create and a
// cold start of another sandbox that mounts it are 409 naming the VM
// (the other sandbox staying as it was); a VM's create is 409 while a
// sandbox with an instance mounts the volume. Hibernated sandboxes hold
// nothing.
func TestVolumeHeldByAVMIsExclusive(t *testing.T) {
	vm := &vmVolumes{holds: map[string]string{}}
	e := newEnv(t, func(c *lifecycle.Config) {
		vm.Runtime = fake.New(fake.NewHost())
		c.Runtimes = append(c.Runtimes, vm)
	})
	e.host.FilesDir = t.TempDir()
	if err := e.store.CreateTenant(ctx, torpor.Tenant{Name: "acme", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	v, err := e.eng.CreateVolume(ctx, "acme", "data", 32)
	if err != nil {
		t.Fatal(err)
	}
	mounts := []torpor.VolumeMount{{Name: "data", Path: "/data"}}
	ctr := e.create(torpor.CreateRequest{VolumeMounts: mounts})
	vmReq := torpor.CreateRequest{Template: "base", Runtime: torpor.RuntimeConfig{Kind: "vmish"}, VolumeMounts: mounts}
	conflict := func(err error, naming string) {
		t.Helper()
		e := torpor.AsError(err)
		if e.Code != torpor.EConflict || e.Reason != "volume_in_use" || !strings.Contains(e.Message, naming) {
			t.Fatalf("got %v, want a volume_in_use conflict naming %s", err, naming)
		}
	}
	_, err = e.eng.Create(ctx, "acme", vmReq)
	conflict(err, ctr.ID)
	if _, err := e.eng.Hibernate(ctx, "acme", ctr.ID); err != nil {
		t.Fatal(err)
	}
	vmsb, err := e.eng.Create(ctx, "acme", vmReq)
	if err != nil {
		t.Fatal(err)
	}
	vm.hold(v.ID, vmsb.ID)
	_, err = e.eng.VolumeFS(ctx, "acme", "data")
	conflict(err, vmsb.ID)
	_, err = e.eng.Create(ctx, "acme", torpor.CreateRequest{Template: "base", VolumeMounts: mounts})
	conflict(err, vmsb.ID)
	_, err = e.eng.Start(ctx, "acme", ctr.ID)
	conflict(err, vmsb.ID)
	if s := e.get(ctr.ID).State; s != torpor.StateHibernated {
		t.Fatalf("the refused start left the sandbox %s", s)
	}
	if g, err := e.eng.GetVolume(ctx, "acme", "data"); err != nil || g.UsedBytes != nil || len(g.MountedBy) != 2 {
		t.Fatalf("GetVolume while held: %+v %v", g, err)
	}
	vm.hold(v.ID, "")
	fsys, err := e.eng.VolumeFS(ctx, "acme", "data")
	if err != nil {
		t.Fatalf("the files once the VM let go: %v", err)
	}
	fsys.Close()
}
