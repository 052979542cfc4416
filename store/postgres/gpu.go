package postgres

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/torpor-dev/torpor/gpu/gpulease"
)

// SaveLease stores a GPU lease's record and appends its new usage rows,
// in one transaction (gpulease.Store).
func (s *Store) SaveLease(ctx context.Context, rec gpulease.Record, rows []gpulease.UsageRow) error {
	data, err := json.Marshal(rec)
	if err != nil {
		return fmt.Errorf("postgres store: encode GPU lease %q: %w", rec.Spec.ID, err)
	}
	op := fmt.Sprintf("save GPU lease %q", rec.Spec.ID)
	return s.inTx(ctx, op, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO gpu_leases (id, record) VALUES ($1, $2)
			ON CONFLICT (id) DO UPDATE SET record = excluded.record`, rec.Spec.ID, string(data)); err != nil {
			return wrap(err, "", op)
		}
		for _, r := range rows {
			if !r.End.After(r.Start) {
				continue
			}
			_, err := tx.Exec(ctx, `INSERT INTO gpu_usage (lease_id, tenant, kind, cause, billed, start_us, end_us, seconds, gpus, slice_mib)
				VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)`, r.LeaseID, r.Tenant, string(r.Kind), r.Cause, r.Billed,
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
	return s.inTx(ctx, "delete GPU lease", func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `DELETE FROM gpu_leases WHERE id = $1`, id); err != nil {
			return wrap(err, "", "delete GPU lease")
		}
		return nil
	})
}

// ListLeases returns every stored lease record.
func (s *Store) ListLeases(ctx context.Context) ([]gpulease.Record, error) {
	return listJSON[gpulease.Record](ctx, s, "list GPU leases", `SELECT record FROM gpu_leases ORDER BY id`)
}

// KeyFlags returns the flags raised on a key, oldest first.
func (s *Store) KeyFlags(ctx context.Context, keyID string) ([]gpulease.Flag, error) {
	return listJSON[gpulease.Flag](ctx, s, "list key flags", `SELECT record FROM key_flags WHERE key_id = $1 ORDER BY seq`, keyID)
}

// listJSON returns the rows of a query of one JSON column, decoded.
func listJSON[T any](ctx context.Context, s *Store, op, sql string, args ...any) ([]T, error) {
	return query(ctx, s, op, func(row pgx.CollectableRow) (T, error) {
		var (
			data string
			v    T
		)
		if err := row.Scan(&data); err != nil {
			return v, err
		}
		return v, json.Unmarshal([]byte(data), &v)
	}, sql, args...)
}

// ListGPUUsage returns a lease's usage rows, oldest first.
func (s *Store) ListGPUUsage(ctx context.Context, leaseID string) ([]gpulease.UsageRow, error) {
	return query(ctx, s, "list GPU usage", func(row pgx.CollectableRow) (gpulease.UsageRow, error) {
		var (
			r          gpulease.UsageRow
			kind       string
			start, end int64
		)
		err := row.Scan(&r.LeaseID, &r.Tenant, &kind, &r.Cause, &r.Billed, &start, &end, &r.Seconds, &r.GPUs, &r.SliceMiB)
		r.Kind, r.Start, r.End = gpulease.RowKind(kind), fromMicros(start), fromMicros(end)
		return r, err
	}, `SELECT lease_id, tenant, kind, cause, billed, start_us, end_us, seconds, gpus, slice_mib
		FROM gpu_usage WHERE lease_id = $1 ORDER BY start_us`, leaseID)
}

// FlagKey records an abuse flag on an API key (gpulease.Flagger).
func (s *Store) FlagKey(ctx context.Context, f gpulease.Flag) error {
	data, err := json.Marshal(f)
	if err != nil {
		return fmt.Errorf("postgres store: encode a key flag: %w", err)
	}
	return s.inTx(ctx, "flag API key", func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO key_flags (key_id, tenant, at, record) VALUES ($1, $2, $3, $4)`,
			f.KeyID, f.Tenant, micros(f.At), string(data)); err != nil {
			return wrap(err, "", "flag API key")
		}
		return nil
	})
}
