package storetest

import (
	"bytes"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

func secretTests() []test {
	return []test{
		{"SetThenGetAndList", testSecretRoundTrip},
		{"SetAgainRotates", testSecretRotate},
		{"TenantMustExist", testSecretTenantMissing},
		{"TenantScoped", testSecretTenantScoped},
		{"DeleteThenNotFound", testSecretDelete},
		{"InvalidNameOrValue", testSecretInvalid},
		{"BinaryValueSurvivesRestart", testSecretRestart},
		{"ConcurrentSetsCountEveryVersion", testSecretConcurrent},
	}
}

func (h *harness) setSecret(tenant, name, value string, when time.Time) torpor.Secret {
	h.t.Helper()
	sec, err := h.s.SetSecret(h.t.Context(), tenant, name, []byte(value), when)
	if err != nil {
		h.t.Fatalf("SetSecret(%q, %q): %v", tenant, name, err)
	}
	return sec
}

func (h *harness) secretValue(tenant, name string) string {
	h.t.Helper()
	v, err := h.s.SecretValue(h.t.Context(), tenant, name)
	if err != nil {
		h.t.Fatalf("SecretValue(%q, %q): %v", tenant, name, err)
	}
	return string(v)
}

// A set answers the metadata at version 1; get and list answer the same,
// by name, and SecretValue the value.
func testSecretRoundTrip(t *testing.T, h *harness) {
	h.createTenant("acme", at(0))
	b := h.setSecret("acme", "b-token", "value-b", at(time.Second))
	a := h.setSecret("acme", "a.key", "value-a", at(2*time.Second+7*time.Microsecond))
	if a.Tenant != "acme" || a.Name != "a.key" || a.Version != 1 || !a.CreatedAt.Equal(at(2*time.Second+7*time.Microsecond)) ||
		!a.CreatedAt.Equal(a.UpdatedAt) || a.CreatedAt.Location() != time.UTC {
		t.Fatalf("first set = %+v, want acme's a.key at version 1, created at the set's time (UTC) and not updated since", a)
	}
	got, err := h.s.GetSecret(t.Context(), "acme", "a.key")
	if err != nil || got != a {
		t.Fatalf("GetSecret = %+v, %v; want %+v", got, err, a)
	}
	list, err := h.s.ListSecrets(t.Context(), "acme")
	if err != nil || len(list) != 2 || list[0] != a || list[1] != b {
		t.Fatalf("ListSecrets = %+v, %v; want a.key then b-token", list, err)
	}
	if v := h.secretValue("acme", "a.key"); v != "value-a" {
		t.Fatalf("SecretValue = %q, want value-a", v)
	}
	if list, err := h.s.ListSecrets(t.Context(), "nobody"); err != nil || len(list) != 0 {
		t.Fatalf("ListSecrets of a tenant without secrets = %+v, %v", list, err)
	}
}

// Setting an existing name replaces its value and moves its version by
// one; its creation time stays.
func testSecretRotate(t *testing.T, h *harness) {
	h.createTenant("acme", at(0))
	first := h.setSecret("acme", "db", "old", at(time.Second))
	second := h.setSecret("acme", "db", "new", at(time.Minute))
	if second.Version != 2 || !second.CreatedAt.Equal(first.CreatedAt) || !second.UpdatedAt.Equal(at(time.Minute)) {
		t.Fatalf("after a rotation: %+v (first %+v); want version 2, the same creation, updated at the rotation", second, first)
	}
	if got, err := h.s.GetSecret(t.Context(), "acme", "db"); err != nil || got != second {
		t.Fatalf("GetSecret after a rotation = %+v, %v; want %+v", got, err, second)
	}
	if third := h.setSecret("acme", "db", "newer", at(time.Hour)); third.Version != 3 {
		t.Fatalf("third set: version %d, want 3", third.Version)
	}
	if v := h.secretValue("acme", "db"); v != "newer" {
		t.Fatalf("value after rotations = %q, want newer", v)
	}
}

func testSecretTenantMissing(t *testing.T, h *harness) {
	_, err := h.s.SetSecret(t.Context(), "nobody", "db", []byte("x"), at(0))
	wantCode(t, err, torpor.ENotFound, "a secret of a missing tenant")
}

// A tenant sees, reads and deletes only its own secrets; the same name in
// two tenants is two secrets.
func testSecretTenantScoped(t *testing.T, h *harness) {
	h.createTenant("acme", at(0))
	h.createTenant("other", at(0))
	h.setSecret("acme", "db", "acme-value", at(0))
	ctx := t.Context()
	_, err := h.s.GetSecret(ctx, "other", "db")
	wantCode(t, err, torpor.ENotFound, "another tenant's get")
	_, err = h.s.SecretValue(ctx, "other", "db")
	wantCode(t, err, torpor.ENotFound, "another tenant's value")
	wantCode(t, h.s.DeleteSecret(ctx, "other", "db"), torpor.ENotFound, "another tenant's delete")
	if list, _ := h.s.ListSecrets(ctx, "other"); len(list) != 0 {
		t.Fatalf("another tenant's list = %+v", list)
	}
	if o := h.setSecret("other", "db", "other-value", at(0)); o.Version != 1 {
		t.Fatalf("the same name in another tenant: version %d, want 1", o.Version)
	}
	if a, o := h.secretValue("acme", "db"), h.secretValue("other", "db"); a != "acme-value" || o != "other-value" {
		t.Fatalf("values = %q and %q, want each tenant's own", a, o)
	}
}

func testSecretDelete(t *testing.T, h *harness) {
	h.createTenant("acme", at(0))
	h.setSecret("acme", "db", "x", at(0))
	ctx := t.Context()
	if err := h.s.DeleteSecret(ctx, "acme", "db"); err != nil {
		t.Fatal(err)
	}
	_, err := h.s.GetSecret(ctx, "acme", "db")
	wantCode(t, err, torpor.ENotFound, "get after delete")
	_, err = h.s.SecretValue(ctx, "acme", "db")
	wantCode(t, err, torpor.ENotFound, "value after delete")
	wantCode(t, h.s.DeleteSecret(ctx, "acme", "db"), torpor.ENotFound, "second delete")
	if again := h.setSecret("acme", "db", "y", at(time.Second)); again.Version != 1 {
		t.Fatalf("set after delete: version %d, want 1 (a new secret)", again.Version)
	}
}

// Bad names and values are refused as invalid, and the error never holds
// the value.
func testSecretInvalid(t *testing.T, h *harness) {
	h.createTenant("acme", at(0))
	ctx := t.Context()
	for _, name := range []string{"", "-lead", "has space", "a/b", strings.Repeat("n", 64)} {
		_, err := h.s.SetSecret(ctx, "acme", name, []byte("x"), at(0))
		wantCode(t, err, torpor.EInvalid, "name "+name)
	}
	_, err := h.s.SetSecret(ctx, "acme", "db", nil, at(0))
	wantCode(t, err, torpor.EInvalid, "an empty value")
	big := bytes.Repeat([]byte("S"), torpor.MaxSecretValueLen+1)
	_, err = h.s.SetSecret(ctx, "acme", "db", big, at(0))
	wantCode(t, err, torpor.EInvalid, "a value over the limit")
	if strings.Contains(err.Error(), "SSSS") {
		t.Fatalf("the error holds the value: %v", err)
	}
	if _, err := h.s.GetSecret(ctx, "acme", "db"); !torpor.IsCode(err, torpor.ENotFound) {
		t.Fatalf("a refused set stored something: %v", err)
	}
}

// Any bytes are a value, and a value set before a restart opens after it.
func testSecretRestart(t *testing.T, h *harness) {
	h.createTenant("acme", at(0))
	value := []byte{0, 1, 2, 0xff, '\n', 'x', 0}
	sec, err := h.s.SetSecret(t.Context(), "acme", "bin", value, at(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	s := h.restart()
	got, err := s.SecretValue(t.Context(), "acme", "bin")
	if err != nil || !bytes.Equal(got, value) {
		t.Fatalf("value after restart = %q, %v; want %q", got, err, value)
	}
	if meta, err := s.GetSecret(t.Context(), "acme", "bin"); err != nil || meta != sec {
		t.Fatalf("metadata after restart = %+v, %v; want %+v", meta, err, sec)
	}
}

// Sets of one name that race each count: n sets end at version n.
func testSecretConcurrent(t *testing.T, h *harness) {
	h.createTenant("acme", at(0))
	const n = 8
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if _, err := h.s.SetSecret(t.Context(), "acme", "db", []byte{byte('a' + i)}, at(time.Duration(i)*time.Second)); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	if sec, err := h.s.GetSecret(t.Context(), "acme", "db"); err != nil || sec.Version != n {
		t.Fatalf("after %d racing sets: %+v, %v; want version %d", n, sec, err, n)
	}
}
