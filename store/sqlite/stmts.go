package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// writeStmts are the statements of the hot write path, prepared once on
// the writer connection: parsing SQL costs more than running it.
type writeStmts struct {
	updateSandbox  *sql.Stmt
	deleteMetadata *sql.Stmt
	insertMetadata *sql.Stmt
	insertEvent    *sql.Stmt
	insertUsage    *sql.Stmt
	fence          *sql.Stmt
}

func prepareWrites(ctx context.Context, db *sql.DB) (*writeStmts, error) {
	var (
		ws   writeStmts
		errs []error
	)
	prep := func(query string) *sql.Stmt {
		st, err := db.PrepareContext(ctx, query)
		errs = append(errs, err)
		return st
	}
	ws.updateSandbox = prep(`UPDATE sandboxes SET tenant = ?, state = ?, node = ?, created_at = ?, version = version + 1, record = ?,
		seen_at = MAX(seen_at, ?) WHERE id = ? AND version = ?`)
	ws.deleteMetadata = prep(`DELETE FROM sandbox_metadata WHERE sandbox_id = ?`)
	ws.insertMetadata = prep(`INSERT INTO sandbox_metadata (sandbox_id, key, value) VALUES (?, ?, ?)`)
	ws.insertEvent = prep(`INSERT INTO events (type, sandbox_id, tenant, time, attrs) VALUES (?, ?, ?, ?, ?)`)
	ws.insertUsage = prep(`INSERT INTO usage (sandbox_id, tenant, kind, start_us, end_us, seconds, vcpu_s, memory_gib_s, disk_gib_s, snapshot_gib_s, cost)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)`)
	ws.fence = prep(`SELECT epoch, state, instance FROM nodes WHERE name = ?`)
	if err := errors.Join(errs...); err != nil {
		ws.close()
		return nil, fmt.Errorf("sqlite store: prepare statements: %w", err)
	}
	return &ws, nil
}

// close closes the statements that were prepared.
func (ws *writeStmts) close() error {
	var errs []error
	for _, st := range []*sql.Stmt{ws.updateSandbox, ws.deleteMetadata, ws.insertMetadata, ws.insertEvent, ws.insertUsage, ws.fence} {
		if st != nil {
			errs = append(errs, st.Close())
		}
	}
	return errors.Join(errs...)
}
