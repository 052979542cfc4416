package api_test

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/torpor-dev/torpor"
)

// The secrets routes: a PUT creates (201, version 1) then rotates (200,
// version 2); GET, the list and every other answer hold metadata only;
// a create names them; an admin acts as the tenant with ?tenant=; DELETE
// removes them. No answer ever holds the value.
func TestSecretsRoutes(t *testing.T) {
	const value, rotated = "tv-api-9f1e2d", "tv-api-rotated-3c4b"
	keys := newPrincipals()
	t.Cleanup(keys.remove)
	l := newListener(t, t.TempDir(), keys)
	t.Cleanup(l.close)
	var answers []string
	do := func(key, method, target, body string, want int) *torpor.Secret {
		t.Helper()
		ctype := ""
		if body != "" {
			ctype = jsonType
		}
		rec := l.do(key, method, target, ctype, []byte(body))
		answers = append(answers, rec.Body.String())
		if rec.Code != want {
			t.Fatalf("%s %s: %d %s, want %d", method, target, rec.Code, rec.Body, want)
		}
		var sec torpor.Secret
		_ = json.Unmarshal(rec.Body.Bytes(), &sec)
		return &sec
	}
	if sec := do(keys.a, "PUT", "/v1/secrets/db", `{"value":"`+value+`"}`, http.StatusCreated); sec.Version != 1 || sec.Tenant != tenantA || sec.Name != "db" {
		t.Fatalf("first PUT answered %+v", sec)
	}
	if sec := do(keys.a, "PUT", "/v1/secrets/db", `{"value":"`+rotated+`"}`, http.StatusOK); sec.Version != 2 {
		t.Fatalf("second PUT answered version %d, want 2", sec.Version)
	}
	do(keys.a, "GET", "/v1/secrets/db", "", http.StatusOK)
	rec := l.do(keys.a, "GET", "/v1/secrets", "", nil)
	answers = append(answers, rec.Body.String())
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), `"name":"db"`) {
		t.Fatalf("list: %d %s", rec.Code, rec.Body)
	}
	do(keys.b, "GET", "/v1/secrets/db", "", http.StatusNotFound)
	do(keys.a, "PUT", "/v1/secrets/bad%20name", `{"value":"x"}`, http.StatusBadRequest)
	do(keys.a, "PUT", "/v1/secrets/db", `{"value":""}`, http.StatusBadRequest)
	do(keys.a, "PUT", "/v1/secrets/db", `{"value":"x","extra":1}`, http.StatusBadRequest)

	// A create names it; B cannot.
	create := `{"template":"base","secrets":[{"name":"db","env":"DB_PASSWORD"}]}`
	rec = l.do(keys.a, "POST", "/v1/sandboxes", jsonType, []byte(create))
	answers = append(answers, rec.Body.String())
	if rec.Code != 201 || !strings.Contains(rec.Body.String(), `"secrets":[{"name":"db","env":"DB_PASSWORD"}]`) {
		t.Fatalf("create with a secret: %d %s", rec.Code, rec.Body)
	}
	rec = l.do(keys.b, "POST", "/v1/sandboxes", jsonType, []byte(create))
	answers = append(answers, rec.Body.String())
	if rec.Code != 400 || !strings.Contains(rec.Body.String(), `"param":"secrets.db"`) {
		t.Fatalf("B's create naming A's secret: %d %s, want 400 on secrets.db", rec.Code, rec.Body)
	}

	// The admin acts as A.
	if sec := do(keys.admin, "GET", "/v1/secrets/db?tenant="+tenantA, "", http.StatusOK); sec.Tenant != tenantA || sec.Version != 2 {
		t.Fatalf("the admin as A: %+v", sec)
	}
	do(keys.a, "GET", "/v1/secrets/db?tenant="+tenantB, "", http.StatusForbidden)
	do(keys.a, "DELETE", "/v1/secrets/db", "", http.StatusNoContent)
	do(keys.a, "DELETE", "/v1/secrets/db", "", http.StatusNotFound)
	for _, a := range answers {
		if strings.Contains(a, value) || strings.Contains(a, rotated) {
			t.Errorf("an answer holds the value: %s", a)
		}
	}
}
