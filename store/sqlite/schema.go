package sqlite

import (
	"context"
	"database/sql"
	"fmt"
)

// migrations returns the steps that build the schema: step i takes a
// database from schema version i to i+1, and PRAGMA user_version holds the
// version reached. Append new steps at the end; never edit one that has
// shipped.
func migrations() []string {
	return []string{
		// 1: the first schema.
		`
CREATE TABLE tenants (
	name       TEXT    NOT NULL PRIMARY KEY,
	created_at INTEGER NOT NULL
) STRICT;

CREATE TABLE api_keys (
	id         TEXT    NOT NULL PRIMARY KEY,
	tenant     TEXT    NOT NULL REFERENCES tenants (name),
	admin      INTEGER NOT NULL,
	hash       TEXT    NOT NULL UNIQUE,
	created_at INTEGER NOT NULL
) STRICT;
CREATE INDEX api_keys_by_tenant ON api_keys (tenant);

CREATE TABLE templates (
	name       TEXT    NOT NULL PRIMARY KEY,
	rootfs     TEXT    NOT NULL,
	created_at INTEGER NOT NULL
) STRICT;

-- The columns are what queries select and order by; record holds the rest
-- of the sandbox as JSON (see sandboxRecord).
CREATE TABLE sandboxes (
	id         TEXT    NOT NULL PRIMARY KEY,
	tenant     TEXT    NOT NULL,
	state      TEXT    NOT NULL,
	created_at INTEGER NOT NULL,
	version    INTEGER NOT NULL,
	record     TEXT    NOT NULL
) STRICT;
CREATE INDEX sandboxes_by_created ON sandboxes (created_at, id);
CREATE INDEX sandboxes_by_tenant ON sandboxes (tenant, created_at, id);
CREATE INDEX sandboxes_by_state ON sandboxes (state, created_at, id);

-- An index of sandbox metadata for filtering; the record's copy is the one
-- returned, so that nil and empty maps stay distinct.
CREATE TABLE sandbox_metadata (
	sandbox_id TEXT NOT NULL REFERENCES sandboxes (id) ON DELETE CASCADE,
	key        TEXT NOT NULL,
	value      TEXT NOT NULL,
	PRIMARY KEY (sandbox_id, key)
) STRICT, WITHOUT ROWID;
CREATE INDEX sandbox_metadata_by_pair ON sandbox_metadata (key, value, sandbox_id);

-- AUTOINCREMENT: a seq is never reused, even after the newest event is
-- removed, so a client's cursor stays meaningful.
CREATE TABLE events (
	seq        INTEGER PRIMARY KEY AUTOINCREMENT,
	type       TEXT    NOT NULL,
	sandbox_id TEXT    NOT NULL,
	tenant     TEXT    NOT NULL,
	time       INTEGER NOT NULL,
	attrs      TEXT
) STRICT;
CREATE INDEX events_by_sandbox ON events (sandbox_id, seq);
CREATE INDEX events_by_tenant ON events (tenant, seq);
`,
		// 2: templates keep their layers, source and defaults (JSON, see
		// templateRecord); sandboxes are found by template for the in-use
		// check.
		`
ALTER TABLE templates ADD COLUMN record TEXT NOT NULL DEFAULT '{}';
CREATE INDEX sandboxes_by_template ON sandboxes (json_extract(record, '$.template'), state);
`,
		// 3: webhooks and their delivery cursors (webhooks.go).
		webhooksSchema,
		// 4: the usage ledger and the last sign of life of each sandbox
		// (usage.go).
		usageSchema,
		// 5: API keys carry a tier.
		`ALTER TABLE api_keys ADD COLUMN tier TEXT NOT NULL DEFAULT 'standard';`,
		// 6: GPU leases, their usage rows, and abuse flags on keys (gpu.go).
		gpuSchema,
		// 7: tenants carry a quota; 0 is no limit.
		`
ALTER TABLE tenants ADD COLUMN max_sandboxes  INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tenants ADD COLUMN max_vcpus      REAL    NOT NULL DEFAULT 0;
ALTER TABLE tenants ADD COLUMN max_memory_mib INTEGER NOT NULL DEFAULT 0;
ALTER TABLE tenants ADD COLUMN max_disk_mib   INTEGER NOT NULL DEFAULT 0;
`,
		// 8: the warm pools set at run time (pools.go).
		poolsSchema,
		// 9: the fleet's nodes, and each sandbox's node (nodes.go).
		nodesSchema,
		// 10: the instance (data dir) each node joined from (nodes.go).
		nodeInstanceSchema,
		// 11: tenants' secrets, their values sealed (secrets.go).
		secretsSchema,
		// 12: tenants' volumes (volumes.go).
		volumesSchema,
	}
}

// SchemaVersionError is returned by Open for a database whose schema is
// newer than this build knows: a newer torpor wrote it, and an older one
// must not touch it.
type SchemaVersionError struct {
	Path string
	// Found is the database's schema version; Supported is the newest
	// this build knows.
	Found, Supported int
}

func (e *SchemaVersionError) Error() string {
	return fmt.Sprintf("sqlite store: %s has schema version %d, newer than the %d this torpor supports; run a torpor at least as new as the one that wrote it",
		e.Path, e.Found, e.Supported)
}

// migrate brings the schema to the newest version, in one transaction.
func migrate(ctx context.Context, db *sql.DB) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("sqlite store: migrate: %w", err)
	}
	defer tx.Rollback()

	steps := migrations()
	var version int
	if err := tx.QueryRowContext(ctx, "PRAGMA user_version").Scan(&version); err != nil {
		return fmt.Errorf("sqlite store: read schema version: %w", err)
	}
	if version > len(steps) {
		var path string
		if err := tx.QueryRowContext(ctx, "SELECT file FROM pragma_database_list WHERE name = 'main'").Scan(&path); err != nil {
			return fmt.Errorf("sqlite store: read database path: %w", err)
		}
		return &SchemaVersionError{Path: path, Found: version, Supported: len(steps)}
	}
	for v := version; v < len(steps); v++ {
		if _, err := tx.ExecContext(ctx, steps[v]); err != nil {
			return fmt.Errorf("sqlite store: migrate to schema version %d: %w", v+1, err)
		}
	}
	if version == len(steps) {
		return nil
	}
	// PRAGMA takes no parameters; the value is our own integer.
	if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", len(steps))); err != nil {
		return fmt.Errorf("sqlite store: set schema version: %w", err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("sqlite store: migrate: %w", err)
	}
	return nil
}
