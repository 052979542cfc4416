package postgres

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/torpor-dev/torpor"
)

// Driver errors map to the one error table: constraint violations to the
// conflict a caller names, a full disk and a lost server to unavailable
// with Retry-After, the context's errors kept in the chain.
func TestWrap(t *testing.T) {
	for _, c := range []struct {
		name     string
		err      error
		conflict string
		code     torpor.ErrorCode
		reason   string
	}{
		{"unique", &pgconn.PgError{Code: "23505"}, "sandbox exists", torpor.EConflict, ""},
		{"foreign key", &pgconn.PgError{Code: "23503"}, "no tenant", torpor.EConflict, ""},
		{"unique, no conflict named", &pgconn.PgError{Code: "23505"}, "", torpor.EInternal, ""},
		{"disk full", &pgconn.PgError{Code: "53100"}, "", torpor.EUnavailable, torpor.ReasonDiskFull},
		{"admin shutdown", &pgconn.PgError{Code: "57P01"}, "", torpor.EUnavailable, ReasonStoreUnavailable},
		{"connection failure", &pgconn.PgError{Code: "08006"}, "", torpor.EUnavailable, ReasonStoreUnavailable},
		{"network", fmt.Errorf("read: %w", &net.OpError{Op: "read", Err: errors.New("connection reset")}), "", torpor.EUnavailable, ReasonStoreUnavailable},
		{"syntax", &pgconn.PgError{Code: "42601"}, "x", torpor.EInternal, ""},
	} {
		got := wrap(c.err, c.conflict, "op")
		e := torpor.AsError(got)
		if e.Code != c.code || e.Reason != c.reason {
			t.Errorf("%s: %v is %s/%s, want %s/%s", c.name, got, e.Code, e.Reason, c.code, c.reason)
		}
		if c.code == torpor.EUnavailable && e.RetryAfter <= 0 {
			t.Errorf("%s: no Retry-After", c.name)
		}
	}
	if err := wrap(fmt.Errorf("x: %w", context.Canceled), "", "op"); !errors.Is(err, context.Canceled) {
		t.Errorf("a canceled context became %v", err)
	}
}
