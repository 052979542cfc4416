package daemon

import (
	"context"
	"fmt"
	"log/slog"
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
	torpor.NodeStore
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
func openStore(ctx context.Context, cfg Config, node string, log *slog.Logger) (nodeStore, string, error) {
	if cfg.Store == "" {
		path := filepath.Join(cfg.DataDir, DBFile)
		st, err := sqlite.Open(ctx, path)
		return st, path, err
	}
	// Node: a second daemon that would run as the same node is refused;
	// other nodes share the database (docs/fleet.md). (Exclusive, which
	// a node name replaces, keeps a daemon without one to itself.)
	st, err := postgres.Open(ctx, postgres.Options{URL: cfg.Store, KeyDir: cfg.DataDir, Exclusive: true, Node: node, Logger: log})
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
