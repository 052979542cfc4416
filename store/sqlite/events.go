package sqlite

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/torpor-dev/torpor"
)

// insertEvents appends events, in order, inside tx. The store assigns each
// its Seq; a Seq set by the caller is ignored.
func (s *Store) insertEvents(ctx context.Context, tx *sql.Tx, events []torpor.Event) error {
	if len(events) == 0 {
		return nil
	}
	stmt := tx.StmtContext(ctx, s.stmts.insertEvent)
	for _, e := range events {
		attrs, err := encodeAttrs(e.Attrs)
		if err != nil {
			return err
		}
		if _, err := stmt.ExecContext(ctx, e.Type, e.SandboxID, e.Tenant, micros(e.Time), attrs); err != nil {
			return wrap(err, "", fmt.Sprintf("append event %q", e.Type))
		}
	}
	return nil
}

// encodeAttrs returns NULL for nil attributes and a JSON object otherwise,
// so that nil and empty stay distinct.
func encodeAttrs(attrs map[string]string) (sql.NullString, error) {
	if attrs == nil {
		return sql.NullString{}, nil
	}
	b, err := json.Marshal(attrs)
	if err != nil {
		return sql.NullString{}, fmt.Errorf("sqlite store: encode event attributes: %w", err)
	}
	return sql.NullString{String: string(b), Valid: true}, nil
}

// ListEvents returns the events after f.After (a Seq) that match f, oldest
// first, at most f.Limit of them when f.Limit is positive; only the
// newest with f.Newest.
func (s *Store) ListEvents(ctx context.Context, f torpor.EventFilter) ([]torpor.Event, error) {
	where, args := afterCursor(f.After, f.Tenant, f.SandboxID)
	if f.ExceptTenant != "" {
		where = append(where, "tenant <> ?")
		args = append(args, f.ExceptTenant)
	}
	limit := int64(-1) // SQLite: no limit
	if f.Limit > 0 {
		limit = int64(f.Limit)
	}
	order := "seq"
	if f.Newest {
		order, limit = "seq DESC", 1
	}
	args = append(args, limit)
	query := `SELECT seq, type, sandbox_id, tenant, time, attrs FROM events WHERE ` +
		strings.Join(where, " AND ") + ` ORDER BY ` + order + ` LIMIT ?`

	rows, err := s.read.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, wrap(err, "", "list events")
	}
	defer rows.Close()
	var out []torpor.Event
	for rows.Next() {
		e, err := scanEvent(rows)
		if err != nil {
			return nil, wrap(err, "", "list events")
		}
		out = append(out, e)
	}
	if err := rows.Err(); err != nil {
		return nil, wrap(err, "", "list events")
	}
	return out, nil
}

// scanEvent reads the columns seq, type, sandbox_id, tenant, time, attrs.
func scanEvent(sc scanner) (torpor.Event, error) {
	var (
		e     torpor.Event
		t     int64
		attrs sql.NullString
	)
	if err := sc.Scan(&e.Seq, &e.Type, &e.SandboxID, &e.Tenant, &t, &attrs); err != nil {
		return e, err
	}
	e.Time = fromMicros(t)
	if attrs.Valid {
		if err := json.Unmarshal([]byte(attrs.String), &e.Attrs); err != nil {
			return e, fmt.Errorf("decode attributes of event %d: %w", e.Seq, err)
		}
	}
	return e, nil
}

// afterCursor starts the WHERE conditions of a log read (events, usage):
// the rows after a cursor, of a tenant and a sandbox when they are given.
func afterCursor(after int64, tenant, sandboxID string) (where []string, args []any) {
	where, args = []string{"seq > ?"}, []any{after}
	if tenant != "" {
		where = append(where, "tenant = ?")
		args = append(args, tenant)
	}
	if sandboxID != "" {
		where = append(where, "sandbox_id = ?")
		args = append(args, sandboxID)
	}
	return where, args
}
