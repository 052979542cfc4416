package postgres

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/torpor-dev/torpor/store/postgres/pgtest"
)

// A holder whose connection was lost without the server seeing it end
// (the network, not a restart, took it) finds its lock held by its own
// old session: that is not another daemon, so the lock is not lost. The
// old session is ended and the lock taken again.
func TestNodeLockOwnOldSession(t *testing.T) {
	url := pgtest.NewDatabase(t)
	ctx := t.Context()
	cfg, err := pgx.ParseConfig(url)
	if err != nil {
		t.Fatal(err)
	}
	l, err := takeNodeLock(ctx, cfg, daemonLocks("node-a", "test"), "node-a", "test", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	defer l.release()
	// The holder forgets its connection, which lives on at the server
	// with the locks: an old session of its own.
	l.mu.Lock()
	old := l.conn
	l.conn, l.held = nil, false
	l.mu.Unlock()
	defer old.Close(context.Background())

	if !l.check() || l.lostError() != nil {
		t.Fatalf("a lock held by the holder's own old session counts as lost: %v", l.lostError())
	}
	if err := old.Ping(ctx); err == nil {
		t.Error("the old session still runs after the check")
	}
	// The holder's own checks run too; a few more at most take it.
	for try := 0; ; try++ {
		if !l.check() || l.lostError() != nil {
			t.Fatalf("a later check: lost: %v", l.lostError())
		}
		l.mu.Lock()
		held := l.held
		l.mu.Unlock()
		if held {
			break
		}
		if try == 5 {
			t.Fatal("the holder did not take its lock again once its old session was ended")
		}
		time.Sleep(100 * time.Millisecond)
	}
}
