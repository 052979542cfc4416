package postgres_test

import (
	"context"
	"errors"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/store/postgres"
	"github.com/torpor-dev/torpor/store/postgres/pgtest"
	"github.com/torpor-dev/torpor/store/storetest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// open opens the store at url with its webhook key in keyDir, or fails.
func open(t testing.TB, url, keyDir string) *postgres.Store {
	t.Helper()
	s, err := postgres.Open(t.Context(), postgres.Options{URL: url, KeyDir: keyDir})
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return s
}

func TestStore(t *testing.T) {
	storetest.Run(t, func(t *testing.T) (torpor.Store, func() torpor.Store) {
		url, dir := pgtest.NewDatabase(t), t.TempDir()
		return open(t, url, dir), func() torpor.Store { return open(t, url, dir) }
	})
}

// Daemons starting together on an empty database each open it: the
// migration lock makes one apply the schema and the others find it done.
func TestConcurrentOpenMigratesOnce(t *testing.T) {
	url, dir := pgtest.NewDatabase(t), t.TempDir()
	const n = 4
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() {
			s, err := postgres.Open(t.Context(), postgres.Options{URL: url, KeyDir: dir})
			if err == nil {
				s.Close()
			}
			errs[i] = err
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Errorf("Open %d: %v", i, err)
		}
	}
	conn := connect(t, url)
	var rows, top int
	if err := conn.QueryRow(t.Context(), `SELECT count(*), max(version) FROM torpor_schema`).Scan(&rows, &top); err != nil {
		t.Fatal(err)
	}
	if rows != postgres.SchemaVersion() || top != postgres.SchemaVersion() {
		t.Errorf("torpor_schema has %d rows up to version %d, want %d once each", rows, top, postgres.SchemaVersion())
	}
}

// A database written by a newer torpor is refused, with a message that
// says so and names the database without its password.
func TestRefusesNewerSchema(t *testing.T) {
	url, dir := pgtest.NewDatabase(t), t.TempDir()
	open(t, url, dir).Close()
	conn := connect(t, url)
	if _, err := conn.Exec(t.Context(), `INSERT INTO torpor_schema (version) VALUES ($1)`, postgres.SchemaVersion()+1); err != nil {
		t.Fatal(err)
	}
	withPassword := strings.Replace(url, "postgres@", "postgres:hunter2@", 1)
	_, err := postgres.Open(t.Context(), postgres.Options{URL: withPassword, KeyDir: dir})
	var sv *postgres.SchemaVersionError
	if !errors.As(err, &sv) || sv.Found != postgres.SchemaVersion()+1 {
		t.Fatalf("Open of a newer schema: %v, want a *SchemaVersionError", err)
	}
	if !strings.Contains(err.Error(), "newer than") || strings.Contains(err.Error(), "hunter2") {
		t.Errorf("error %q: want it to say the schema is newer, without the password", err)
	}
}

// Webhook secrets are sealed at rest with the key in the key directory,
// and a store opened without that key refuses rather than lose them.
func TestWebhookSecretsSealed(t *testing.T) {
	url, dir := pgtest.NewDatabase(t), t.TempDir()
	s := open(t, url, dir)
	ctx := t.Context()
	if err := s.CreateTenant(ctx, torpor.Tenant{Name: "acme"}); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateWebhook(ctx, torpor.Webhook{ID: "wh_1", Tenant: "acme", URL: "https://example.com/hook", Secret: "whsec_plain"}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	var stored string
	if err := connect(t, url).QueryRow(ctx, `SELECT secret FROM webhooks WHERE id = 'wh_1'`).Scan(&stored); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(stored, "whsec_plain") || !strings.HasPrefix(stored, "sealed:v1:") {
		t.Errorf("stored secret %q: want it sealed", stored)
	}
	s = open(t, url, dir)
	hooks, err := s.ListWebhooks(ctx, "acme")
	s.Close()
	if err != nil || len(hooks) != 1 || hooks[0].Secret != "whsec_plain" {
		t.Fatalf("ListWebhooks after reopen: %+v, %v", hooks, err)
	}
	if _, err := postgres.Open(ctx, postgres.Options{URL: url, KeyDir: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "wh_1") {
		t.Errorf("Open without the key: %v, want a refusal naming wh_1", err)
	}
}

// Redact hides a password wherever the URL carries one.
func TestRedact(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"postgres://torpor:s3cret@db.example.com:5432/torpor?sslmode=require", "postgres://torpor:xxxxx@db.example.com:5432/torpor?sslmode=require"},
		{"postgres://torpor@db/torpor?password=s3cret&sslmode=disable", "postgres://torpor@db/torpor?password=xxxxx&sslmode=disable"},
		{"postgresql://torpor@/torpor?host=/run/postgresql", "postgresql://torpor@/torpor?host=/run/postgresql"},
		{"postgres://a:b@%zz", "postgres://(unparsable URL)"},
	} {
		if got := postgres.Redact(c.in); got != c.want || strings.Contains(got, "s3cret") {
			t.Errorf("Redact(%q) = %q, want %q", c.in, got, c.want)
		}
	}
}

// A database that cannot be reached is unavailable (503 with Retry-After
// at the API), and the error holds no password.
func TestUnreachableIsUnavailable(t *testing.T) {
	_, err := postgres.Open(t.Context(), postgres.Options{
		URL: "postgres://torpor:s3cret@/torpor?host=" + t.TempDir() + "&connect_timeout=2", KeyDir: t.TempDir()})
	if err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Fatalf("Open of a missing server: %v; want an error without the password", err)
	}
}

func connect(t *testing.T, url string) *pgx.Conn {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	return conn
}
