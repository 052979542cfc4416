package storetest

import (
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

func volumeTests() []test {
	return []test{
		{"CreateThenGetAndList", testVolumeRoundTrip},
		{"NameTakenIsConflict", testVolumeNameTaken},
		{"TenantMustExist", testVolumeTenantMissing},
		{"TenantScoped", testVolumeTenantScoped},
		{"ResizeKeepsTheRest", testVolumeResize},
		{"InvalidNameOrSize", testVolumeInvalid},
		{"DeleteRefusedWhileMounted", testVolumeDeleteMounted},
		{"DeleteThenNotFound", testVolumeDelete},
		{"SurvivesRestart", testVolumeRestart},
	}
}

func (h *harness) createVolume(tenant, name, id string, sizeMiB int64, when time.Time) torpor.Volume {
	h.t.Helper()
	v := torpor.Volume{Tenant: tenant, Name: name, ID: id, SizeMiB: sizeMiB, Node: "node-a", CreatedAt: when, UpdatedAt: when}
	if err := h.s.CreateVolume(h.t.Context(), v); err != nil {
		h.t.Fatalf("CreateVolume(%q, %q): %v", tenant, name, err)
	}
	return v
}

func sameVolume(a, b torpor.Volume) bool {
	return a.Tenant == b.Tenant && a.Name == b.Name && a.ID == b.ID && a.SizeMiB == b.SizeMiB && a.Node == b.Node &&
		a.CreatedAt.Equal(b.CreatedAt) && a.UpdatedAt.Equal(b.UpdatedAt) && a.CreatedAt.Location() == time.UTC
}

// What a create stores, get and list answer (list by name), to the
// microsecond, with the node that holds it.
func testVolumeRoundTrip(t *testing.T, h *harness) {
	h.createTenant("acme", at(0))
	b := h.createVolume("acme", "b-data", "vol_b", 64, at(time.Second))
	a := h.createVolume("acme", "a.cache", "vol_a", 1024, at(2*time.Second+7*time.Microsecond))
	got, err := h.s.GetVolume(t.Context(), "acme", "a.cache")
	if err != nil || !sameVolume(got, a) {
		t.Fatalf("GetVolume = %+v, %v; want %+v", got, err, a)
	}
	list, err := h.s.ListVolumes(t.Context(), "acme")
	if err != nil || len(list) != 2 || !sameVolume(list[0], a) || !sameVolume(list[1], b) {
		t.Fatalf("ListVolumes = %+v, %v; want a.cache then b-data", list, err)
	}
}

// A name the tenant has is a conflict, and the first volume is intact.
func testVolumeNameTaken(t *testing.T, h *harness) {
	h.createTenant("acme", at(0))
	first := h.createVolume("acme", "data", "vol_1", 64, at(time.Second))
	err := h.s.CreateVolume(t.Context(), torpor.Volume{Tenant: "acme", Name: "data", ID: "vol_2", SizeMiB: 128, CreatedAt: at(2 * time.Second)})
	if !torpor.IsCode(err, torpor.EConflict) {
		t.Fatalf("second CreateVolume of the name = %v, want a conflict", err)
	}
	if got, err := h.s.GetVolume(t.Context(), "acme", "data"); err != nil || !sameVolume(got, first) {
		t.Fatalf("after the conflict: %+v, %v; want the first", got, err)
	}
}

func testVolumeTenantMissing(t *testing.T, h *harness) {
	err := h.s.CreateVolume(t.Context(), torpor.Volume{Tenant: "nobody", Name: "data", ID: "vol_1", SizeMiB: 64, CreatedAt: at(0)})
	if !torpor.IsCode(err, torpor.ENotFound) {
		t.Fatalf("CreateVolume for a missing tenant = %v, want not_found", err)
	}
}

// Two tenants may have the same name; neither sees, resizes nor deletes
// the other's.
func testVolumeTenantScoped(t *testing.T, h *harness) {
	h.createTenant("acme", at(0))
	h.createTenant("umbrella", at(0))
	h.createVolume("acme", "data", "vol_a", 64, at(time.Second))
	if _, err := h.s.GetVolume(t.Context(), "umbrella", "data"); !torpor.IsCode(err, torpor.ENotFound) {
		t.Fatalf("umbrella's GetVolume of acme's = %v, want not_found", err)
	}
	if _, err := h.s.ResizeVolume(t.Context(), "umbrella", "data", 128, at(time.Minute)); !torpor.IsCode(err, torpor.ENotFound) {
		t.Fatalf("umbrella's ResizeVolume of acme's = %v, want not_found", err)
	}
	if err := h.s.DeleteVolume(t.Context(), "umbrella", "data"); !torpor.IsCode(err, torpor.ENotFound) {
		t.Fatalf("umbrella's DeleteVolume of acme's = %v, want not_found", err)
	}
	if list, err := h.s.ListVolumes(t.Context(), "umbrella"); err != nil || len(list) != 0 {
		t.Fatalf("umbrella's ListVolumes = %+v, %v; want none", list, err)
	}
	u := h.createVolume("umbrella", "data", "vol_u", 32, at(2*time.Second))
	if got, err := h.s.GetVolume(t.Context(), "acme", "data"); err != nil || got.ID != "vol_a" || got.SizeMiB != 64 {
		t.Fatalf("acme's after umbrella made the name: %+v, %v", got, err)
	}
	if got, _ := h.s.GetVolume(t.Context(), "umbrella", "data"); !sameVolume(got, u) {
		t.Fatalf("umbrella's = %+v, want %+v", got, u)
	}
}

func testVolumeResize(t *testing.T, h *harness) {
	h.createTenant("acme", at(0))
	v := h.createVolume("acme", "data", "vol_a", 64, at(time.Second))
	got, err := h.s.ResizeVolume(t.Context(), "acme", "data", 256, at(time.Hour))
	v.SizeMiB, v.UpdatedAt = 256, at(time.Hour)
	if err != nil || !sameVolume(got, v) {
		t.Fatalf("ResizeVolume = %+v, %v; want %+v", got, err, v)
	}
	if got, _ := h.s.GetVolume(t.Context(), "acme", "data"); !sameVolume(got, v) {
		t.Fatalf("after the resize: %+v, want %+v", got, v)
	}
	if _, err := h.s.ResizeVolume(t.Context(), "acme", "other", 256, at(time.Hour)); !torpor.IsCode(err, torpor.ENotFound) {
		t.Fatalf("ResizeVolume of a missing volume = %v, want not_found", err)
	}
}

func testVolumeInvalid(t *testing.T, h *harness) {
	h.createTenant("acme", at(0))
	for _, v := range []torpor.Volume{
		{Tenant: "acme", Name: "../x", ID: "vol_1", SizeMiB: 64},
		{Tenant: "acme", Name: "", ID: "vol_1", SizeMiB: 64},
		{Tenant: "acme", Name: "data", ID: "vol_1", SizeMiB: 0},
		{Tenant: "acme", Name: "data", ID: "vol_1", SizeMiB: -5},
	} {
		if err := h.s.CreateVolume(t.Context(), v); !torpor.IsCode(err, torpor.EInvalid) {
			t.Errorf("CreateVolume(%+v) = %v, want invalid_argument", v, err)
		}
	}
	if list, _ := h.s.ListVolumes(t.Context(), "acme"); len(list) != 0 {
		t.Fatalf("after invalid creates: %+v", list)
	}
}

// A sandbox of the tenant that is not terminated and mounts the volume
// keeps it: the conflict names the sandbox. One that is terminated, one
// that mounts another volume, and another tenant's of the same name do
// not.
func testVolumeDeleteMounted(t *testing.T, h *harness) {
	h.createTenant("acme", at(0))
	h.createTenant("umbrella", at(0))
	h.createVolume("acme", "data", "vol_a", 64, at(time.Second))
	h.createVolume("acme", "other", "vol_o", 64, at(time.Second))
	h.createVolume("umbrella", "data", "vol_u", 64, at(time.Second))

	user := newSandbox("sb-user", "acme", torpor.StateHibernated, at(time.Minute))
	user.VolumeMounts = []torpor.VolumeMount{{Name: "other", Path: "/o"}, {Name: "data", Path: "/data", ReadOnly: true}}
	h.create(user)
	gone := newSandbox("sb-gone", "acme", torpor.StateTerminated, at(time.Minute))
	gone.VolumeMounts = []torpor.VolumeMount{{Name: "data", Path: "/data"}}
	h.create(gone)
	otherTenant := newSandbox("sb-umbrella", "umbrella", torpor.StateRunning, at(time.Minute))
	otherTenant.VolumeMounts = []torpor.VolumeMount{{Name: "data", Path: "/data"}}
	h.create(otherTenant)

	err := h.s.DeleteVolume(t.Context(), "acme", "data")
	if !torpor.IsCode(err, torpor.EConflict) || !strings.Contains(err.Error(), "sb-user") {
		t.Fatalf("DeleteVolume of a mounted volume = %v, want a conflict naming sb-user", err)
	}
	if _, err := h.s.GetVolume(t.Context(), "acme", "data"); err != nil {
		t.Fatalf("after the refused delete: %v", err)
	}
	if got := h.get("sb-user"); len(got.VolumeMounts) != 2 || got.VolumeMounts[1] != (torpor.VolumeMount{Name: "data", Path: "/data", ReadOnly: true}) {
		t.Fatalf("stored mounts = %+v", got.VolumeMounts)
	}
	user = h.get("sb-user")
	user.State = torpor.StateTerminated
	h.update(user)
	if err := h.s.DeleteVolume(t.Context(), "acme", "data"); err != nil {
		t.Fatalf("DeleteVolume once its sandbox is terminated: %v", err)
	}
	if _, err := h.s.GetVolume(t.Context(), "umbrella", "data"); err != nil {
		t.Fatalf("umbrella's volume of the same name after acme's delete: %v", err)
	}
}

func testVolumeDelete(t *testing.T, h *harness) {
	h.createTenant("acme", at(0))
	h.createVolume("acme", "data", "vol_a", 64, at(time.Second))
	if err := h.s.DeleteVolume(t.Context(), "acme", "data"); err != nil {
		t.Fatalf("DeleteVolume: %v", err)
	}
	if _, err := h.s.GetVolume(t.Context(), "acme", "data"); !torpor.IsCode(err, torpor.ENotFound) {
		t.Fatalf("GetVolume after the delete = %v, want not_found", err)
	}
	if err := h.s.DeleteVolume(t.Context(), "acme", "data"); !torpor.IsCode(err, torpor.ENotFound) {
		t.Fatalf("second DeleteVolume = %v, want not_found", err)
	}
	// The name may be made again, as a new volume.
	h.createVolume("acme", "data", "vol_b", 32, at(time.Minute))
}

func testVolumeRestart(t *testing.T, h *harness) {
	h.createTenant("acme", at(0))
	v := h.createVolume("acme", "data", "vol_a", 64, at(time.Second))
	s := h.restart()
	if got, err := s.GetVolume(t.Context(), "acme", "data"); err != nil || !sameVolume(got, v) {
		t.Fatalf("after a restart: %+v, %v; want %+v", got, err, v)
	}
}
