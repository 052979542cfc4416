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

// A sandbox written before fleets (schema 8) reads back owned by no node,
// with no durability (which the engine reads as node-only), and takes a
// node afterwards.
func TestMigrateSchema8SandboxesHaveNoNode(t *testing.T) {
	path := filepath.Join(t.TempDir(), "torpor.db")
	db := rawDB(t, path)
	for i := range 8 {
		if _, err := db.ExecContext(t.Context(), sqlite.Migration(i)); err != nil {
			t.Fatalf("migration %d: %v", i+1, err)
		}
	}
	for _, q := range []string{
		`INSERT INTO sandboxes (id, tenant, state, created_at, version, record, seen_at)
			VALUES ('sb_old', 'acme', 'hibernated', 1, 3, '{"template":"base","state_since_us":1,"last_activity_at_us":1,"resources":{},"metadata":null,"runtime":{"setup":null,"entrypoint":null},"pause_modes":null,"env":null,"timeout":{},"lifecycle_policy":{"pause_after_idle":{},"hibernate_after_paused":{},"connection_idle":{}},"meters":{}}', 0)`,
		`PRAGMA user_version = 8`,
	} {
		if _, err := db.ExecContext(t.Context(), q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	db.Close()

	s := open(t, path)
	defer s.Close()
	sb, err := s.GetSandbox(t.Context(), "sb_old")
	if err != nil {
		t.Fatalf("GetSandbox after the migration: %v", err)
	}
	if sb.Node != "" || sb.NodeEpoch != 0 || sb.Durability != "" || sb.Remote != nil || sb.Version != 3 {
		t.Errorf("migrated sandbox: node %q epoch %d durability %q remote %+v version %d; want none of them, version 3",
			sb.Node, sb.NodeEpoch, sb.Durability, sb.Remote, sb.Version)
	}
	sb.Node, sb.NodeEpoch = "node-a", 1
	if err := s.UpdateSandbox(t.Context(), sb); err != nil {
		t.Fatal(err)
	}
	got, err := s.ListSandboxes(t.Context(), torpor.SandboxFilter{Node: "node-a"})
	if err != nil || len(got) != 1 || got[0].NodeEpoch != 1 {
		t.Errorf("ListSandboxes of node-a after the update: %+v, %v", got, err)
	}
}
