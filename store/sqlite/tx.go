package sqlite

import (
	"context"
	"database/sql"
	"time"
)

// inTx runs fn in a write transaction on the writer connection and commits
// it when fn returns nil. Transactions queue for the one writer connection
// for as long as ctx allows.
func (s *Store) inTx(ctx context.Context, op string, fn func(tx *sql.Tx) error) error {
	tx, err := s.write.BeginTx(ctx, nil)
	if err != nil {
		return wrap(err, "", op)
	}
	defer tx.Rollback()
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(); err != nil {
		return wrap(err, "", op)
	}
	return nil
}

// micros is how a time is stored: microseconds since the Unix epoch. The
// zero time.Time fits, and comes back as the zero time.
func micros(t time.Time) int64 { return t.UnixMicro() }

// fromMicros is the inverse of micros, in UTC.
func fromMicros(us int64) time.Time { return time.UnixMicro(us).UTC() }
