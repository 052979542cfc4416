package storetest

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

func tenantTests() []test {
	return []test{
		{"CreateThenGet", testTenantRoundTrip},
		{"DuplicateNameIsConflict", testTenantDuplicate},
		{"GetMissingIsNotFound", testTenantMissing},
		{"ListSortedByName", testTenantList},
		{"QuotaRoundTrip", testTenantQuota},
		{"SetQuotaOfMissingIsNotFound", testTenantQuotaMissing},
	}
}

func apiKeyTests() []test {
	return []test{
		{"LookupByHash", testKeyLookup},
		{"TenantMustExist", testKeyTenantMissing},
		{"UnknownHashIsNotFound", testKeyUnknownHash},
		{"DuplicateIDOrHashIsConflict", testKeyDuplicate},
	}
}

// createTenant stores a tenant or fails the test.
func (h *harness) createTenant(name string, created time.Time) torpor.Tenant {
	h.t.Helper()
	tn := torpor.Tenant{Name: name, CreatedAt: created}
	if err := h.s.CreateTenant(h.t.Context(), tn); err != nil {
		h.t.Fatalf("CreateTenant(%q): %v", name, err)
	}
	return tn
}

// createKey stores an API key or fails the test.
func (h *harness) createKey(k torpor.APIKey) {
	h.t.Helper()
	if err := h.s.CreateAPIKey(h.t.Context(), k); err != nil {
		h.t.Fatalf("CreateAPIKey(%q): %v", k.ID, err)
	}
}

func testTenantRoundTrip(t *testing.T, h *harness) {
	want := h.createTenant("acme", at(42*time.Microsecond))
	got, err := h.s.GetTenant(t.Context(), "acme")
	if err != nil {
		t.Fatalf("GetTenant: %v", err)
	}
	checkSame(t, "tenant", got, &want)
}

func testTenantDuplicate(t *testing.T, h *harness) {
	want := h.createTenant("acme", at(0))
	err := h.s.CreateTenant(t.Context(), torpor.Tenant{Name: "acme", CreatedAt: at(time.Hour)})
	wantCode(t, err, torpor.EConflict, "CreateTenant with an existing name")
	got, err := h.s.GetTenant(t.Context(), "acme")
	if err != nil {
		t.Fatalf("GetTenant: %v", err)
	}
	checkSame(t, "tenant after a refused duplicate", got, &want)
}

func testTenantMissing(t *testing.T, h *harness) {
	_, err := h.s.GetTenant(t.Context(), "nobody")
	wantCode(t, err, torpor.ENotFound, "GetTenant of an unknown name")
}

func testTenantList(t *testing.T, h *harness) {
	if got, err := h.s.ListTenants(t.Context()); err != nil || len(got) != 0 {
		t.Fatalf("ListTenants on an empty store = %v, %v; want none", got, err)
	}
	var want []torpor.Tenant
	for i, name := range []string{"zeta", "acme", "globex", "acme2"} {
		want = append(want, h.createTenant(name, at(time.Duration(i)*time.Second)))
	}
	slices.SortFunc(want, func(a, b torpor.Tenant) int { return strings.Compare(a.Name, b.Name) })

	got, err := h.s.ListTenants(t.Context())
	if err != nil {
		t.Fatalf("ListTenants: %v", err)
	}
	if len(got) != len(want) {
		t.Fatalf("ListTenants returned %d tenants, want %d", len(got), len(want))
	}
	for i := range want {
		checkSame(t, "tenant "+want[i].Name, got[i], want[i])
	}
}

// A quota is kept with the tenant: given at create, replaced as a whole
// by SetTenantQuota (fractional vCPUs exactly), shown by Get and List, and
// kept across a reopen.
func testTenantQuota(t *testing.T, h *harness) {
	created := torpor.Tenant{Name: "acme", CreatedAt: at(0), Quota: torpor.Quota{MaxSandboxes: 5, MaxDiskMiB: 10240}}
	if err := h.s.CreateTenant(t.Context(), created); err != nil {
		t.Fatalf("CreateTenant with a quota: %v", err)
	}
	got, err := h.s.GetTenant(t.Context(), "acme")
	if err != nil {
		t.Fatalf("GetTenant: %v", err)
	}
	checkSame(t, "tenant created with a quota", got, &created)

	other := h.createTenant("globex", at(time.Second))
	want := created
	want.Quota = torpor.Quota{MaxSandboxes: 2, MaxVCPUs: 2.5, MaxMemoryMiB: 4096}
	if err := h.s.SetTenantQuota(t.Context(), "acme", want.Quota); err != nil {
		t.Fatalf("SetTenantQuota: %v", err)
	}
	h.restart()
	got, err = h.s.GetTenant(t.Context(), "acme")
	if err != nil {
		t.Fatalf("GetTenant after a restart: %v", err)
	}
	checkSame(t, "tenant after SetTenantQuota and a restart", got, &want)
	list, err := h.s.ListTenants(t.Context())
	if err != nil || len(list) != 2 {
		t.Fatalf("ListTenants = %v, %v; want 2 tenants", list, err)
	}
	checkSame(t, "listed acme", list[0], want)
	checkSame(t, "listed globex, whose quota nobody set", list[1], other)
}

func testTenantQuotaMissing(t *testing.T, h *harness) {
	err := h.s.SetTenantQuota(t.Context(), "nobody", torpor.Quota{MaxSandboxes: 1})
	wantCode(t, err, torpor.ENotFound, "SetTenantQuota of an unknown name")
	if _, err := h.s.GetTenant(t.Context(), "nobody"); !torpor.IsCode(err, torpor.ENotFound) {
		t.Fatalf("SetTenantQuota of an unknown name made it: %v", err)
	}
}

func testKeyLookup(t *testing.T, h *harness) {
	h.createTenant("acme", at(0))
	admin := torpor.APIKey{ID: "key_admin", Tenant: "acme", Admin: true, Tier: torpor.TierStandard, Hash: "sha256:aaaa", CreatedAt: at(time.Second)}
	user := torpor.APIKey{ID: "key_user", Tenant: "acme", Admin: false, Tier: torpor.TierFree, Hash: "sha256:bbbb", CreatedAt: at(2 * time.Second)}
	h.createKey(admin)
	h.createKey(user)

	for _, want := range []torpor.APIKey{admin, user} {
		got, err := h.s.APIKeyByHash(t.Context(), want.Hash)
		if err != nil {
			t.Fatalf("APIKeyByHash(%q): %v", want.Hash, err)
		}
		checkSame(t, "key "+want.ID, got, &want)
	}
}

// A key for a tenant that does not exist is refused and not stored.
func testKeyTenantMissing(t *testing.T, h *harness) {
	k := torpor.APIKey{ID: "key_1", Tenant: "ghost", Hash: "sha256:aaaa", CreatedAt: at(0)}
	wantCode(t, h.s.CreateAPIKey(t.Context(), k), torpor.ENotFound, "CreateAPIKey for an unknown tenant")
	_, err := h.s.APIKeyByHash(t.Context(), k.Hash)
	wantCode(t, err, torpor.ENotFound, "APIKeyByHash of a refused key")
}

func testKeyUnknownHash(t *testing.T, h *harness) {
	h.createTenant("acme", at(0))
	h.createKey(torpor.APIKey{ID: "key_1", Tenant: "acme", Hash: "sha256:aaaa", CreatedAt: at(0)})
	for _, hash := range []string{"sha256:bbbb", "sha256:AAAA", "sha256:aaa", ""} {
		_, err := h.s.APIKeyByHash(t.Context(), hash)
		wantCode(t, err, torpor.ENotFound, "APIKeyByHash("+hash+")")
	}
}

// Two keys may share neither an id nor a hash; the first stays valid.
func testKeyDuplicate(t *testing.T, h *harness) {
	h.createTenant("acme", at(0))
	h.createTenant("globex", at(0))
	first := torpor.APIKey{ID: "key_1", Tenant: "acme", Tier: torpor.TierStandard, Hash: "sha256:aaaa", CreatedAt: at(0)}
	h.createKey(first)

	sameID := torpor.APIKey{ID: "key_1", Tenant: "globex", Hash: "sha256:bbbb", CreatedAt: at(time.Second)}
	wantCode(t, h.s.CreateAPIKey(t.Context(), sameID), torpor.EConflict, "CreateAPIKey with an existing id")
	sameHash := torpor.APIKey{ID: "key_2", Tenant: "globex", Admin: true, Hash: "sha256:aaaa", CreatedAt: at(time.Second)}
	wantCode(t, h.s.CreateAPIKey(t.Context(), sameHash), torpor.EConflict, "CreateAPIKey with an existing hash")

	got, err := h.s.APIKeyByHash(t.Context(), first.Hash)
	if err != nil {
		t.Fatalf("APIKeyByHash: %v", err)
	}
	checkSame(t, "key after refused duplicates", got, &first)
	_, err = h.s.APIKeyByHash(t.Context(), sameID.Hash)
	wantCode(t, err, torpor.ENotFound, "APIKeyByHash of a refused key")
}
