package postgres

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// step is one statement of a write sent as a batch: what it means when it
// breaks a constraint (conflict, or "" for none), and a check of what it
// did.
type step struct {
	sql      string
	args     []any
	op       string
	conflict string
	check    func(pgconn.CommandTag) error
}

// runSteps sends steps to the server as one pipelined batch inside tx, so
// that a write costs one round trip however many statements it has, and
// reads their results in order. The first error (a statement's, mapped
// with its conflict, or a check's) is returned; tx must then be rolled
// back, since the statements after it ran or were skipped.
func runSteps(ctx context.Context, tx pgx.Tx, steps []step) error {
	if len(steps) == 0 {
		return nil
	}
	b := &pgx.Batch{}
	for _, st := range steps {
		b.Queue(st.sql, st.args...)
	}
	br := tx.SendBatch(ctx, b)
	var first error
	for _, st := range steps {
		ct, err := br.Exec()
		if err != nil {
			first = wrap(err, st.conflict, st.op)
			break
		}
		if st.check != nil {
			if err := st.check(ct); err != nil {
				first = err
				break
			}
		}
	}
	if err := br.Close(); err != nil && first == nil {
		first = wrap(err, "", "write")
	}
	return first
}

// errNoRow is a check's answer when an update matched no row.
var errNoRow = errors.New("no row matched")
