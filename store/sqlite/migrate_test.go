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
