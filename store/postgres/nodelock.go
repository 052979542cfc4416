package postgres

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/torpor-dev/torpor"
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

// keepEvery is how often the holder checks that its locks' session is
// alive, and tries to take them again when it is not: the locks are free
// for anyone from a server restart until then.
const keepEvery = time.Second

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
// reconnects and takes them again. Where another daemon took one first
// (a copy of this host, crash-looping on ErrNodeInUse, is quicker), this
// daemon may no longer act as what the lock stood for: the lock is lost
// for good, and the store refuses the writes it fences (Store.lockLost).
type nodeLock struct {
	cfg   *pgx.ConnConfig
	locks []advisoryLock
	node  string // the node name, for messages ("": outside a fleet)
	log   *slog.Logger
	// app is the application_name of the lock's sessions, unique to this
	// holder: a session of its own that the server did not see end (the
	// network, not a restart, took the connection) is told from another
	// daemon's by it.
	app  string
	stop chan struct{}
	done sync.WaitGroup

	mu   sync.Mutex
	conn *pgx.Conn
	held bool // the locks are held on conn

	// lost is closed once another session took a lock this one held;
	// lostErr is then what the store's fenced calls return.
	lost    chan struct{}
	lostErr error
}

// takeNodeLock connects and takes the locks, or returns the refusal of
// the first one another session holds.
func takeNodeLock(ctx context.Context, cfg *pgx.ConnConfig, locks []advisoryLock, node, where string, log *slog.Logger) (*nodeLock, error) {
	l := &nodeLock{cfg: cfg, locks: locks, node: node, log: log, app: "torpor lock " + torpor.NewID("", 16),
		stop: make(chan struct{}), lost: make(chan struct{})}
	if cfg.RuntimeParams == nil {
		cfg.RuntimeParams = map[string]string{}
	}
	cfg.RuntimeParams["application_name"] = l.app
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
			return nil, refused.refusal
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
// order. It returns the lock another session holds, having let go of
// those it took, or nil with every lock held.
func (l *nodeLock) take(ctx context.Context) (refused *advisoryLock, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn == nil {
		c, err := pgx.ConnectConfig(ctx, l.cfg)
		if err != nil {
			return nil, err
		}
		l.conn = c
	}
	fail := func(err error) (*advisoryLock, error) {
		l.conn.Close(context.Background())
		l.conn, l.held = nil, false
		return nil, err
	}
	for i, lk := range l.locks {
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
			return &l.locks[i], nil
		}
	}
	l.held = true
	return nil, nil
}

// keep checks the locks' connection every keepEvery and, when the server
// dropped it, takes the locks again, until another session is found
// holding one of them.
func (l *nodeLock) keep() {
	t := time.NewTicker(keepEvery)
	defer t.Stop()
	for {
		select {
		case <-l.stop:
			return
		case <-t.C:
		}
		if !l.check() {
			return
		}
	}
}

// check makes sure the locks are held, taking them again after a lost
// connection. It returns false once another session holds one of them:
// the locks are lost for good.
func (l *nodeLock) check() bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	l.mu.Lock()
	alive := l.conn != nil && l.conn.Ping(ctx) == nil
	if !alive && l.conn != nil {
		l.conn.Close(context.Background())
		l.conn, l.held = nil, false
		l.log.Warn("postgres store: lost the database session that holds this daemon's lock; taking the lock again", "node", l.node)
	}
	held := l.held
	l.mu.Unlock()
	if held {
		return true
	}
	refused, err := l.take(ctx)
	if err != nil {
		return true // the server is still away: the next check tries again
	}
	if refused == nil {
		l.log.Info("postgres store: took this daemon's lock on the database again", "node", l.node)
		return true
	}
	if other, err := l.heldByOther(ctx, *refused); err != nil || !other {
		return true
	}
	l.lostErr = lockLost(l.node)
	close(l.lost)
	l.mu.Lock()
	if l.conn != nil {
		l.conn.Close(context.Background())
		l.conn = nil
	}
	l.mu.Unlock()
	l.log.Error("postgres store: ANOTHER TORPOR DAEMON TOOK THIS DAEMON'S LOCK ON THE DATABASE while its connection was down "+
		"(a copy of this host, under the same node name?); this daemon changes no sandbox any more and must be restarted "+
		"once the other one is stopped", "node", l.node, "refusal", refused.refusal)
	return false
}

// heldByOther reports whether lk, which this session was refused, is
// held by another daemon's session. A session of this holder's own that
// the server has not yet seen end holds it too: that one is ended, so
// that the next check takes the lock, and is not another daemon.
func (l *nodeLock) heldByOther(ctx context.Context, lk advisoryLock) (bool, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.conn == nil {
		return false, errors.New("no connection")
	}
	// A bigint key is the lock's classid (high half) and objid (low
	// half), with objsubid 1. A shared lock is refused by exclusive
	// holders only.
	rows, err := l.conn.Query(ctx, `SELECT l.pid, a.application_name FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
		WHERE l.locktype = 'advisory' AND l.granted AND l.pid <> pg_backend_pid() AND l.objsubid = 1
			AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
			AND (l.classid::bigint << 32 | l.objid::bigint) = $1 AND (NOT $2 OR l.mode = 'ExclusiveLock')`, lk.key, lk.shared)
	if err != nil {
		return false, err
	}
	type holder struct {
		pid int32
		app *string
	}
	holders, err := pgx.CollectRows(rows, func(row pgx.CollectableRow) (holder, error) {
		var h holder
		return h, row.Scan(&h.pid, &h.app)
	})
	if err != nil {
		return false, err
	}
	for _, h := range holders {
		if h.app == nil {
			return false, nil // a session going away: look again next time
		}
		if *h.app != l.app {
			return true, nil
		}
	}
	for _, h := range holders {
		// The timeout waits (up to a second) for the session to exit,
		// which frees the lock for the next check.
		if _, err := l.conn.Exec(ctx, `SELECT pg_terminate_backend($1, 1000)`, h.pid); err != nil {
			return false, err
		}
		l.log.Warn("postgres store: ended a database session of this daemon's that still held its lock", "node", l.node, "pid", h.pid)
	}
	return false, nil
}

// lockLost is the error of the store's fenced calls once another daemon
// took this one's lock (see nodeLock): unavailable, with reason fenced,
// so that the engine fences itself as it does when declared down.
func lockLost(node string) *torpor.Error {
	who := "this daemon"
	if node != "" {
		who = "node " + node
	}
	return &torpor.Error{Code: torpor.EUnavailable, Reason: torpor.ReasonFenced,
		Message: "another torpor daemon took the database lock of " + who + " while its connection was down (a copy of this host?); " +
			"this daemon changes no sandbox any more: stop the other daemon, then restart this one"}
}

// lostError is the error of a fenced call once the locks are lost, or nil.
func (l *nodeLock) lostError() error {
	select {
	case <-l.lost:
		return l.lostErr
	default:
		return nil
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
