package sqlite_test

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/store/sqlite"
)

// TestSecretsAreSealedAtRest: neither the database nor its log holds a
// secret's value; a sealed value copied into another row (another name,
// another tenant) does not open there; and without the key the store
// refuses to open rather than lose the secrets.
func TestSecretsAreSealedAtRest(t *testing.T) {
	const value = "tv-distinctive-7f3a9c"
	path := filepath.Join(t.TempDir(), "torpor.db")
	s := open(t, path)
	ctx := t.Context()
	for _, tn := range []string{"acme", "other"} {
		if err := s.CreateTenant(ctx, torpor.Tenant{Name: tn, CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	for _, name := range []string{"db", "cache"} {
		if _, err := s.SetSecret(ctx, "acme", name, []byte(value), time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := s.SetSecret(ctx, "other", "db", []byte("x"), time.Now()); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{path, path + "-wal"} {
		b, err := os.ReadFile(f)
		if err != nil && !os.IsNotExist(err) {
			t.Fatal(err)
		}
		if bytes.Contains(b, []byte(value)) {
			t.Fatalf("%s holds the value", f)
		}
	}
	db := rawDB(t, path)
	var stored string
	if err := db.QueryRowContext(ctx, `SELECT value FROM secrets WHERE tenant = 'acme' AND name = 'db'`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(stored, "sealed:v1:") {
		t.Fatalf("stored value %q, want it sealed", stored)
	}
	for _, row := range [][2]string{{"acme", "cache"}, {"other", "db"}} {
		if _, err := db.ExecContext(ctx, `UPDATE secrets SET value = ? WHERE tenant = ? AND name = ?`, stored, row[0], row[1]); err != nil {
			t.Fatal(err)
		}
		_, err := s.SecretValue(ctx, row[0], row[1])
		if err == nil || strings.Contains(err.Error(), value) {
			t.Fatalf("a value moved to %s/%s: %v, want it not to open", row[0], row[1], err)
		}
	}
	if v, err := s.SecretValue(ctx, "acme", "db"); err != nil || string(v) != value {
		t.Fatalf("the value in its own row = %q, %v", v, err)
	}
	s.Close()
	os.Remove(filepath.Join(filepath.Dir(path), sqlite.WebhookKeyFile))
	if s, err := sqlite.Open(ctx, path); err == nil || !strings.Contains(err.Error(), "secret acme/db") {
		if s != nil {
			s.Close()
		}
		t.Fatalf("Open without the key: %v, want a refusal naming secret acme/db", err)
	}
}

// A sandbox's secret references (names and where they go) are part of its
// record.
func TestSandboxKeepsSecretRefs(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "torpor.db"))
	defer s.Close()
	refs := []torpor.SecretRef{{Name: "db", Env: "DB_PASSWORD"}, {Name: "tls.key", Path: "/run/secrets/tls.key"}}
	sb := &torpor.Sandbox{ID: "sb_1", Tenant: "acme", Template: "base", State: torpor.StateRunning, CreatedAt: time.Now().UTC().Truncate(time.Microsecond),
		Metadata: map[string]string{}, Secrets: refs}
	if err := s.CreateSandbox(t.Context(), sb); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetSandbox(t.Context(), "sb_1")
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Secrets) != 2 || got.Secrets[0] != refs[0] || got.Secrets[1] != refs[1] {
		t.Fatalf("secrets after a round trip = %+v, want %+v", got.Secrets, refs)
	}
}
