package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/store/sqlite"
)

// copyTable is one table `torpor store copy` moves: the SELECT that reads
// it from SQLite and the columns it fills in PostgreSQL, in the same
// order. bools are the positions of SQLite integers that are booleans
// here. Seq columns move as they are, so that event cursors and webhook
// cursors keep their meaning.
type copyTable struct {
	name    string
	query   string
	columns []string
	bools   []int
	// seq is the identity column whose sequence must carry on after the
	// copied rows, or "".
	seq string
}

// copyTables are in an order that satisfies the foreign keys.
var copyTables = []copyTable{
	{name: "tenants", query: `SELECT name, created_at, max_sandboxes, max_vcpus, max_memory_mib, max_disk_mib FROM tenants`,
		columns: []string{"name", "created_at", "max_sandboxes", "max_vcpus", "max_memory_mib", "max_disk_mib"}},
	{name: "api_keys", query: `SELECT id, tenant, admin, hash, created_at, tier FROM api_keys`,
		columns: []string{"id", "tenant", "admin", "hash", "created_at", "tier"}, bools: []int{2}},
	{name: "templates", query: `SELECT name, rootfs, created_at, record FROM templates`,
		columns: []string{"name", "rootfs", "created_at", "record"}},
	{name: "sandboxes", query: `SELECT id, tenant, state, node, coalesce(json_extract(record, '$.template'), ''), created_at, version, seen_at, record FROM sandboxes`,
		columns: []string{"id", "tenant", "state", "node", "template", "created_at", "version", "seen_at", "record"}},
	{name: "sandbox_metadata", query: `SELECT sandbox_id, key, value FROM sandbox_metadata`,
		columns: []string{"sandbox_id", "key", "value"}},
	{name: "events", query: `SELECT seq, type, sandbox_id, tenant, time, attrs FROM events ORDER BY seq`,
		columns: []string{"seq", "type", "sandbox_id", "tenant", "time", "attrs"}, seq: "seq"},
	{name: "webhooks", query: `SELECT id, tenant, url, secret, created_at, cursor FROM webhooks`,
		columns: []string{"id", "tenant", "url", "secret", "created_at", "cursor"}},
	// A secret's value is opened with the source's key and sealed again
	// with the target's, bound to the same tenant and name.
	{name: "secrets", query: `SELECT tenant, name, value, version, created_at, updated_at FROM secrets`,
		columns: []string{"tenant", "name", "value", "version", "created_at", "updated_at"}},
	{name: "volumes", query: `SELECT tenant, name, id, size_mib, node, created_at, updated_at FROM volumes`,
		columns: []string{"tenant", "name", "id", "size_mib", "node", "created_at", "updated_at"}},
	{name: "usage", query: `SELECT seq, sandbox_id, tenant, kind, start_us, end_us, seconds, vcpu_s, memory_gib_s, disk_gib_s, snapshot_gib_s, cost FROM usage ORDER BY seq`,
		columns: []string{"seq", "sandbox_id", "tenant", "kind", "start_us", "end_us", "seconds", "vcpu_s", "memory_gib_s", "disk_gib_s", "snapshot_gib_s", "cost"}, seq: "seq"},
	{name: "gpu_leases", query: `SELECT id, record FROM gpu_leases`, columns: []string{"id", "record"}},
	{name: "gpu_usage", query: `SELECT seq, lease_id, tenant, kind, cause, billed, start_us, end_us, seconds, gpus, slice_mib FROM gpu_usage ORDER BY seq`,
		columns: []string{"seq", "lease_id", "tenant", "kind", "cause", "billed", "start_us", "end_us", "seconds", "gpus", "slice_mib"}, bools: []int{5}, seq: "seq"},
	{name: "key_flags", query: `SELECT seq, key_id, tenant, at, record FROM key_flags ORDER BY seq`,
		columns: []string{"seq", "key_id", "tenant", "at", "record"}, seq: "seq"},
	{name: "pools", query: `SELECT template, size, allow_internet FROM pools`, columns: []string{"template", "size", "allow_internet"}, bools: []int{2}},
	// A node keeps its epoch, so that the epochs its sandboxes were taken
	// at stay its own.
	{name: "nodes", query: `SELECT name, address, proxy_address, host, state, epoch, joined_at, heartbeat_at, record, used, instance FROM nodes`,
		columns: []string{"name", "address", "proxy_address", "host", "state", "epoch", "joined_at", "heartbeat_at", "record", "used", "instance"}},
}

// Progress is told how far a copy is: rows of table done out of total.
type Progress func(table string, done, total int64)

// CopyFromSQLite moves everything in the SQLite database at srcPath into
// dst, in one PostgreSQL transaction: all of it or, on any error, none.
// It refuses a target that holds anything. Webhook secrets are opened
// with the key beside srcPath and sealed again with dst's key (the same
// file when dst's key directory is srcPath's). The source is opened as
// the daemon opens it (its schema brought up to date), then read in one
// read transaction; stop the daemon that uses it first.
func CopyFromSQLite(ctx context.Context, srcPath string, dst *Store, progress Progress) error {
	if progress == nil {
		progress = func(string, int64, int64) {}
	}
	// sqlite.Open would make a missing file: a typo must not copy nothing.
	if _, err := os.Stat(srcPath); err != nil {
		return fmt.Errorf("store copy: %w", err)
	}
	// Opening brings the schema to this build's version and seals any
	// plaintext secret; then the file is read directly.
	src, err := sqlite.Open(ctx, srcPath)
	if err != nil {
		return err
	}
	src.Close()
	srcKey, err := sqlite.LoadWebhookKey(filepath.Dir(src.Path()), nil)
	if err != nil {
		return fmt.Errorf("store copy: %w", err)
	}
	db, err := sql.Open("sqlite", (&url.URL{Scheme: "file", Path: src.Path(), RawQuery: "mode=ro&_busy_timeout=10000"}).String())
	if err != nil {
		return fmt.Errorf("store copy: open %s: %w", src.Path(), err)
	}
	defer db.Close()
	rtx, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return fmt.Errorf("store copy: read %s: %w", src.Path(), err)
	}
	defer rtx.Rollback()

	return dst.inTx(ctx, "copy", func(tx pgx.Tx) error {
		// The log lock keeps a daemon from writing events meanwhile;
		// the emptiness check is in this transaction.
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(logLockKey)); err != nil {
			return wrap(err, "", "copy")
		}
		if err := checkEmpty(ctx, tx); err != nil {
			return err
		}
		for _, t := range copyTables {
			if err := copyOne(ctx, rtx, tx, t, srcKey, dst.secrets, progress); err != nil {
				return err
			}
		}
		return nil
	})
}

// checkEmpty refuses a target with any row in any of torpor's tables.
func checkEmpty(ctx context.Context, tx pgx.Tx) error {
	var parts []string
	for _, t := range copyTables {
		parts = append(parts, fmt.Sprintf("(SELECT count(*) FROM (SELECT 1 FROM %s LIMIT 1) x)", t.name))
	}
	var n int64
	if err := tx.QueryRow(ctx, `SELECT `+strings.Join(parts, " + ")).Scan(&n); err != nil {
		return wrap(err, "", "check the target is empty")
	}
	if n > 0 {
		return torpor.Errorf(torpor.EConflict, "the target database already holds torpor state; copy only into a new, empty database")
	}
	return nil
}

// copyOne moves one table with COPY, then moves its sequence past the
// copied numbers (and past SQLite's own counter, which never reuses a
// number either), and checks the row count.
func copyOne(ctx context.Context, rtx *sql.Tx, tx pgx.Tx, t copyTable, srcKey, dstKey *sqlite.SecretBox, progress Progress) error {
	var total int64
	if err := rtx.QueryRowContext(ctx, `SELECT count(*) FROM `+t.name).Scan(&total); err != nil {
		return fmt.Errorf("store copy: count %s: %w", t.name, err)
	}
	rows, err := rtx.QueryContext(ctx, t.query)
	if err != nil {
		return fmt.Errorf("store copy: read %s: %w", t.name, err)
	}
	defer rows.Close()
	var done int64
	src := &sqlRows{rows: rows, n: len(t.columns), convert: func(v []any) error {
		for _, i := range t.bools {
			n, _ := v[i].(int64)
			v[i] = n != 0
		}
		if t.name == "webhooks" {
			id, _ := v[0].(string)
			stored, _ := v[3].(string)
			secret, _, err := srcKey.Open(id, stored)
			if err != nil {
				return err
			}
			v[3] = dstKey.Seal(id, secret)
		}
		if t.name == "secrets" {
			tenant, _ := v[0].(string)
			name, _ := v[1].(string)
			stored, _ := v[2].(string)
			value, err := srcKey.OpenSecret(tenant, name, stored)
			if err != nil {
				return err
			}
			v[2] = dstKey.SealSecret(tenant, name, value)
		}
		if done++; done%10000 == 0 {
			progress(t.name, done, total)
		}
		return nil
	}}
	n, err := tx.CopyFrom(ctx, pgx.Identifier{t.name}, t.columns, src)
	if err != nil {
		return wrap(err, fmt.Sprintf("store copy: %s: a row conflicts with another", t.name), "copy "+t.name)
	}
	if n != total {
		return fmt.Errorf("store copy: %s: wrote %d rows of %d", t.name, n, total)
	}
	progress(t.name, n, total)
	if t.seq == "" {
		return nil
	}
	var next int64
	err = rtx.QueryRowContext(ctx, `SELECT max(coalesce((SELECT max(`+t.seq+`) FROM `+t.name+`), 0),
		coalesce((SELECT seq FROM sqlite_sequence WHERE name = ?), 0))`, t.name).Scan(&next)
	if err != nil {
		return fmt.Errorf("store copy: %s: read its counter: %w", t.name, err)
	}
	if next > 0 {
		if _, err := tx.Exec(ctx, `SELECT setval(pg_get_serial_sequence($1, $2), $3)`, t.name, t.seq, next); err != nil {
			return wrap(err, "", "copy "+t.name)
		}
	}
	return nil
}

// sqlRows is a pgx.CopyFromSource over database/sql rows.
type sqlRows struct {
	rows    *sql.Rows
	n       int
	convert func([]any) error
	vals    []any
	err     error
}

func (s *sqlRows) Next() bool {
	if s.err != nil || !s.rows.Next() {
		return false
	}
	s.vals = make([]any, s.n)
	ptrs := make([]any, s.n)
	for i := range s.vals {
		ptrs[i] = &s.vals[i]
	}
	if err := s.rows.Scan(ptrs...); err != nil {
		s.err = err
		return false
	}
	for i, v := range s.vals {
		if b, ok := v.([]byte); ok {
			s.vals[i] = string(b)
		}
	}
	if err := s.convert(s.vals); err != nil {
		s.err = err
		return false
	}
	return true
}

func (s *sqlRows) Values() ([]any, error) { return s.vals, nil }

func (s *sqlRows) Err() error {
	return errors.Join(s.err, s.rows.Err())
}
