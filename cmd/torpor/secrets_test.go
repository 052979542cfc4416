package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/torpor-dev/torpor"
)

func TestParseSecretRefs(t *testing.T) {
	refs, err := parseSecretRefs([]string{"db=env:DB_PASSWORD", "tls=path:/run/secrets/tls.key"})
	if err != nil || len(refs) != 2 || refs[0] != (torpor.SecretRef{Name: "db", Env: "DB_PASSWORD"}) ||
		refs[1] != (torpor.SecretRef{Name: "tls", Path: "/run/secrets/tls.key"}) {
		t.Fatalf("refs = %+v, %v", refs, err)
	}
	for _, bad := range []string{"db", "db=DB_PASSWORD", "db=file:/x", "=env:X", "db=env:"} {
		if _, err := parseSecretRefs([]string{bad}); err == nil {
			t.Errorf("--secret %q accepted", bad)
		}
	}
}

// secrets set reads the value from stdin, dropping one trailing newline,
// and sends it in the body; no output holds it.
func TestSecretsSetReadsStdin(t *testing.T) {
	var got map[string]string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != "PUT" || r.URL.Path != "/v1/secrets/db" {
			http.Error(w, `{"error":{"code":"not_found","message":"no"}}`, 404)
			return
		}
		b, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(b, &got)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(201)
		w.Write([]byte(`{"tenant":"acme","name":"db","version":1,"created_at":"2026-01-01T00:00:00Z","updated_at":"2026-01-01T00:00:00Z"}`))
	}))
	defer srv.Close()
	getenv := func(string) string { return "" }
	var stdout, stderr bytes.Buffer
	code := Run(context.Background(), []string{"--url", srv.URL, "--api-key", "k", "secrets", "set", "db"}, strings.NewReader("hunter2\n"), &stdout, &stderr, getenv)
	if code != 0 || got["value"] != "hunter2" || strings.TrimSpace(stdout.String()) != "db version 1" {
		t.Fatalf("exit %d, sent %q, stdout %q, stderr %q", code, got, stdout.String(), stderr.String())
	}
	for _, in := range []string{"", "\n", strings.Repeat("x", torpor.MaxSecretValueLen+1), "\xff\xfe"} {
		stdout.Reset()
		stderr.Reset()
		code := Run(context.Background(), []string{"--url", srv.URL, "--api-key", "k", "secrets", "set", "db"}, strings.NewReader(in), &stdout, &stderr, getenv)
		if code == 0 || (len(in) > 2 && strings.Contains(stderr.String(), in[:3])) {
			t.Errorf("value of %d bytes: exit %d, stderr %q", len(in), code, stderr.String())
		}
	}
}
