// Package pgtest starts a throwaway PostgreSQL 15 server for tests: one
// server per test binary, started when a test first asks for a database,
// with its data directory and Unix socket in a temporary folder, and a
// fresh database for each test. A package that uses it calls Main from its
// TestMain, which stops the server when the tests end.
//
// A test binary without Main (the e2e tests) uses New, a server of the
// test's own, stopped in its cleanup.
//
// The server runs as the user running the tests, or as the postgres user
// when that is root (PostgreSQL refuses to run as root). A test skips,
// naming what is missing, when there is no PostgreSQL 15 on the machine.
//
// The server is a test server: fsync is off (but for NewDurable), and
// anyone on the machine who can reach its socket is trusted.
package pgtest

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// BinDir is where Debian's postgresql-15 package puts the server's
// programs.
const BinDir = "/usr/lib/postgresql/15/bin"

// binDir is BinDir, but for the test of the skip message.
var binDir = BinDir

// Server is a running test server.
type Server struct {
	dir    string   // data directory and socket folder
	runAs  []string // the command prefix that runs a program as the server's user
	logBuf string   // the server's log file

	// durable servers fsync their commits, as a production server does
	// (for benchmarks against SQLite's synchronous=FULL).
	durable bool

	mu      sync.Mutex
	running bool
}

var (
	once     sync.Once
	shared   *Server
	startErr error
	skipWhy  string
	dbSeq    atomic.Int64
)

// Main runs the tests of a package, then stops the server if one was
// started. Call it from TestMain: os.Exit(pgtest.Main(m)).
func Main(m *testing.M) int {
	code := m.Run()
	if shared != nil {
		shared.stop()
	}
	return code
}

// Shared returns the test binary's server, starting it on first use. It
// skips tb when PostgreSQL is missing and fails it when the server does
// not start.
func Shared(tb testing.TB) *Server {
	tb.Helper()
	once.Do(func() {
		if why := missing(); why != "" {
			skipWhy = why
			return
		}
		shared, startErr = start(false)
	})
	if skipWhy != "" {
		tb.Skip(skipWhy)
	}
	if startErr != nil {
		tb.Fatalf("pgtest: %v", startErr)
	}
	return shared
}

// New starts a server of tb's own, stopped and removed when tb ends: for
// a test that stops and starts the server under a daemon. It skips tb
// when PostgreSQL is missing.
func New(tb testing.TB) *Server { return newServer(tb, false) }

// NewDurable is New with fsync and synchronous commits on, as a
// production server runs: for benchmarks, where a commit's cost counts.
func NewDurable(tb testing.TB) *Server { return newServer(tb, true) }

func newServer(tb testing.TB, durable bool) *Server {
	tb.Helper()
	if why := missing(); why != "" {
		tb.Skip(why)
	}
	s, err := start(durable)
	if err != nil {
		tb.Fatalf("pgtest: %v", err)
	}
	tb.Cleanup(s.stop)
	return s
}

// NewDatabase creates a fresh, empty database on the shared server,
// dropped when tb ends, and returns its connection URL.
func NewDatabase(tb testing.TB) string {
	tb.Helper()
	return Shared(tb).NewDatabase(tb)
}

// NewDatabase creates a fresh, empty database on s, dropped when tb ends,
// and returns its connection URL.
func (s *Server) NewDatabase(tb testing.TB) string {
	tb.Helper()
	name := fmt.Sprintf("t%d_%d", os.Getpid(), dbSeq.Add(1))
	if err := s.admin(tb.Context(), "CREATE DATABASE "+name); err != nil {
		tb.Fatalf("pgtest: create database: %v", err)
	}
	tb.Cleanup(func() {
		// WITH (FORCE) ends connections a test left open.
		if err := s.admin(context.Background(), "DROP DATABASE IF EXISTS "+name+" WITH (FORCE)"); err != nil {
			tb.Logf("pgtest: drop database %s: %v", name, err)
		}
	})
	return s.URL(name)
}

// URL returns the connection URL of database db on the server.
func (s *Server) URL(db string) string {
	u := url.URL{Scheme: "postgres", User: url.User("postgres"), Host: "", Path: "/" + db,
		RawQuery: url.Values{"host": {s.dir}, "sslmode": {"disable"}}.Encode()}
	return u.String()
}

// Dir returns the server's data directory, which holds its socket.
func (s *Server) Dir() string { return s.dir }

// Stop stops the server (fast shutdown: sessions are ended, as in a
// restart of the database), keeping its data.
func (s *Server) Stop() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.running {
		return nil
	}
	if err := s.pgctl("-m", "fast", "-w", "stop"); err != nil {
		return err
	}
	s.running = false
	return nil
}

// Start starts a stopped server again; a running one is left alone.
func (s *Server) Start() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running {
		return nil
	}
	if err := s.pgctl("-w", "-t", "60", "-l", s.logBuf, "-o", serverOptions(s.dir, s.durable), "start"); err != nil {
		return err
	}
	s.running = true
	return nil
}

// missing says what this machine lacks to run a server, or "".
func missing() string {
	for _, prog := range []string{"initdb", "pg_ctl", "postgres"} {
		if _, err := os.Stat(filepath.Join(binDir, prog)); err != nil {
			return fmt.Sprintf("PostgreSQL 15 (%s) not installed: apt-get install postgresql (Debian 12), or run scripts/test.sh", filepath.Join(binDir, prog))
		}
	}
	if os.Geteuid() == 0 {
		if _, err := user.Lookup("postgres"); err != nil {
			return "PostgreSQL cannot run as root and there is no postgres user to run it as"
		}
		if _, err := exec.LookPath("runuser"); err != nil {
			return "running PostgreSQL as the postgres user needs runuser (util-linux)"
		}
	}
	return ""
}

// serverOptions are the server's settings: a socket in dir and no TCP
// port, so parallel test binaries never collide, and no fsync unless
// durable.
func serverOptions(dir string, durable bool) string {
	o := fmt.Sprintf("-c listen_addresses='' -c unix_socket_directories='%s' -c max_connections=400", dir)
	if !durable {
		o += " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"
	}
	return o
}

func start(durable bool) (*Server, error) {
	dir, err := os.MkdirTemp("", "torpor-pg-")
	if err != nil {
		return nil, err
	}
	s := &Server{dir: dir, logBuf: filepath.Join(dir, "server.log"), durable: durable}
	if os.Geteuid() == 0 {
		u, err := user.Lookup("postgres")
		if err != nil {
			return nil, err
		}
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		if err := os.Chown(dir, uid, gid); err != nil {
			return nil, err
		}
		s.runAs = []string{"runuser", "-u", "postgres", "--"}
	}
	data := filepath.Join(dir, "data")
	out, err := s.command(filepath.Join(binDir, "initdb"), "-D", data, "-U", "postgres", "--auth=trust", "--no-sync", "-E", "UTF8", "--locale=C").CombinedOutput()
	if err != nil {
		os.RemoveAll(dir)
		return nil, fmt.Errorf("initdb in %s (can the postgres user reach it? TMPDIR must be searchable by it): %v: %s", dir, err, out)
	}
	if err := s.Start(); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	s.watch()
	return s, nil
}

// watch starts a watchdog, in a session of its own, that stops the server
// and removes its folder once this test binary is gone: a panic or a
// timeout kills the binary before Main or a cleanup can.
func (s *Server) watch() {
	pgctl := strings.Join(append(append([]string{}, s.runAs...), filepath.Join(binDir, "pg_ctl")), " ")
	script := fmt.Sprintf(`while kill -0 %d 2>/dev/null && [ -d '%s' ]; do sleep 1; done
[ -d '%s' ] || exit 0
%s -D '%s/data' -m immediate stop >/dev/null 2>&1
rm -rf '%s'`, os.Getpid(), s.dir, s.dir, pgctl, s.dir, s.dir)
	cmd := exec.Command("sh", "-c", script)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err == nil {
		go cmd.Wait()
	}
}

func (s *Server) command(prog string, args ...string) *exec.Cmd {
	argv := append(append(append([]string{}, s.runAs...), prog), args...)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = s.dir
	return cmd
}

func (s *Server) pgctl(args ...string) error {
	args = append([]string{"-D", filepath.Join(s.dir, "data")}, args...)
	out, err := s.command(filepath.Join(binDir, "pg_ctl"), args...).CombinedOutput()
	if err != nil {
		log, _ := os.ReadFile(s.logBuf)
		return fmt.Errorf("pg_ctl %s: %v: %s\nserver log:\n%s", strings.Join(args, " "), err, out, log)
	}
	return nil
}

// stop stops the server for good and removes its folder.
func (s *Server) stop() {
	_ = s.pgctl("-m", "immediate", "-w", "stop")
	os.RemoveAll(s.dir)
}

// admin runs one statement on the server's postgres database.
func (s *Server) admin(ctx context.Context, stmt string) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	conn, err := pgx.Connect(ctx, s.URL("postgres"))
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, stmt)
	if err != nil && strings.Contains(err.Error(), "is being accessed by other users") {
		return errors.New("database still in use: " + err.Error())
	}
	return err
}
