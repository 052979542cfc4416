package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/torpor-dev/torpor"
)

// CreateSandbox inserts sb with Version 1, and events, in one transaction.
// An existing id is a conflict. sb.Version is set to 1 once committed.
func (s *Store) CreateSandbox(ctx context.Context, sb *torpor.Sandbox, events ...torpor.Event) error {
	if err := checkSandbox(sb); err != nil {
		return err
	}
	record, err := encodeRecord(sb)
	if err != nil {
		return err
	}
	op := fmt.Sprintf("create sandbox %q", sb.ID)
	err = s.inTx(ctx, op, func(tx *sql.Tx) error {
		if err := s.checkFence(ctx, tx); err != nil {
			return err
		}
		_, err := tx.ExecContext(ctx,
			`INSERT INTO sandboxes (id, tenant, state, node, created_at, version, record, seen_at) VALUES (?, ?, ?, ?, ?, 1, ?, ?)`,
			sb.ID, sb.Tenant, string(sb.State), sb.Node, micros(sb.CreatedAt), record, micros(sb.Usage.SeenAt))
		if err != nil {
			return wrap(err, fmt.Sprintf("sandbox %q already exists", sb.ID), op)
		}
		if err := s.insertMetadata(ctx, tx, sb.ID, sb.Metadata); err != nil {
			return err
		}
		return s.insertEvents(ctx, tx, events)
	})
	if err != nil {
		return err
	}
	sb.Version = 1
	return nil
}

// UpdateSandbox replaces the stored record if its Version equals
// sb.Version, and appends events, in one transaction. A stale Version is a
// conflict and changes nothing; a missing sandbox is not_found. sb.Version
// is incremented once committed.
func (s *Store) UpdateSandbox(ctx context.Context, sb *torpor.Sandbox, events ...torpor.Event) error {
	return s.UpdateSandboxUsage(ctx, sb, nil, events...)
}

// UpdateSandboxUsage is UpdateSandbox that also appends usage rows, in the
// same transaction.
func (s *Store) UpdateSandboxUsage(ctx context.Context, sb *torpor.Sandbox, usage []torpor.UsageRecord, events ...torpor.Event) error {
	if err := checkSandbox(sb); err != nil {
		return err
	}
	record, err := encodeRecord(sb)
	if err != nil {
		return err
	}
	op := fmt.Sprintf("update sandbox %q", sb.ID)
	err = s.inTx(ctx, op, func(tx *sql.Tx) error {
		if err := s.checkFence(ctx, tx); err != nil {
			return err
		}
		res, err := tx.StmtContext(ctx, s.stmts.updateSandbox).ExecContext(ctx,
			sb.Tenant, string(sb.State), sb.Node, micros(sb.CreatedAt), record, micros(sb.Usage.SeenAt), sb.ID, sb.Version)
		if err != nil {
			return wrap(err, fmt.Sprintf("sandbox %q changed in a conflicting way", sb.ID), op)
		}
		n, err := res.RowsAffected()
		if err != nil {
			return wrap(err, "", op)
		}
		if n == 0 {
			return staleOrMissing(ctx, tx, sb)
		}
		if _, err := tx.StmtContext(ctx, s.stmts.deleteMetadata).ExecContext(ctx, sb.ID); err != nil {
			return wrap(err, "", op)
		}
		if err := s.insertMetadata(ctx, tx, sb.ID, sb.Metadata); err != nil {
			return err
		}
		if err := s.insertUsage(ctx, tx, usage); err != nil {
			return err
		}
		return s.insertEvents(ctx, tx, events)
	})
	if err != nil {
		return err
	}
	sb.Version++
	return nil
}

// staleOrMissing explains why an update matched no row: the sandbox is
// gone (not_found) or someone else updated it first (conflict).
func staleOrMissing(ctx context.Context, tx *sql.Tx, sb *torpor.Sandbox) error {
	var version int64
	err := tx.QueryRowContext(ctx, `SELECT version FROM sandboxes WHERE id = ?`, sb.ID).Scan(&version)
	if errors.Is(err, sql.ErrNoRows) {
		return torpor.Errorf(torpor.ENotFound, "sandbox %q not found", sb.ID)
	}
	if err != nil {
		return wrap(err, "", fmt.Sprintf("update sandbox %q", sb.ID))
	}
	return torpor.Errorf(torpor.EConflict,
		"sandbox %q was changed concurrently (version %d, not %d); read it again and retry", sb.ID, version, sb.Version)
}

// checkSandbox refuses a record no store could key.
func checkSandbox(sb *torpor.Sandbox) error {
	if sb == nil {
		return torpor.Invalid("sandbox", "no sandbox given")
	}
	if sb.ID == "" {
		return torpor.Invalid("id", "sandbox id is empty")
	}
	return nil
}

// insertMetadata writes the metadata index rows of a sandbox.
func (s *Store) insertMetadata(ctx context.Context, tx *sql.Tx, id string, md map[string]string) error {
	if len(md) == 0 {
		return nil
	}
	stmt := tx.StmtContext(ctx, s.stmts.insertMetadata)
	for k, v := range md {
		if _, err := stmt.ExecContext(ctx, id, k, v); err != nil {
			return wrap(err, "", fmt.Sprintf("index metadata of sandbox %q", id))
		}
	}
	return nil
}

// GetSandbox returns the sandbox with the given id, or not_found.
func (s *Store) GetSandbox(ctx context.Context, id string) (*torpor.Sandbox, error) {
	row := s.read.QueryRowContext(ctx,
		`SELECT id, tenant, state, node, created_at, version, record, seen_at FROM sandboxes WHERE id = ?`, id)
	sb, err := scanSandbox(row)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, torpor.Errorf(torpor.ENotFound, "sandbox %q not found", id)
	}
	if err != nil {
		return nil, wrap(err, "", fmt.Sprintf("get sandbox %q", id))
	}
	return sb, nil
}

// ListSandboxes returns the sandboxes that match f, oldest first (by
// creation time, then id), past f.After and at most f.Limit of them.
func (s *Store) ListSandboxes(ctx context.Context, f torpor.SandboxFilter) ([]*torpor.Sandbox, error) {
	where, args := sandboxConditions(f)
	query := `SELECT id, tenant, state, node, created_at, version, record, seen_at FROM sandboxes`
	if len(where) > 0 {
		query += " WHERE " + strings.Join(where, " AND ")
	}
	query += " ORDER BY created_at, id"
	if f.Limit > 0 {
		query += " LIMIT ?"
		args = append(args, f.Limit)
	}

	rows, err := s.read.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, wrap(err, "", "list sandboxes")
	}
	defer rows.Close()
	var out []*torpor.Sandbox
	for rows.Next() {
		sb, err := scanSandbox(rows)
		if err != nil {
			return nil, wrap(err, "", "list sandboxes")
		}
		out = append(out, sb)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap(err, "", "list sandboxes")
	}
	return out, nil
}

// sandboxConditions turns f into WHERE conditions and their arguments.
// Only placeholders reach the SQL text; every value is an argument.
func sandboxConditions(f torpor.SandboxFilter) (where []string, args []any) {
	if f.Tenant != "" {
		where = append(where, "tenant = ?")
		args = append(args, f.Tenant)
	}
	if f.ExceptTenant != "" {
		where = append(where, "tenant <> ?")
		args = append(args, f.ExceptTenant)
	}
	if f.Node != "" {
		where = append(where, "node = ?")
		args = append(args, f.Node)
	}
	switch {
	case len(f.States) > 0:
		marks := strings.TrimSuffix(strings.Repeat("?, ", len(f.States)), ", ")
		where = append(where, "state IN ("+marks+")")
		for _, st := range f.States {
			args = append(args, string(st))
		}
	case !f.IncludeTerminated:
		where = append(where, "state <> ?")
		args = append(args, string(torpor.StateTerminated))
	}
	// Sorted keys: the same filter always makes the same SQL text.
	keys := make([]string, 0, len(f.Metadata))
	for k := range f.Metadata {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		where = append(where, "id IN (SELECT sandbox_id FROM sandbox_metadata WHERE key = ? AND value = ?)")
		args = append(args, k, f.Metadata[k])
	}
	if f.After.ID != "" {
		at := f.After.CreatedAt.UnixMicro()
		where = append(where, "(created_at > ? OR (created_at = ? AND id > ?))")
		args = append(args, at, at, f.After.ID)
	}
	return where, args
}

// scanner is a *sql.Row or *sql.Rows.
type scanner interface {
	Scan(dest ...any) error
}

// scanSandbox reads the columns id, tenant, state, node, created_at,
// version, record, seen_at.
func scanSandbox(sc scanner) (*torpor.Sandbox, error) {
	var (
		sb      torpor.Sandbox
		state   string
		created int64
		record  string
		seen    int64
	)
	if err := sc.Scan(&sb.ID, &sb.Tenant, &state, &sb.Node, &created, &sb.Version, &record, &seen); err != nil {
		return nil, err
	}
	sb.State = torpor.State(state)
	sb.CreatedAt = fromMicros(created)
	if err := decodeRecord(&sb, record); err != nil {
		return nil, err
	}
	sb.Usage.SeenAt = fromMicros(seen)
	return &sb, nil
}
