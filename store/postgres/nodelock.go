package postgres

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// databaseLockKey is the session advisory lock a daemon holds on its
// database while it runs: exclusively outside a fleet (Options.Exclusive),
// since such a daemon takes every sandbox in its store for its own, and
// shared by the nodes of a fleet (Options.Node), which share the database
// with each other but not with a daemon outside the fleet. ("torpor" in
// ASCII, plus 2.)
const databaseLockKey = 0x746f72706f72 + 2

// lockWait is how long Open waits for a lock held by a session that may
// be ending.
const lockWait = 5 * time.Second

// ErrDatabaseInUse is returned by Open when the database is another
// daemon's alone: with Options.Exclusive while any daemon uses it, with
// Options.Node while a daemon outside a fleet does.
var ErrDatabaseInUse = errors.New("another torpor daemon uses this database; give each daemon its own database, or each daemon of a fleet its own node name (docs/postgres.md, docs/fleet.md)")

// ErrNodeInUse is returned by Open with Options.Node while another daemon
// runs as the same node on the database.
var ErrNodeInUse = errors.New("another torpor daemon runs as this node on this database; give each daemon of a fleet its own node name (docs/fleet.md)")

// lockKey derives the key of an advisory lock of a kind ("node",
// "exclusive") from a name: a 64-bit hash, so that names need no
// registry. The kinds keep the locks of one name apart.
func lockKey(kind, name string) int64 {
	h := fnv.New64a()
	h.Write([]byte("torpor:" + kind + ":" + name))
	return int64(h.Sum64())
}

// advisoryLock is one session advisory lock a daemon holds while it runs,
// and the error Open returns while another session holds it.
type advisoryLock struct {
	key     int64
	shared  bool
	refusal error
}

// daemonLocks are the locks a daemon takes on its database: the database
// lock, exclusively outside a fleet; shared, with the lock of its node
// name, in a fleet.
func daemonLocks(node, where string) []advisoryLock {
	if node == "" {
		return []advisoryLock{{key: databaseLockKey, refusal: fmt.Errorf("postgres store: %s: %w", where, ErrDatabaseInUse)}}
	}
	return []advisoryLock{
		{key: databaseLockKey, shared: true, refusal: fmt.Errorf("postgres store: %s: %w", where, ErrDatabaseInUse)},
		{key: lockKey("node", node), refusal: fmt.Errorf("postgres store: %s: node %q: %w", where, node, ErrNodeInUse)},
	}
}

// nodeLock holds a daemon's locks on a connection of its own, outside the
// pool. A server restart ends the session and its locks: the holder
// reconnects and takes them again.
type nodeLock struct {
	cfg   *pgx.ConnConfig
	locks []advisoryLock
	stop  chan struct{}
	done  sync.WaitGroup

	mu   sync.Mutex
	conn *pgx.Conn
	held bool // the locks are held on conn
}

// takeNodeLock connects and takes the locks, or returns the refusal of
// the first one another session holds.
func takeNodeLock(ctx context.Context, cfg *pgx.ConnConfig, locks []advisoryLock, where string) (*nodeLock, error) {
	l := &nodeLock{cfg: cfg, locks: locks, stop: make(chan struct{})}
	// A daemon killed a moment ago holds the lock until the server sees
	// its connection close: wait a little for that before refusing.
	deadline := time.Now().Add(lockWait)
	for {
		refused, err := l.take(ctx)
		if err != nil {
			l.release()
			return nil, fmt.Errorf("postgres store: %s: take the node lock: %w", where, err)
		}
		if refused == nil {
			break
		}
		if time.Now().After(deadline) {
			l.release()
			return nil, refused
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

// take connects when there is no connection and tries the locks in
// order. It returns the refusal of a lock another session holds, having
// let go of those it took, or nil with every lock held.
func (l *nodeLock) take(ctx context.Context) (refused, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn == nil {
		c, err := pgx.ConnectConfig(ctx, l.cfg)
		if err != nil {
			return nil, err
		}
		l.conn = c
	}
	fail := func(err error) (error, error) {
		l.conn.Close(context.Background())
		l.conn, l.held = nil, false
		return nil, err
	}
	for _, lk := range l.locks {
		try := `SELECT pg_try_advisory_lock($1)`
		if lk.shared {
			try = `SELECT pg_try_advisory_lock_shared($1)`
		}
		var ok bool
		if err := l.conn.QueryRow(ctx, try, lk.key).Scan(&ok); err != nil {
			return fail(err)
		}
		if !ok {
			// The session holds nothing else, and holding half the
			// locks would block others for nothing.
			if _, err := l.conn.Exec(ctx, `SELECT pg_advisory_unlock_all()`); err != nil {
				return fail(err)
			}
			l.held = false
			return lk.refusal, nil
		}
	}
	l.held = true
	return nil, nil
}

// keep checks the locks' connection every few seconds and, when the
// server dropped it (or another process took a lock meanwhile), tries to
// take the locks again.
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

// release ends the holder and its session, which frees the locks.
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
