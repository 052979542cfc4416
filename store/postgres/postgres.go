// Package postgres is torpor's shared store: its state in a PostgreSQL
// database (version 15 or newer) that several torpor daemons may use at
// once. It implements torpor.Store with the SQLite store's guarantees:
//
//   - A write is one transaction, committed before the call returns.
//   - UpdateSandbox is conditional on the record's version column, so of
//     two daemons racing on one sandbox exactly one wins; PostgreSQL's row
//     lock makes the loser wait for the winner's commit and then match no
//     row.
//   - Events and usage rows take their numbers under one transaction-level
//     advisory lock (the log lock), so numbers commit in order and a cursor
//     never skips a row that commits later with a smaller number.
//   - A usage row's (sandbox, start) is a unique key: a second is charged
//     once, by the database, not by a check in Go.
//   - A handle that joined a fleet as a node (JoinNode) writes sandboxes
//     only while that node is current: each write checks the node's
//     epoch in its transaction, under a lock DeclareDown takes too, so
//     no write of a node commits once it is declared down (nodes.go).
//
// The schema is made and upgraded by numbered migrations embedded in the
// binary, applied when the store opens under a session advisory lock, so
// daemons starting together do not race; a schema newer than this build
// knows is refused. Records are kept in the SQLite store's JSON formats,
// and webhook secrets are sealed with the same key file (webhook.key) in a
// directory of the daemon's.
package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/store/sqlite"
)

// Options say where the store is.
type Options struct {
	// URL is a PostgreSQL connection URL: postgres://USER[:PASSWORD]@HOST[:PORT]/DB?PARAMS
	// (libpq's parameters, host=/path/to/socket/dir included).
	URL string
	// KeyDir is the directory of webhook.key, the key webhook secrets are
	// sealed with (the daemon's data dir). Every daemon sharing the
	// database needs the same key.
	KeyDir string
	// Exclusive makes Open take the database for this process alone (a
	// session advisory lock, held until Close), refusing with
	// ErrDatabaseInUse while another holds it: a daemon takes every
	// sandbox in its store for its own. Node replaces it.
	Exclusive bool
	// Node is the name of the fleet node this process runs as. When set,
	// Open takes the lock of that name (until Close), refusing with
	// ErrNodeInUse while another daemon runs as the same node, and shares
	// the database with the daemons of other node names, but not with an
	// Exclusive one (ErrDatabaseInUse either way round).
	//
	// Either lock lasts as long as its database session; after a server
	// restart the store takes it again. Should another daemon have taken
	// it meanwhile, this store refuses from then on its sandbox writes,
	// joins, heartbeats and Exclusive (unavailable, reason fenced): two
	// daemons never both act as one node (nodelock.go).
	Node string
	// MaxConns bounds the pool (0: pgxpool's default, the larger of 4 and
	// the number of CPUs).
	MaxConns int32
	// Logger tells of the lock of Exclusive or Node: lost with its
	// connection, taken again, or taken by another daemon meanwhile
	// (nil: slog.Default()).
	Logger *slog.Logger
}

// Store is a torpor.Store in a PostgreSQL database. It is safe for
// concurrent use.
type Store struct {
	pool    *pgxpool.Pool
	secrets *sqlite.SecretBox
	where   string // the redacted URL, for messages
	lock    *nodeLock
	url     string // the URL as given, to redact driver errors
	// fence is the node this handle writes sandboxes as, once it joined
	// (nodes.go); nil: unfenced.
	fence atomic.Pointer[sqlite.Fence]

	closeOnce sync.Once
}

var _ torpor.Store = (*Store)(nil)

// IsURL reports whether s names a PostgreSQL database (postgres:// or
// postgresql://) rather than a SQLite file.
func IsURL(s string) bool {
	return strings.HasPrefix(s, "postgres://") || strings.HasPrefix(s, "postgresql://")
}

var passwordParam = regexp.MustCompile(`(?i)(password=)[^&\s]*`)

// Redact returns the URL with its password, in the user part or in a
// password parameter, replaced by xxxxx: what logs and errors show.
func Redact(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		// Never echo what could not be parsed: it may hold a password.
		return "postgres://(unparsable URL)"
	}
	s := u.Redacted()
	return passwordParam.ReplaceAllString(s, "${1}xxxxx")
}

// Open connects to the database at opt.URL, brings its schema up to date
// and loads the webhook key. It refuses a schema newer than this build
// knows (a *SchemaVersionError). No error it returns holds a password.
func Open(ctx context.Context, opt Options) (*Store, error) {
	if !IsURL(opt.URL) {
		return nil, fmt.Errorf("postgres store: %q is not a postgres:// URL", Redact(opt.URL))
	}
	if opt.KeyDir == "" {
		return nil, errors.New("postgres store: no directory for the webhook key")
	}
	where := Redact(opt.URL)
	cfg, err := pgxpool.ParseConfig(opt.URL)
	if err != nil {
		// pgx's parse errors quote the string they could not parse.
		return nil, fmt.Errorf("postgres store: %s is not a valid connection URL", where)
	}
	if opt.MaxConns > 0 {
		cfg.MaxConns = opt.MaxConns
	}
	// A connection the server dropped (a restart) is noticed before it is
	// used, and replaced: the pool reconnects by itself.
	cfg.HealthCheckPeriod = 5 * time.Second
	cfg.ConnConfig.ConnectTimeout = 10 * time.Second
	// The statement cache is per connection; a server restart empties it
	// along with the connection.
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheStatement
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("postgres store: %s: %w", where, redactErr(err, opt.URL))
	}
	s := &Store{pool: pool, where: where, url: opt.URL}
	if opt.Exclusive || opt.Node != "" {
		log := opt.Logger
		if log == nil {
			log = slog.Default()
		}
		if s.lock, err = takeNodeLock(ctx, cfg.ConnConfig.Copy(), daemonLocks(opt.Node, where), opt.Node, where, log); err != nil {
			pool.Close()
			return nil, redactErr(err, opt.URL)
		}
	}
	if err := s.open(ctx, opt.KeyDir); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

func (s *Store) open(ctx context.Context, keyDir string) error {
	if err := migrate(ctx, s.pool, s.where); err != nil {
		return redactErr(err, s.url)
	}
	return s.openWebhookSecrets(ctx, keyDir)
}

// lockLost returns the error of a fenced call (a sandbox write, a join,
// a heartbeat, Exclusive) once another daemon took this handle's lock
// (nodeLock), or nil.
func (s *Store) lockLost() error {
	if s.lock == nil {
		return nil
	}
	return s.lock.lostError()
}

// Where returns the database's URL without its password.
func (s *Store) Where() string { return s.where }

// Close closes every connection. Calling it again does nothing.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		s.pool.Close()
		if s.lock != nil {
			s.lock.release()
		}
	})
	return nil
}

// redactErr returns err, or an error of the same text without the
// password of raw (in its user part or its password parameter) where the
// driver quoted it.
func redactErr(err error, raw string) error {
	u, perr := url.Parse(raw)
	if perr != nil {
		return err
	}
	pw := u.Query().Get("password")
	if p, ok := u.User.Password(); ok {
		pw = p
	}
	if pw != "" && strings.Contains(err.Error(), pw) {
		return errors.New(strings.ReplaceAll(err.Error(), pw, "xxxxx"))
	}
	return err
}

// inTx runs fn in a transaction and commits it when fn returns nil.
func (s *Store) inTx(ctx context.Context, op string, fn func(tx pgx.Tx) error) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return wrap(err, "", op)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	if err := fn(tx); err != nil {
		return err
	}
	if err := tx.Commit(ctx); err != nil {
		if isConnection(err) && !errors.Is(err, context.Canceled) && !errors.Is(err, context.DeadlineExceeded) {
			// The commit may have reached the server before the connection
			// went: the change is either wholly there or wholly not.
			return &torpor.Error{Code: torpor.EUnavailable, Reason: ReasonStoreUnavailable, RetryAfter: unavailableRetry,
				Message: "the database connection was lost while committing; the change was made wholly or not at all: read the state again before retrying"}
		}
		return wrap(err, "", op)
	}
	return nil
}

// query runs a read and collects its rows with scan; no rows is nil, as
// the SQLite store returns it.
func query[T any](ctx context.Context, s *Store, op string, scan func(pgx.CollectableRow) (T, error), sql string, args ...any) ([]T, error) {
	rows, err := s.pool.Query(ctx, sql, args...)
	if err != nil {
		return nil, wrap(err, "", op)
	}
	out, err := pgx.CollectRows(rows, scan)
	if err != nil {
		return nil, wrap(err, "", op)
	}
	if len(out) == 0 {
		return nil, nil
	}
	return out, nil
}

// micros is how a time is stored: microseconds since the Unix epoch, as
// the SQLite store keeps it.
func micros(t time.Time) int64 { return t.UnixMicro() }

// fromMicros is the inverse of micros, in UTC.
func fromMicros(us int64) time.Time { return time.UnixMicro(us).UTC() }
