package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"strings"
	"time"

	"github.com/torpor-dev/torpor"
)

// usageSchema is migration 4: the usage ledger, and each sandbox's last
// sign of life.
const usageSchema = `
ALTER TABLE sandboxes ADD COLUMN seen_at INTEGER NOT NULL DEFAULT 0;

-- One row per stretch of a sandbox's life in one usage kind. AUTOINCREMENT
-- keeps seq a stable cursor.
CREATE TABLE usage (
	seq            INTEGER PRIMARY KEY AUTOINCREMENT,
	sandbox_id     TEXT    NOT NULL,
	tenant         TEXT    NOT NULL,
	kind           TEXT    NOT NULL,
	start_us       INTEGER NOT NULL,
	end_us         INTEGER NOT NULL,
	seconds        REAL    NOT NULL,
	vcpu_s         REAL    NOT NULL,
	memory_gib_s   REAL    NOT NULL,
	disk_gib_s     REAL    NOT NULL,
	snapshot_gib_s REAL    NOT NULL,
	cost           REAL    NOT NULL,
	CHECK (end_us > start_us)
) STRICT;
-- A second is billed once: no two rows of a sandbox start together.
CREATE UNIQUE INDEX usage_once ON usage (sandbox_id, start_us);
CREATE INDEX usage_by_tenant ON usage (tenant, start_us);
`

// insertUsage appends ledger rows inside tx.
func (s *Store) insertUsage(ctx context.Context, tx *sql.Tx, rows []torpor.UsageRecord) error {
	if len(rows) == 0 {
		return nil
	}
	stmt := tx.StmtContext(ctx, s.stmts.insertUsage)
	for _, r := range rows {
		if !r.End.After(r.Start) {
			return torpor.Invalid("usage", "a usage row must end after it starts (%s, %s)", r.Start, r.End)
		}
		_, err := stmt.ExecContext(ctx, r.SandboxID, r.Tenant, string(r.Kind), micros(r.Start), micros(r.End),
			r.Seconds, r.VCPUSeconds, r.MemoryGiBSeconds, r.DiskGiBSeconds, r.SnapshotGiBSeconds, r.Cost)
		if err != nil {
			return wrap(err, fmt.Sprintf("sandbox %q already has a usage row from %s", r.SandboxID, r.Start), "append usage")
		}
	}
	return nil
}

// MarkSeen sets the last sign of life of the sandboxes ids to t, where t
// is later than what they have.
func (s *Store) MarkSeen(ctx context.Context, t time.Time, ids ...string) error {
	if len(ids) == 0 {
		return nil
	}
	return s.inTx(ctx, "mark sandboxes seen", func(tx *sql.Tx) error {
		if err := s.checkFence(ctx, tx); err != nil {
			return err
		}
		const batch = 500 // well under SQLite's limit on parameters
		for len(ids) > 0 {
			n := min(batch, len(ids))
			args := []any{micros(t)}
			for _, id := range ids[:n] {
				args = append(args, id)
			}
			marks := strings.TrimSuffix(strings.Repeat("?, ", n), ", ")
			if _, err := tx.ExecContext(ctx, `UPDATE sandboxes SET seen_at = MAX(seen_at, ?) WHERE id IN (`+marks+`)`, args...); err != nil {
				return wrap(err, "", "mark sandboxes seen")
			}
			ids = ids[n:]
		}
		return nil
	})
}

// ListUsage returns the ledger rows that match f, in ledger order.
func (s *Store) ListUsage(ctx context.Context, f torpor.UsageFilter) ([]torpor.UsageRecord, error) {
	where, args := afterCursor(f.After, f.Tenant, f.SandboxID)
	if !f.From.IsZero() {
		where = append(where, "end_us > ?")
		args = append(args, micros(f.From))
	}
	if !f.To.IsZero() {
		where = append(where, "start_us < ?")
		args = append(args, micros(f.To))
	}
	limit := int64(-1)
	if f.Limit > 0 {
		limit = int64(f.Limit)
	}
	args = append(args, limit)
	rows, err := s.read.QueryContext(ctx, `SELECT seq, sandbox_id, tenant, kind, start_us, end_us, seconds,
		vcpu_s, memory_gib_s, disk_gib_s, snapshot_gib_s, cost FROM usage WHERE `+strings.Join(where, " AND ")+` ORDER BY seq LIMIT ?`, args...)
	if err != nil {
		return nil, wrap(err, "", "list usage")
	}
	defer rows.Close()
	var out []torpor.UsageRecord
	for rows.Next() {
		var (
			r          torpor.UsageRecord
			kind       string
			start, end int64
		)
		if err := rows.Scan(&r.Seq, &r.SandboxID, &r.Tenant, &kind, &start, &end, &r.Seconds,
			&r.VCPUSeconds, &r.MemoryGiBSeconds, &r.DiskGiBSeconds, &r.SnapshotGiBSeconds, &r.Cost); err != nil {
			return nil, wrap(err, "", "list usage")
		}
		r.Kind, r.Start, r.End = torpor.UsageKind(kind), fromMicros(start), fromMicros(end)
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap(err, "", "list usage")
	}
	return out, nil
}
