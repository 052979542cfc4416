package sqlite

import (
	"errors"
	"fmt"

	"modernc.org/sqlite"
	sqlite3 "modernc.org/sqlite/lib"

	"github.com/torpor-dev/torpor"
)

// isConstraint reports whether err is a SQLite constraint violation (a
// duplicate key, a missing foreign row, ...).
func isConstraint(err error) bool {
	var e *sqlite.Error
	// Extended result codes are on: the primary code is the low byte.
	return errors.As(err, &e) && e.Code()&0xff == sqlite3.SQLITE_CONSTRAINT
}

// isFull reports whether err is SQLite's "database or disk is full": the
// file system holding the database (the data dir) has no space left for
// its write-ahead log or its pages. The write was rolled back.
func isFull(err error) bool {
	var e *sqlite.Error
	return errors.As(err, &e) && e.Code()&0xff == sqlite3.SQLITE_FULL
}

// wrap says what the store was doing when err happened. A constraint
// violation becomes a conflict whose message is conflict, and a full disk
// torpor.DiskFull, so that no driver text reaches a caller; anything else
// keeps the driver error in the chain.
func wrap(err error, conflict string, op string) error {
	if conflict != "" && isConstraint(err) {
		return torpor.Errorf(torpor.EConflict, "%s", conflict)
	}
	if isFull(err) {
		return torpor.DiskFull()
	}
	return fmt.Errorf("sqlite store: %s: %w", op, err)
}
