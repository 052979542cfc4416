package postgres

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// nodeLockKey is the session advisory lock a daemon holds on its database
// while it runs (Options.Exclusive): a daemon takes every sandbox in its
// store for its own, so a second daemon on the same database must not
// start. ("torpor" in ASCII, plus 2.)
const nodeLockKey = 0x746f72706f72 + 2

// lockWait is how long Open waits for a lock held by a session that may
// be ending.
const lockWait = 5 * time.Second

// ErrDatabaseInUse is returned by Open with Options.Exclusive when another
// daemon holds the database.
var ErrDatabaseInUse = errors.New("another torpor daemon uses this database; give each daemon its own database (docs/postgres.md)")

// nodeLock holds nodeLockKey on a connection of its own, outside the pool.
// A server restart ends the session and its lock: the holder reconnects
// and takes the lock again.
type nodeLock struct {
	cfg  *pgx.ConnConfig
	stop chan struct{}
	done sync.WaitGroup

	mu   sync.Mutex
	conn *pgx.Conn
	held bool // the lock is held on conn
}

// takeNodeLock connects and takes the lock, or returns ErrDatabaseInUse.
func takeNodeLock(ctx context.Context, cfg *pgx.ConnConfig, where string) (*nodeLock, error) {
	l := &nodeLock{cfg: cfg, stop: make(chan struct{})}
	// A daemon killed a moment ago holds the lock until the server sees
	// its connection close: wait a little for that before refusing.
	deadline := time.Now().Add(lockWait)
	for {
		ok, err := l.take(ctx)
		if err != nil {
			return nil, fmt.Errorf("postgres store: %s: take the node lock: %w", where, err)
		}
		if ok {
			break
		}
		if time.Now().After(deadline) {
			l.release()
			return nil, fmt.Errorf("postgres store: %s: %w", where, ErrDatabaseInUse)
		}
		select {
		case <-ctx.Done():
			l.release()
			return nil, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	l.done.Go(l.keep)
	return l, nil
}

// take connects when there is no connection and tries the lock.
func (l *nodeLock) take(ctx context.Context) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn == nil {
		c, err := pgx.ConnectConfig(ctx, l.cfg)
		if err != nil {
			return false, err
		}
		l.conn = c
	}
	var ok bool
	if err := l.conn.QueryRow(ctx, `SELECT pg_try_advisory_lock($1)`, int64(nodeLockKey)).Scan(&ok); err != nil {
		l.conn.Close(context.Background())
		l.conn, l.held = nil, false
		return false, err
	}
	l.held = ok
	return ok, nil
}

// keep checks the lock's connection every few seconds and, when the
// server dropped it (or another process took the lock meanwhile), tries
// to take the lock again.
func (l *nodeLock) keep() {
	t := time.NewTicker(5 * time.Second)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		l.mu.Lock()
		alive := l.conn != nil && l.conn.Ping(ctx) == nil
		if !alive && l.conn != nil {
			l.conn.Close(context.Background())
			l.conn, l.held = nil, false
		}
		held := l.held
		l.mu.Unlock()
		if !held {
			_, _ = l.take(ctx)
		}
		cancel()
	}
}

// release ends the holder and its session, which frees the lock.
func (l *nodeLock) release() {
	close(l.stop)
	l.done.Wait()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn != nil {
		l.conn.Close(context.Background())
		l.conn = nil
	}
}
