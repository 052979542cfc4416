package postgres

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/torpor-dev/torpor"
)

// logLockKey is the transaction advisory lock a writer holds while it
// appends events or usage rows, until it commits. A sequence hands out
// numbers when rows are inserted, not when they commit: without the lock a
// reader could see row 11 committed while row 10 is not yet, move its
// cursor past 10 and never see it. With it, numbers commit in the order
// they were handed out. It is the last lock a writer takes, so it cannot
// close a cycle with row locks.
const logLockKey = 0x746f72706f72 + 1

// appendLog appends to steps the statements that append usage rows and
// events, in order, under the log lock (taken after every other statement
// of the write). The store assigns each event its Seq.
func appendLog(steps []step, usage []torpor.UsageRecord, events []torpor.Event) ([]step, error) {
	if len(usage) == 0 && len(events) == 0 {
		return steps, nil
	}
	steps = append(steps, step{sql: `SELECT pg_advisory_xact_lock($1)`, args: []any{int64(logLockKey)}, op: "take the log lock"})
	for _, r := range usage {
		steps = append(steps, step{sql: `INSERT INTO usage (sandbox_id, tenant, kind, start_us, end_us, seconds, vcpu_s, memory_gib_s, disk_gib_s, snapshot_gib_s, cost)
			VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)`, args: []any{r.SandboxID, r.Tenant, string(r.Kind), micros(r.Start), micros(r.End),
			r.Seconds, r.VCPUSeconds, r.MemoryGiBSeconds, r.DiskGiBSeconds, r.SnapshotGiBSeconds, r.Cost},
			op: "append usage", conflict: fmt.Sprintf("sandbox %q already has a usage row from %s", r.SandboxID, r.Start)})
	}
	for _, e := range events {
		attrs, err := encodeAttrs(e.Attrs)
		if err != nil {
			return nil, err
		}
		steps = append(steps, step{sql: `INSERT INTO events (type, sandbox_id, tenant, time, attrs) VALUES ($1, $2, $3, $4, $5)`,
			args: []any{e.Type, e.SandboxID, e.Tenant, micros(e.Time), attrs}, op: fmt.Sprintf("append event %q", e.Type)})
	}
	return steps, nil
}

// encodeAttrs returns NULL for nil attributes and a JSON object otherwise,
// so that nil and empty stay distinct.
func encodeAttrs(attrs map[string]string) (*string, error) {
	if attrs == nil {
		return nil, nil
	}
	b, err := json.Marshal(attrs)
	if err != nil {
		return nil, fmt.Errorf("postgres store: encode event attributes: %w", err)
	}
	s := string(b)
	return &s, nil
}

// logQuery starts the WHERE conditions of a log read (events, usage): the
// rows after a cursor, of a tenant and a sandbox when they are given.
type logQuery struct {
	where []string
	args  []any
}

func afterCursor(after int64, tenant, sandboxID string) *logQuery {
	q := &logQuery{}
	q.add("seq > ", after)
	if tenant != "" {
		q.add("tenant = ", tenant)
	}
	if sandboxID != "" {
		q.add("sandbox_id = ", sandboxID)
	}
	return q
}

// add appends the condition cond followed by a placeholder for v.
func (q *logQuery) add(cond string, v any) {
	q.args = append(q.args, v)
	q.where = append(q.where, cond+"$"+strconv.Itoa(len(q.args)))
}

// sql returns the WHERE body, ORDER BY seq and a LIMIT when limit > 0.
func (q *logQuery) sql(limit int) string {
	s := strings.Join(q.where, " AND ") + " ORDER BY seq"
	if limit > 0 {
		s += " LIMIT " + strconv.Itoa(limit)
	}
	return s
}

// ListEvents returns the events after f.After (a Seq) that match f, oldest
// first, at most f.Limit of them when f.Limit is positive; only the
// newest with f.Newest.
func (s *Store) ListEvents(ctx context.Context, f torpor.EventFilter) ([]torpor.Event, error) {
	q := afterCursor(f.After, f.Tenant, f.SandboxID)
	if f.ExceptTenant != "" {
		q.add("tenant <> ", f.ExceptTenant)
	}
	body := q.sql(f.Limit)
	if f.Newest {
		body = strings.Join(q.where, " AND ") + " ORDER BY seq DESC LIMIT 1"
	}
	return query(ctx, s, "list events", scanEvent, `SELECT seq, type, sandbox_id, tenant, time, attrs FROM events WHERE `+body, q.args...)
}

// scanEvent reads the columns seq, type, sandbox_id, tenant, time, attrs.
func scanEvent(row pgx.CollectableRow) (torpor.Event, error) {
	var (
		e     torpor.Event
		t     int64
		attrs *string
	)
	if err := row.Scan(&e.Seq, &e.Type, &e.SandboxID, &e.Tenant, &t, &attrs); err != nil {
		return e, err
	}
	e.Time = fromMicros(t)
	if attrs != nil {
		if err := json.Unmarshal([]byte(*attrs), &e.Attrs); err != nil {
			return e, fmt.Errorf("decode attributes of event %d: %w", e.Seq, err)
		}
	}
	return e, nil
}
