package client_test

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/torpor-dev/torpor/client"
)

// The secrets calls send the routes of docs/api.md, the value in a PUT's
// body only (never in the URL), and read the metadata answers.
func TestSecretsCalls(t *testing.T) {
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = append(seen, r.Method+" "+r.URL.RequestURI())
		w.Header().Set("Content-Type", "application/json")
		meta := `{"tenant":"acme","name":"db.x","version":2,"created_at":"2026-01-01T00:00:00Z","updated_at":"2026-01-02T00:00:00Z"}`
		switch r.Method {
		case "PUT":
			b, _ := io.ReadAll(r.Body)
			var body map[string]string
			if err := json.Unmarshal(b, &body); err != nil || body["value"] != "hunter2" || len(body) != 1 {
				t.Errorf("PUT body %s, want {\"value\":\"hunter2\"}", b)
			}
			w.Write([]byte(meta))
		case "GET":
			if r.URL.Path == "/v1/secrets" {
				w.Write([]byte(`{"secrets":[` + meta + `]}`))
				return
			}
			w.Write([]byte(meta))
		case "DELETE":
			w.WriteHeader(http.StatusNoContent)
		}
	}))
	defer srv.Close()
	cl, _ := client.New(srv.URL, "k")
	ctx := t.Context()
	sec, err := cl.SetSecret(ctx, "db.x", "hunter2")
	if err != nil || sec.Version != 2 || sec.Name != "db.x" {
		t.Fatalf("SetSecret: %+v, %v", sec, err)
	}
	list, err := cl.ListSecrets(ctx)
	if err != nil || len(list) != 1 || list[0].Tenant != "acme" {
		t.Fatalf("ListSecrets: %+v, %v", list, err)
	}
	if sec, err := cl.GetSecret(ctx, "db.x"); err != nil || !sec.UpdatedAt.After(sec.CreatedAt) {
		t.Fatalf("GetSecret: %+v, %v", sec, err)
	}
	if err := cl.DeleteSecret(ctx, "db.x"); err != nil {
		t.Fatal(err)
	}
	want := []string{"PUT /v1/secrets/db.x", "GET /v1/secrets", "GET /v1/secrets/db.x", "DELETE /v1/secrets/db.x"}
	if len(seen) != len(want) {
		t.Fatalf("requests %q, want %q", seen, want)
	}
	for i := range want {
		if seen[i] != want[i] {
			t.Errorf("request %d = %q, want %q", i, seen[i], want[i])
		}
	}
}
