package postgres

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/torpor-dev/torpor"
)

// ReasonStoreUnavailable is the reason of an unavailable error whose cause
// is that the database cannot be reached (restarting, down, the network).
const ReasonStoreUnavailable = "store_unavailable"

// unavailableRetry is the Retry-After of an unreachable database: a
// restarting server is usually back within seconds.
const unavailableRetry = 5 * time.Second

// StoreUnavailable is the error of a call the database could not answer
// because it cannot be reached. Nothing was changed by it: the
// transaction did not commit.
func StoreUnavailable() *torpor.Error {
	return &torpor.Error{Code: torpor.EUnavailable, Reason: ReasonStoreUnavailable, RetryAfter: unavailableRetry,
		Message: "the database is unreachable; nothing was changed, try again shortly"}
}

// isConnection reports whether err says the server could not be reached
// or went away (restart, shutdown, network), as opposed to an error of the
// statement itself.
func isConnection(err error) bool {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		// Class 08: connection exception; 57P01-57P03: the server shuts
		// down, crashed or is starting.
		return strings.HasPrefix(pe.Code, "08") || pe.Code == "57P01" || pe.Code == "57P02" || pe.Code == "57P03"
	}
	var ce *pgconn.ConnectError
	var ne net.Error
	return errors.As(err, &ce) || errors.As(err, &ne) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		pgconn.SafeToRetry(err) || strings.Contains(err.Error(), "conn closed")
}

// wrap says what the store was doing when err happened. A constraint
// violation (SQLSTATE class 23) becomes a conflict whose message is
// conflict, a full disk torpor.DiskFull and a lost server
// StoreUnavailable, so that no driver text reaches a caller; the
// context's own errors and anything else keep the driver error in the
// chain.
func wrap(err error, conflict string, op string) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		switch {
		case conflict != "" && strings.HasPrefix(pe.Code, "23"):
			return torpor.Errorf(torpor.EConflict, "%s", conflict)
		case pe.Code == "53100": // disk_full
			return torpor.DiskFull()
		}
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("postgres store: %s: %w", op, err)
	}
	if isConnection(err) {
		return StoreUnavailable()
	}
	return fmt.Errorf("postgres store: %s: %w", op, err)
}
