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
