package postgres

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/store/sqlite"
)

// sandboxColumns are what scanSandbox reads, in its order.
const sandboxColumns = `id, tenant, state, node, created_at, version, record, seen_at`

// CreateSandbox inserts sb with Version 1, and events, in one transaction.
// An existing id is a conflict. sb.Version is set to 1 once committed.
func (s *Store) CreateSandbox(ctx context.Context, sb *torpor.Sandbox, events ...torpor.Event) error {
	if err := checkSandbox(sb); err != nil {
		return err
	}
	record, err := sqlite.EncodeSandboxRecord(sb)
	if err != nil {
		return err
	}
	op := fmt.Sprintf("create sandbox %q", sb.ID)
	err = s.inTx(ctx, op, func(tx pgx.Tx) error {
		fencing, err := s.fenceSteps()
		if err != nil {
			return err
		}
		steps := append(fencing, step{sql: `INSERT INTO sandboxes (id, tenant, state, node, template, created_at, version, record, seen_at)
			VALUES ($1, $2, $3, $4, $5, $6, 1, $7, $8)`,
			args: []any{sb.ID, sb.Tenant, string(sb.State), sb.Node, sb.Template, micros(sb.CreatedAt), record, micros(sb.Usage.SeenAt)},
			op:   op, conflict: fmt.Sprintf("sandbox %q already exists", sb.ID)})
		steps = append(steps, metadataSteps(sb.ID, sb.Metadata)...)
		steps, err = appendLog(steps, nil, events)
		if err != nil {
			return err
		}
		return runSteps(ctx, tx, steps)
	})
	if err != nil {
		return err
	}
	sb.Version = 1
	return nil
}

// UpdateSandbox replaces the stored record if its Version equals
// sb.Version, and appends events, in one transaction.
func (s *Store) UpdateSandbox(ctx context.Context, sb *torpor.Sandbox, events ...torpor.Event) error {
	return s.UpdateSandboxUsage(ctx, sb, nil, events...)
}

// UpdateSandboxUsage is UpdateSandbox that also appends usage rows, in the
// same transaction. The update is conditional on the version: a writer
// racing another on the same row waits for its commit, then matches no
// row and gets a conflict.
func (s *Store) UpdateSandboxUsage(ctx context.Context, sb *torpor.Sandbox, usage []torpor.UsageRecord, events ...torpor.Event) error {
	if err := checkSandbox(sb); err != nil {
		return err
	}
	for _, r := range usage {
		if !r.End.After(r.Start) {
			return torpor.Invalid("usage", "a usage row must end after it starts (%s, %s)", r.Start, r.End)
		}
	}
	record, err := sqlite.EncodeSandboxRecord(sb)
	if err != nil {
		return err
	}
	op := fmt.Sprintf("update sandbox %q", sb.ID)
	err = s.inTx(ctx, op, func(tx pgx.Tx) error {
		fencing, err := s.fenceSteps()
		if err != nil {
			return err
		}
		steps := append(fencing, step{sql: `UPDATE sandboxes SET tenant = $1, state = $2, node = $3, template = $4, created_at = $5,
			version = version + 1, record = $6, seen_at = GREATEST(seen_at, $7) WHERE id = $8 AND version = $9`,
			args: []any{sb.Tenant, string(sb.State), sb.Node, sb.Template, micros(sb.CreatedAt), record, micros(sb.Usage.SeenAt), sb.ID, sb.Version},
			op:   op, conflict: fmt.Sprintf("sandbox %q changed in a conflicting way", sb.ID),
			check: func(ct pgconn.CommandTag) error {
				if ct.RowsAffected() == 0 {
					return errNoRow
				}
				return nil
			}},
			step{sql: `DELETE FROM sandbox_metadata WHERE sandbox_id = $1`, args: []any{sb.ID}, op: op},
		)
		steps = append(steps, metadataSteps(sb.ID, sb.Metadata)...)
		steps, err = appendLog(steps, usage, events)
		if err != nil {
			return err
		}
		return runSteps(ctx, tx, steps)
	})
	if errors.Is(err, errNoRow) {
		// The batch ran on; what stands is read outside it.
		return s.staleOrMissing(ctx, sb)
	}
	if err != nil {
		return err
	}
	sb.Version++
	return nil
}

// staleOrMissing explains why an update matched no row: the sandbox is
// gone (not_found) or someone else updated it first (conflict).
func (s *Store) staleOrMissing(ctx context.Context, sb *torpor.Sandbox) error {
	var version int64
	err := s.pool.QueryRow(ctx, `SELECT version FROM sandboxes WHERE id = $1`, sb.ID).Scan(&version)
	if errors.Is(err, pgx.ErrNoRows) {
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

// metadataSteps write the metadata index rows of a sandbox, in one
// statement.
func metadataSteps(id string, md map[string]string) []step {
	if len(md) == 0 {
		return nil
	}
	keys := make([]string, 0, len(md))
	values := make([]string, 0, len(md))
	for k, v := range md {
		keys, values = append(keys, k), append(values, v)
	}
	return []step{{sql: `INSERT INTO sandbox_metadata (sandbox_id, key, value) SELECT $1, k, v FROM unnest($2::text[], $3::text[]) AS m (k, v)`,
		args: []any{id, keys, values}, op: fmt.Sprintf("index metadata of sandbox %q", id)}}
}

// GetSandbox returns the sandbox with the given id, or not_found.
func (s *Store) GetSandbox(ctx context.Context, id string) (*torpor.Sandbox, error) {
	sb, err := scanSandbox(s.pool.QueryRow(ctx, `SELECT `+sandboxColumns+` FROM sandboxes WHERE id = $1`, id))
	if errors.Is(err, pgx.ErrNoRows) {
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
	var (
		where []string
		args  []any
	)
	arg := func(v any) string {
		args = append(args, v)
		return "$" + strconv.Itoa(len(args))
	}
	if f.Tenant != "" {
		where = append(where, "tenant = "+arg(f.Tenant))
	}
	if f.ExceptTenant != "" {
		where = append(where, "tenant <> "+arg(f.ExceptTenant))
	}
	if f.Node != "" {
		where = append(where, "node = "+arg(f.Node))
	}
	switch {
	case len(f.States) > 0:
		states := make([]string, len(f.States))
		for i, st := range f.States {
			states[i] = string(st)
		}
		where = append(where, "state = ANY("+arg(states)+"::text[])")
	case !f.IncludeTerminated:
		where = append(where, "state <> "+arg(string(torpor.StateTerminated)))
	}
	// Sorted keys: the same filter always makes the same SQL text.
	keys := make([]string, 0, len(f.Metadata))
	for k := range f.Metadata {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		where = append(where, "id IN (SELECT sandbox_id FROM sandbox_metadata WHERE key = "+arg(k)+" AND value = "+arg(f.Metadata[k])+")")
	}
	if f.After.ID != "" {
		at := arg(f.After.CreatedAt.UnixMicro())
		where = append(where, "(created_at > "+at+" OR (created_at = "+at+" AND id > "+arg(f.After.ID)+"))")
	}
	sql := `SELECT ` + sandboxColumns + ` FROM sandboxes`
	if len(where) > 0 {
		sql += " WHERE " + strings.Join(where, " AND ")
	}
	sql += " ORDER BY created_at, id"
	if f.Limit > 0 {
		sql += " LIMIT " + arg(f.Limit)
	}
	return query(ctx, s, "list sandboxes", func(row pgx.CollectableRow) (*torpor.Sandbox, error) { return scanSandbox(row) }, sql, args...)
}

// scanSandbox reads the columns of sandboxColumns.
func scanSandbox(row pgx.Row) (*torpor.Sandbox, error) {
	var (
		sb      torpor.Sandbox
		state   string
		created int64
		record  string
		seen    int64
	)
	if err := row.Scan(&sb.ID, &sb.Tenant, &state, &sb.Node, &created, &sb.Version, &record, &seen); err != nil {
		return nil, err
	}
	sb.State = torpor.State(state)
	sb.CreatedAt = fromMicros(created)
	if err := sqlite.DecodeSandboxRecord(&sb, record); err != nil {
		return nil, err
	}
	sb.Usage.SeenAt = fromMicros(seen)
	return &sb, nil
}
