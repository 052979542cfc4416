// Package sqlite is torpor's embedded store: one SQLite file on the local
// disk, in WAL mode with synchronous=FULL, so that a committed change
// survives a crash or a power loss. It implements torpor.Store.
//
// Writes go through a single connection, so concurrent callers queue in Go
// instead of failing with SQLITE_BUSY; reads use a pool of read-only
// connections and run concurrently with the writer. The schema is created
// and upgraded by numbered migrations (PRAGMA user_version) when the store
// opens.
//
// Times are kept to the microsecond, in UTC, as PostgreSQL keeps them.
package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"

	"modernc.org/sqlite"

	"github.com/torpor-dev/torpor"
)

// busyTimeoutMillis is how long a connection waits for a lock held by
// another process (another torpor opening the same file, or a backup tool)
// before it gives up with SQLITE_BUSY.
const busyTimeoutMillis = 10000

// Store is a torpor.Store kept in one SQLite file. It is safe for
// concurrent use.
type Store struct {
	path string
	// write holds exactly one connection: every write transaction runs on
	// it, one after the other.
	write *sql.DB
	// read is a pool of read-only connections.
	read *sql.DB
	// stmts are prepared on write.
	stmts *writeStmts
	// secrets seals webhook secrets with the key beside the database
	// (webhook_secrets.go).
	secrets *secretBox
	// fence is the node this handle writes sandboxes as, once it joined
	// (nodes.go); nil: unfenced.
	fence atomic.Pointer[Fence]
	// exclusive holds the locks of Exclusive.
	exclusive exclusiveLocks

	closeOnce sync.Once
	closeErr  error
}

var _ torpor.Store = (*Store)(nil)

// Open opens the store at path, creating the file (mode 0600) and its
// parent directory (mode 0700) when they are missing, and brings the schema
// up to date. It refuses a database written by a newer torpor (a
// *SchemaVersionError).
func Open(ctx context.Context, path string) (*Store, error) {
	if path == "" {
		return nil, errors.New("sqlite store: empty database path")
	}
	abs, err := filepath.Abs(path)
	if err != nil {
		return nil, fmt.Errorf("sqlite store: %w", err)
	}
	if err := createFile(abs); err != nil {
		return nil, err
	}
	s := &Store{path: abs}
	if err := s.open(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return s, nil
}

// open connects the writer, migrates the schema, then connects the readers.
func (s *Store) open(ctx context.Context) error {
	w, err := openDB(s.path, writerParams())
	if err != nil {
		return err
	}
	w.SetMaxOpenConns(1)
	w.SetMaxIdleConns(1)
	w.SetConnMaxLifetime(0)
	w.SetConnMaxIdleTime(0)
	s.write = w
	if err := checkWAL(ctx, w); err != nil {
		return err
	}
	if err := migrate(ctx, w); err != nil {
		return err
	}
	if s.stmts, err = prepareWrites(ctx, w); err != nil {
		return err
	}
	if err := s.openWebhookSecrets(ctx); err != nil {
		return err
	}

	r, err := openDB(s.path, readerParams())
	if err != nil {
		return err
	}
	n := max(4, runtime.GOMAXPROCS(0))
	r.SetMaxOpenConns(n)
	r.SetMaxIdleConns(n)
	s.read = r
	if err := r.PingContext(ctx); err != nil {
		return fmt.Errorf("sqlite store: open %s for reading: %w", s.path, err)
	}
	return nil
}

// Path returns the absolute path of the database file.
func (s *Store) Path() string { return s.path }

// Close closes every connection. Calling it again does nothing and returns
// the first call's result.
func (s *Store) Close() error {
	s.closeOnce.Do(func() {
		var errs []error
		if s.stmts != nil {
			errs = append(errs, s.stmts.close())
		}
		if s.read != nil {
			errs = append(errs, s.read.Close())
		}
		if s.write != nil {
			errs = append(errs, s.write.Close())
		}
		if err := errors.Join(errs...); err != nil {
			s.closeErr = fmt.Errorf("sqlite store: close: %w", err)
		}
	})
	return s.closeErr
}

// createFile makes the parent directory (0700) and an empty database file
// (0600) when they do not exist yet, so that SQLite never creates them with
// the process umask. SQLite gives the -wal and -shm files the database
// file's mode. Existing files keep their mode.
func createFile(path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return fmt.Errorf("sqlite store: create directory: %w", err)
	}
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("sqlite store: create database file: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("sqlite store: create database file: %w", err)
	}
	return nil
}

// writerParams are the connection settings of the writer. Every
// transaction begins IMMEDIATE: it takes the write lock at once, so it never
// fails halfway when another process wrote in between.
func writerParams() url.Values {
	v := commonParams()
	v.Set("_journal_mode", "WAL")
	v.Set("_txlock", "immediate")
	return v
}

// readerParams are the connection settings of the read pool.
func readerParams() url.Values {
	v := commonParams()
	v.Set("_query_only", "1")
	return v
}

func commonParams() url.Values {
	v := url.Values{}
	v.Set("_busy_timeout", fmt.Sprint(busyTimeoutMillis))
	v.Set("_foreign_keys", "1")
	// FULL: a commit is on stable storage (WAL fsynced) before it returns.
	v.Set("_synchronous", "FULL")
	return v
}

// openDB returns a pool over path with the given connection settings. The
// path travels as a file: URI so that any character in it is safe.
func openDB(path string, params url.Values) (*sql.DB, error) {
	u := url.URL{Scheme: "file", Path: path, RawQuery: params.Encode()}
	c, err := sqlite.NewConnector(u.String())
	if err != nil {
		return nil, fmt.Errorf("sqlite store: open %s: %w", path, err)
	}
	return sql.OpenDB(c), nil
}

// checkWAL fails when the database could not be put in WAL mode (some
// network file systems cannot share memory between processes).
func checkWAL(ctx context.Context, db *sql.DB) error {
	var mode string
	if err := db.QueryRowContext(ctx, "PRAGMA journal_mode").Scan(&mode); err != nil {
		return fmt.Errorf("sqlite store: open: %w", err)
	}
	if mode != "wal" {
		return fmt.Errorf("sqlite store: open: journal mode is %q, not wal; is the file on a local file system?", mode)
	}
	return nil
}
