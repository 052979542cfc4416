package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"

	"github.com/torpor-dev/torpor/gpu/gpulease"
)

// gpuSchema is migration 6: GPU lease records, their usage rows and the
// abuse flags the watchdog raises on API keys.
const gpuSchema = `
CREATE TABLE gpu_leases (
	id     TEXT NOT NULL PRIMARY KEY,
	record TEXT NOT NULL
) STRICT;

CREATE TABLE gpu_usage (
	seq       INTEGER PRIMARY KEY AUTOINCREMENT,
	lease_id  TEXT    NOT NULL,
	tenant    TEXT    NOT NULL,
	kind      TEXT    NOT NULL,
	cause     TEXT    NOT NULL,
	billed    INTEGER NOT NULL,
	start_us  INTEGER NOT NULL,
	end_us    INTEGER NOT NULL,
	seconds   REAL    NOT NULL,
	gpus      INTEGER NOT NULL,
	slice_mib INTEGER NOT NULL,
	CHECK (end_us > start_us)
) STRICT;
-- A lease's second is written once.
CREATE UNIQUE INDEX gpu_usage_once ON gpu_usage (lease_id, start_us);
CREATE INDEX gpu_usage_by_tenant ON gpu_usage (tenant, start_us);

CREATE TABLE key_flags (
	seq     INTEGER PRIMARY KEY AUTOINCREMENT,
	key_id  TEXT    NOT NULL,
	tenant  TEXT    NOT NULL,
	at      INTEGER NOT NULL,
	record  TEXT    NOT NULL
) STRICT;
CREATE INDEX key_flags_by_key ON key_flags (key_id, seq);
`

// SaveLease stores a GPU lease's record and appends its new usage rows,
// in one transaction (gpulease.Store).
func (s *Store) SaveLease(ctx context.Context, rec gpulease.Record, rows []gpulease.UsageRow) error {
	data, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("sqlite store: encode GPU lease %q: %w", rec.Spec.ID, err)
	}
	op := fmt.Sprintf("save GPU lease %q", rec.Spec.ID)
	return s.inTx(ctx, op, func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO gpu_leases (id, record) VALUES (?, ?)
			ON CONFLICT (id) DO UPDATE SET record = excluded.record`, rec.Spec.ID, string(data)); err != nil {
			return wrap(err, "", op)
		}
		for _, r := range rows {
			if !r.End.After(r.Start) {
				continue
			}
			_, err := tx.ExecContext(ctx, `INSERT INTO gpu_usage (lease_id, tenant, kind, cause, billed, start_us, end_us, seconds, gpus, slice_mib)
				VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`, r.LeaseID, r.Tenant, string(r.Kind), r.Cause, r.Billed,
				micros(r.Start), micros(r.End), r.Seconds, r.GPUs, r.SliceMiB)
			if err != nil {
				return wrap(err, fmt.Sprintf("GPU lease %q already has a usage row from %s", r.LeaseID, r.Start), op)
			}
		}
		return nil
	})
}

// DeleteLease forgets a lease's record (its usage rows stay).
func (s *Store) DeleteLease(ctx context.Context, id string) error {
	return s.inTx(ctx, "delete GPU lease", func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `DELETE FROM gpu_leases WHERE id = ?`, id); err != nil {
			return wrap(err, "", "delete GPU lease")
		}
		return nil
	})
}

// ListLeases returns every stored lease record.
func (s *Store) ListLeases(ctx context.Context) ([]gpulease.Record, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT record FROM gpu_leases ORDER BY id`)
	if err != nil {
		return nil, wrap(err, "", "list GPU leases")
	}
	defer rows.Close()
	var out []gpulease.Record
	for rows.Next() {
		var data string
		if err := rows.Scan(&data); err != nil {
			return nil, wrap(err, "", "list GPU leases")
		}
		var rec gpulease.Record
		if err := json.Unmarshal([]byte(data), &rec); err != nil {
			return nil, fmt.Errorf("sqlite store: decode a GPU lease: %w", err)
		}
		out = append(out, rec)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap(err, "", "list GPU leases")
	}
	return out, nil
}

// ListGPUUsage returns a lease's usage rows, oldest first.
func (s *Store) ListGPUUsage(ctx context.Context, leaseID string) ([]gpulease.UsageRow, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT lease_id, tenant, kind, cause, billed, start_us, end_us, seconds, gpus, slice_mib
		FROM gpu_usage WHERE lease_id = ? ORDER BY start_us`, leaseID)
	if err != nil {
		return nil, wrap(err, "", "list GPU usage")
	}
	defer rows.Close()
	var out []gpulease.UsageRow
	for rows.Next() {
		var (
			r          gpulease.UsageRow
			kind       string
			start, end int64
		)
		if err := rows.Scan(&r.LeaseID, &r.Tenant, &kind, &r.Cause, &r.Billed, &start, &end, &r.Seconds, &r.GPUs, &r.SliceMiB); err != nil {
			return nil, wrap(err, "", "list GPU usage")
		}
		r.Kind, r.Start, r.End = gpulease.RowKind(kind), fromMicros(start), fromMicros(end)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap(err, "", "list GPU usage")
	}
	return out, nil
}

// FlagKey records an abuse flag on an API key (gpulease.Flagger).
func (s *Store) FlagKey(ctx context.Context, f gpulease.Flag) error {
	data, err := json.Marshal(f)
	if err != nil {
		return fmt.Errorf("sqlite store: encode a key flag: %w", err)
	}
	return s.inTx(ctx, "flag API key", func(tx *sql.Tx) error {
		if _, err := tx.ExecContext(ctx, `INSERT INTO key_flags (key_id, tenant, at, record) VALUES (?, ?, ?, ?)`,
			f.KeyID, f.Tenant, micros(f.At), string(data)); err != nil {
			return wrap(err, "", "flag API key")
		}
		return nil
	})
}

// KeyFlags returns the flags raised on a key, oldest first.
func (s *Store) KeyFlags(ctx context.Context, keyID string) ([]gpulease.Flag, error) {
	rows, err := s.read.QueryContext(ctx, `SELECT record FROM key_flags WHERE key_id = ? ORDER BY seq`, keyID)
	if err != nil {
		return nil, wrap(err, "", "list key flags")
	}
	defer rows.Close()
	var out []gpulease.Flag
	for rows.Next() {
		var data string
		if err := rows.Scan(&data); err != nil {
			return nil, wrap(err, "", "list key flags")
		}
		var f gpulease.Flag
		if err := json.Unmarshal([]byte(data), &f); err != nil {
			return nil, fmt.Errorf("sqlite store: decode a key flag: %w", err)
		}
		out = append(out, f)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap(err, "", "list key flags")
	}
	return out, nil
}
