package sqlite_test

import (
	"path/filepath"
	"testing"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/store/sqlite"
)

// A database written by a schema-1 torpor (templates without a record
// column) opens, migrates to the current schema and keeps its templates.
func TestMigrateSchema1Templates(t *testing.T) {
	path := filepath.Join(t.TempDir(), "torpor.db")
	db := rawDB(t, path)
	for _, q := range []string{
		sqlite.Migration(0),
		`INSERT INTO templates (name, rootfs, created_at) VALUES ('base', '/var/lib/torpor/templates/base/rootfs', 1)`,
		`PRAGMA user_version = 1`,
	} {
		if _, err := db.ExecContext(t.Context(), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	db.Close()

	s := open(t, path)
	defer s.Close()
	if got := userVersion(t, path); got != sqlite.SchemaVersion() {
		t.Fatalf("user_version after the migration = %d, want %d", got, sqlite.SchemaVersion())
	}
	tpl, err := s.GetTemplate(t.Context(), "base")
	if err != nil {
		t.Fatalf("GetTemplate after the migration: %v", err)
	}
	if tpl.RootFS != "/var/lib/torpor/templates/base/rootfs" || len(tpl.Layers) != 0 || tpl.Source != (torpor.TemplateSource{}) {
		t.Errorf("migrated template = %+v", tpl)
	}
}

// A database written before tenants had quotas (schema 6) keeps its
// tenants, which come back without limits, and takes a quota afterwards.
func TestMigrateSchema6TenantsGetNoQuota(t *testing.T) {
	path := filepath.Join(t.TempDir(), "torpor.db")
	db := rawDB(t, path)
	for i := range 6 {
		if _, err := db.ExecContext(t.Context(), sqlite.Migration(i)); err != nil {
			t.Fatalf("migration %d: %v", i+1, err)
		}
	}
	for _, q := range []string{
		`INSERT INTO tenants (name, created_at) VALUES ('acme', 1)`,
		`PRAGMA user_version = 6`,
	} {
		if _, err := db.ExecContext(t.Context(), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	db.Close()

	s := open(t, path)
	defer s.Close()
	tn, err := s.GetTenant(t.Context(), "acme")
	if err != nil {
		t.Fatalf("GetTenant after the migration: %v", err)
	}
	if tn.Quota != (torpor.Quota{}) {
		t.Errorf("migrated tenant's quota = %+v, want none", tn.Quota)
	}
	q := torpor.Quota{MaxSandboxes: 3, MaxVCPUs: 1.5}
	if err := s.SetTenantQuota(t.Context(), "acme", q); err != nil {
		t.Fatal(err)
	}
	if tn, err = s.GetTenant(t.Context(), "acme"); err != nil || tn.Quota != q {
		t.Errorf("GetTenant after SetTenantQuota = %+v, %v; want quota %+v", tn, err, q)
	}
}
