package daemon

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/gpu/gpulease"
	"github.com/torpor-dev/torpor/store/postgres"
	"github.com/torpor-dev/torpor/store/sqlite"
)

// DBFile is the name, under the data dir, of the SQLite database: the
// store when the store setting is empty.
const DBFile = "torpor.db"

// nodeStore is what the daemon keeps in its store: everything
// torpor.Store says, GPU leases and key flags. Both stores are one.
type nodeStore interface {
	torpor.Store
	gpulease.Store
	gpulease.Flagger
}

var (
	_ nodeStore = (*sqlite.Store)(nil)
	_ nodeStore = (*postgres.Store)(nil)
)

// openStore opens the store the store setting names: the SQLite file in
// the data dir when it is empty, else the PostgreSQL database at its URL,
// with the webhook key in the data dir either way. It returns the store
// and where it is, without a password, for the log.
func openStore(ctx context.Context, cfg Config) (nodeStore, string, error) {
	if cfg.Store == "" {
		path := filepath.Join(cfg.DataDir, DBFile)
		st, err := sqlite.Open(ctx, path)
		return st, path, err
	}
	// Exclusive: the daemon takes every sandbox in its store for its own,
	// so a second daemon on the same database is refused.
	st, err := postgres.Open(ctx, postgres.Options{URL: cfg.Store, KeyDir: cfg.DataDir, Exclusive: true})
	if err != nil {
		return nil, "", err
	}
	return st, st.Where(), nil
}

// checkStore validates the store setting: empty, or a postgres:// URL.
// The message never repeats the URL's password.
func checkStore(s string) error {
	if s == "" || postgres.IsURL(s) {
		return nil
	}
	return fmt.Errorf("store must be empty (the SQLite file DATA_DIR/%s) or a postgres:// URL, got %q", DBFile, postgres.Redact(s))
}
