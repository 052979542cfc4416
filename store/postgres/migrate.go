package postgres

import (
	"context"
	"embed"
	"fmt"
	"io/fs"
	"path"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"
)

// migrationFiles are the schema's steps: migrations/NNN_name.sql takes a
// database from version NNN-1 to NNN. Append new files; never edit one
// that has shipped.
//
//go:embed migrations/*.sql
var migrationFiles embed.FS

// migrateLockKey is the session advisory lock held while migrating, so
// that daemons starting together apply each step once. (An arbitrary
// constant: "torpor" in ASCII.)
const migrateLockKey = 0x746f72706f72

// SchemaVersionError is returned by Open for a database whose schema is
// newer than this build knows: a newer torpor wrote it, and an older one
// must not touch it.
type SchemaVersionError struct {
	Where string
	// Found is the database's schema version; Supported is the newest
	// this build knows.
	Found, Supported int
}

func (e *SchemaVersionError) Error() string {
	return fmt.Sprintf("postgres store: %s has schema version %d, newer than the %d this torpor supports; run a torpor at least as new as the one that wrote it",
		e.Where, e.Found, e.Supported)
}

// migrations returns the steps in order.
func migrations() ([]string, error) {
	names, err := fs.Glob(migrationFiles, "migrations/*.sql")
	if err != nil {
		return nil, err
	}
	slices.Sort(names)
	steps := make([]string, 0, len(names))
	for i, name := range names {
		n, err := strconv.Atoi(strings.SplitN(path.Base(name), "_", 2)[0])
		if err != nil || n != i+1 {
			return nil, fmt.Errorf("postgres store: migration %s is out of sequence (want number %d)", name, i+1)
		}
		b, err := migrationFiles.ReadFile(name)
		if err != nil {
			return nil, err
		}
		steps = append(steps, string(b))
	}
	return steps, nil
}

// SchemaVersion is the newest schema version this build knows.
func SchemaVersion() int {
	steps, _ := migrations()
	return len(steps)
}

// migrate brings the schema to the newest version. It holds a session
// advisory lock on one connection for the whole run; each step commits
// with its version row, so a daemon killed between steps resumes at the
// next one.
func migrate(ctx context.Context, pool *pgxpool.Pool, where string) error {
	steps, err := migrations()
	if err != nil {
		return err
	}
	conn, err := pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("postgres store: connect to %s: %w", where, err)
	}
	defer conn.Release()
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, int64(migrateLockKey)); err != nil {
		return fmt.Errorf("postgres store: %s: take the migration lock: %w", where, err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, int64(migrateLockKey))

	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS torpor_schema (
		version    INTEGER NOT NULL PRIMARY KEY,
		applied_at TIMESTAMPTZ NOT NULL DEFAULT now())`); err != nil {
		return fmt.Errorf("postgres store: %s: %w", where, err)
	}
	var version int
	if err := conn.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM torpor_schema`).Scan(&version); err != nil {
		return fmt.Errorf("postgres store: %s: read schema version: %w", where, err)
	}
	if version > len(steps) {
		return &SchemaVersionError{Where: where, Found: version, Supported: len(steps)}
	}
	for v := version; v < len(steps); v++ {
		tx, err := conn.Begin(ctx)
		if err != nil {
			return fmt.Errorf("postgres store: %s: migrate: %w", where, err)
		}
		_, err = tx.Exec(ctx, steps[v])
		if err == nil {
			_, err = tx.Exec(ctx, `INSERT INTO torpor_schema (version) VALUES ($1)`, v+1)
		}
		if err == nil {
			err = tx.Commit(ctx)
		}
		if err != nil {
			tx.Rollback(context.WithoutCancel(ctx))
			return fmt.Errorf("postgres store: %s: migrate to schema version %d: %w", where, v+1, err)
		}
	}
	return nil
}
