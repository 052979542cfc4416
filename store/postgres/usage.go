package postgres

import (
	"context"
	"slices"
	"time"

	"github.com/torpor-dev/torpor"

	"github.com/jackc/pgx/v5"
)

// MarkSeen sets the last sign of life of the sandboxes ids to t, where t
// is later than what they have. Rows are locked in id order, so two
// daemons marking overlapping sets cannot deadlock.
func (s *Store) MarkSeen(ctx context.Context, t time.Time, ids ...string) error {
	if len(ids) == 0 {
		return nil
	}
	sorted := slices.Clone(ids)
	slices.Sort(sorted)
	return s.inTx(ctx, "mark sandboxes seen", func(tx pgx.Tx) error {
		fencing, err := s.fenceSteps()
		if err != nil {
			return err
		}
		return runSteps(ctx, tx, append(fencing, step{
			sql: `WITH locked AS (SELECT id FROM sandboxes WHERE id = ANY($2::text[]) ORDER BY id FOR UPDATE)
			UPDATE sandboxes s SET seen_at = GREATEST(s.seen_at, $1) FROM locked WHERE s.id = locked.id`,
			args: []any{micros(t), sorted}, op: "mark sandboxes seen"}))
	})
}

// ListUsage returns the ledger rows that match f, in ledger order.
func (s *Store) ListUsage(ctx context.Context, f torpor.UsageFilter) ([]torpor.UsageRecord, error) {
	q := afterCursor(f.After, f.Tenant, f.SandboxID)
	if !f.From.IsZero() {
		q.add("end_us > ", micros(f.From))
	}
	if !f.To.IsZero() {
		q.add("start_us < ", micros(f.To))
	}
	return query(ctx, s, "list usage", func(row pgx.CollectableRow) (torpor.UsageRecord, error) {
		var (
			r          torpor.UsageRecord
			kind       string
			start, end int64
		)
		err := row.Scan(&r.Seq, &r.SandboxID, &r.Tenant, &kind, &start, &end, &r.Seconds,
			&r.VCPUSeconds, &r.MemoryGiBSeconds, &r.DiskGiBSeconds, &r.SnapshotGiBSeconds, &r.Cost)
		r.Kind, r.Start, r.End = torpor.UsageKind(kind), fromMicros(start), fromMicros(end)
		return r, err
	}, `SELECT seq, sandbox_id, tenant, kind, start_us, end_us, seconds, vcpu_s, memory_gib_s, disk_gib_s, snapshot_gib_s, cost
		FROM usage WHERE `+q.sql(f.Limit), q.args...)
}
