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

const testSecret = "whsec_0123456789abcdefghijklmnopqrstuvwxyzABCD"

// storedSecret is the secret column of webhook id as the file holds it.
func storedSecret(t *testing.T, path, id string) string {
	t.Helper()
	var v string
	if err := rawDB(t, path).QueryRowContext(t.Context(), `SELECT secret FROM webhooks WHERE id = ?`, id).Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

// webhookSecret is what the store gives back as webhook id's secret.
func webhookSecret(t *testing.T, s *sqlite.Store, id string) string {
	t.Helper()
	hooks, err := s.ListWebhooks(t.Context(), "")
	if err != nil {
		t.Fatal(err)
	}
	for _, w := range hooks {
		if w.ID == id {
			return w.Secret
		}
	}
	t.Fatalf("no webhook %q in %+v", id, hooks)
	return ""
}

// TestWebhookSecretsAreSealedAtRest: the database file never holds a
// webhook's secret, yet the store gives it back, across a reopen; the key
// is private to the user.
func TestWebhookSecretsAreSealedAtRest(t *testing.T) {
	path := filepath.Join(t.TempDir(), "torpor.db")
	s := open(t, path)
	ctx := t.Context()
	if err := s.CreateTenant(ctx, torpor.Tenant{Name: "acme", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateWebhook(ctx, torpor.Webhook{ID: "wh_1", Tenant: "acme", URL: "https://hooks.example.com/", Secret: testSecret, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if got := webhookSecret(t, s, "wh_1"); got != testSecret {
		t.Fatalf("secret = %q, want %q", got, testSecret)
	}
	if v := storedSecret(t, path, "wh_1"); strings.Contains(v, testSecret) || !strings.HasPrefix(v, "sealed:v1:") {
		t.Fatalf("the row holds %q", v)
	}
	for _, f := range []string{path, path + "-wal"} {
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(data, []byte(testSecret)) {
			t.Fatalf("%s holds the secret", f)
		}
	}
	st, err := os.Stat(filepath.Join(filepath.Dir(path), sqlite.WebhookKeyFile))
	if err != nil || st.Mode() != 0o600 || st.Size() != 32 {
		t.Fatalf("the key file: %v %v", st, err)
	}
	s.Close()
	s = open(t, path)
	defer s.Close()
	if got := webhookSecret(t, s, "wh_1"); got != testSecret {
		t.Fatalf("after a reopen, secret = %q", got)
	}
}

// TestWebhookSecretsInPlaintextAreSealedAtOpen: a secret an older torpor
// stored in plaintext still works, and is sealed when the store opens.
func TestWebhookSecretsInPlaintextAreSealedAtOpen(t *testing.T) {
	path := filepath.Join(t.TempDir(), "torpor.db")
	s := open(t, path)
	if err := s.CreateTenant(t.Context(), torpor.Tenant{Name: "acme", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := rawDB(t, path).ExecContext(t.Context(), `INSERT INTO webhooks (id, tenant, url, secret, created_at) VALUES ('wh_old', 'acme', 'https://x.example/', ?, 0)`, testSecret); err != nil {
		t.Fatal(err)
	}
	s = open(t, path)
	defer s.Close()
	if got := webhookSecret(t, s, "wh_old"); got != testSecret {
		t.Fatalf("the old webhook's secret = %q", got)
	}
	if v := storedSecret(t, path, "wh_old"); strings.Contains(v, testSecret) || !strings.HasPrefix(v, "sealed:v1:") {
		t.Fatalf("after the open, the old row holds %q", v)
	}
}

// TestWebhookSecretsNeedTheirKey: without the key that sealed them, the
// store refuses to open rather than make a new key, and a sealed secret
// moved to another row does not open.
func TestWebhookSecretsNeedTheirKey(t *testing.T) {
	path := filepath.Join(t.TempDir(), "torpor.db")
	keyFile := filepath.Join(filepath.Dir(path), sqlite.WebhookKeyFile)
	s := open(t, path)
	ctx := t.Context()
	s.CreateTenant(ctx, torpor.Tenant{Name: "acme", CreatedAt: time.Now()})
	for _, id := range []string{"wh_1", "wh_2"} {
		if err := s.CreateWebhook(ctx, torpor.Webhook{ID: id, Tenant: "acme", URL: "https://x.example/", Secret: testSecret + id, CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	s.Close()

	if _, err := rawDB(t, path).ExecContext(ctx, `UPDATE webhooks SET secret = (SELECT secret FROM webhooks WHERE id = 'wh_1') WHERE id = 'wh_2'`); err != nil {
		t.Fatal(err)
	}
	if s, err := sqlite.Open(ctx, path); err == nil || !strings.Contains(err.Error(), `"wh_2"`) {
		if err == nil {
			s.Close()
		}
		t.Fatalf("open with a secret moved to another row: %v", err)
	}

	key, _ := os.ReadFile(keyFile)
	os.Remove(keyFile)
	if s, err := sqlite.Open(ctx, path); err == nil || !strings.Contains(err.Error(), "webhook.key is missing") {
		if err == nil {
			s.Close()
		}
		t.Fatalf("open without the key: %v", err)
	}
	if _, err := os.Stat(keyFile); !os.IsNotExist(err) {
		t.Fatalf("a new key was made: %v", err)
	}
	os.WriteFile(keyFile, key, 0o600)
	if _, err := rawDB(t, path).ExecContext(ctx, `DELETE FROM webhooks WHERE id = 'wh_2'`); err != nil {
		t.Fatal(err)
	}
	s = open(t, path)
	defer s.Close()
	if got := webhookSecret(t, s, "wh_1"); got != testSecret+"wh_1" {
		t.Fatalf("with the key back, secret = %q", got)
	}
}
