package sqlite_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	_ "modernc.org/sqlite"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/store/sqlite"
	"github.com/torpor-dev/torpor/store/storetest"
)

// open opens the store at path or fails the test.
func open(t testing.TB, path string) *sqlite.Store {
	t.Helper()
	s, err := sqlite.Open(t.Context(), path)
	if err != nil {
		t.Fatalf("Open(%q): %v", path, err)
	}
	return s
}

func TestStore(t *testing.T) {
	storetest.Run(t, func(t *testing.T) (torpor.Store, func() torpor.Store) {
		path := filepath.Join(t.TempDir(), "torpor.db")
		return open(t, path), func() torpor.Store { return open(t, path) }
	})
}

// Open creates the missing directories private to the user and the
// database private to the user, WAL file included.
func TestOpenCreatesPrivateFiles(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state", "torpor")
	path := filepath.Join(dir, "torpor.db")
	s := open(t, path)
	defer s.Close()
	sb := &torpor.Sandbox{ID: "sb_1", Tenant: "acme", State: torpor.StateRunning}
	if err := s.CreateSandbox(t.Context(), sb); err != nil {
		t.Fatal(err)
	}

	for _, c := range []struct {
		path string
		mode os.FileMode
	}{
		{filepath.Dir(dir), 0o700 | os.ModeDir},
		{dir, 0o700 | os.ModeDir},
		{path, 0o600},
		{path + "-wal", 0o600},
		{path + "-shm", 0o600},
	} {
		fi, err := os.Stat(c.path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != c.mode {
			t.Errorf("%s: mode %s, want %s", c.path, fi.Mode(), c.mode)
		}
	}
}

// The database runs in WAL mode with synchronous=FULL and foreign keys on,
// on every connection the store uses.
func TestPragmas(t *testing.T) {
	path := filepath.Join(t.TempDir(), "torpor.db")
	s := open(t, path)
	defer s.Close()

	for _, c := range []struct {
		pragma string
		want   string
	}{
		{"journal_mode", "wal"},
		{"synchronous", "2"}, // FULL
		{"foreign_keys", "1"},
		{"busy_timeout", "10000"},
		{"user_version", strconv.Itoa(sqlite.SchemaVersion())},
	} {
		for _, db := range s.DBsForTest() {
			var got string
			if err := db.QueryRowContext(t.Context(), "PRAGMA "+c.pragma).Scan(&got); err != nil {
				t.Fatalf("PRAGMA %s: %v", c.pragma, err)
			}
			if got != c.want {
				t.Errorf("PRAGMA %s = %s, want %s", c.pragma, got, c.want)
			}
		}
	}
}

// A database from a newer torpor is refused with an error that says so,
// and left as it was.
func TestOpenRefusesNewerSchema(t *testing.T) {
	path := filepath.Join(t.TempDir(), "torpor.db")
	open(t, path).Close()
	setUserVersion(t, path, 99)

	_, err := sqlite.Open(t.Context(), path)
	var verr *sqlite.SchemaVersionError
	if !errors.As(err, &verr) {
		t.Fatalf("Open of a schema-99 database: %v, want a *SchemaVersionError", err)
	}
	if verr.Found != 99 || verr.Supported != sqlite.SchemaVersion() {
		t.Errorf("SchemaVersionError = %+v, want Found 99 and Supported %d", verr, sqlite.SchemaVersion())
	}
	t.Logf("error: %v", err)
	if got := userVersion(t, path); got != 99 {
		t.Errorf("refused Open changed user_version to %d", got)
	}
}

// Opening again leaves the schema alone and keeps the data.
func TestReopenKeepsSchema(t *testing.T) {
	path := filepath.Join(t.TempDir(), "torpor.db")
	for range 3 {
		open(t, path).Close()
	}
	if got := userVersion(t, path); got != sqlite.SchemaVersion() {
		t.Errorf("user_version after three opens = %d, want %d", got, sqlite.SchemaVersion())
	}
}

func TestOpenEmptyPath(t *testing.T) {
	if _, err := sqlite.Open(t.Context(), ""); err == nil {
		t.Fatal("Open(\"\") succeeded")
	}
}

// A path with characters that mean something in a URI still names the
// file it says.
func TestOpenOddPath(t *testing.T) {
	path := filepath.Join(t.TempDir(), "dir with space?&#%", "t?rpor#1.db")
	s := open(t, path)
	if err := s.PutTemplate(t.Context(), torpor.Template{Name: "base", RootFS: "/x", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	s.Close()
	if _, err := os.Stat(path); err != nil {
		t.Fatalf("database not at the path given: %v", err)
	}
	s = open(t, path)
	defer s.Close()
	if _, err := s.GetTemplate(t.Context(), "base"); err != nil {
		t.Fatalf("GetTemplate after reopen: %v", err)
	}
}

// Errors a caller sees name the problem, not the SQL behind it.
func TestErrorsHideSQL(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "torpor.db"))
	defer s.Close()
	ctx := t.Context()
	sb := &torpor.Sandbox{ID: "sb_1", Tenant: "acme"}
	if err := s.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateTenant(ctx, torpor.Tenant{Name: "acme"}); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateAPIKey(ctx, torpor.APIKey{ID: "k1", Tenant: "acme", Hash: "h"}); err != nil {
		t.Fatal(err)
	}
	for _, err := range []error{
		s.CreateSandbox(ctx, &torpor.Sandbox{ID: "sb_1"}),
		s.CreateTenant(ctx, torpor.Tenant{Name: "acme"}),
		s.CreateAPIKey(ctx, torpor.APIKey{ID: "k2", Tenant: "acme", Hash: "h"}),
		s.CreateAPIKey(ctx, torpor.APIKey{ID: "k1", Tenant: "acme", Hash: "h2"}),
	} {
		msg := torpor.AsError(err).Message
		for _, leak := range []string{"constraint", "UNIQUE", "INSERT", "sandboxes.", "api_keys", "SQLITE"} {
			if strings.Contains(msg, leak) {
				t.Errorf("error message %q shows %q", msg, leak)
			}
		}
		if torpor.ErrorCodeOf(err) != torpor.EConflict {
			t.Errorf("got %v, want a conflict", err)
		}
	}
}

// A write that finds no room ("database or disk is full": here the
// database's page limit, which SQLite reports as it reports a full file
// system) is torpor.DiskFull, 503 with no driver text; nothing of it is
// kept, reads go on, and writes work again once there is room.
func TestFullDiskIsDiskFull(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "torpor.db"))
	defer s.Close()
	ctx := t.Context()
	if err := s.CreateSandbox(ctx, &torpor.Sandbox{ID: "sb_1", Tenant: "acme"}); err != nil {
		t.Fatal(err)
	}
	w := s.DBsForTest()[0] // the one writer connection: the pragma stays on it
	var pages int64
	if err := w.QueryRowContext(ctx, "PRAGMA page_count").Scan(&pages); err != nil {
		t.Fatal(err)
	}
	if _, err := w.ExecContext(ctx, fmt.Sprintf("PRAGMA max_page_count = %d", pages)); err != nil {
		t.Fatal(err)
	}
	big := map[string]string{"k": strings.Repeat("x", 64<<10)}
	err := s.CreateSandbox(ctx, &torpor.Sandbox{ID: "sb_2", Tenant: "acme", Metadata: big})
	if !torpor.IsDiskFull(err) || torpor.ErrorCodeOf(err) != torpor.EUnavailable {
		t.Fatalf("a write with no room: %v, want the full data disk", err)
	}
	if msg := torpor.AsError(err).Message; strings.Contains(msg, "SQLITE") || strings.Contains(msg, "(13)") {
		t.Errorf("error message %q shows the driver's", msg)
	}
	if _, err := s.GetSandbox(ctx, "sb_2"); !torpor.IsCode(err, torpor.ENotFound) {
		t.Errorf("the refused sandbox: %v, want not found", err)
	}
	if _, err := s.GetSandbox(ctx, "sb_1"); err != nil {
		t.Errorf("a read with the disk full: %v", err)
	}
	if _, err := w.ExecContext(ctx, "PRAGMA max_page_count = 1073741823"); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateSandbox(ctx, &torpor.Sandbox{ID: "sb_2", Tenant: "acme", Metadata: big}); err != nil {
		t.Fatalf("a write once there is room: %v", err)
	}
}

// A write waiting for the writer connection gives up when its context
// ends, instead of queueing for ever.
func TestWriteWaitHonorsContext(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "torpor.db"))
	defer s.Close()
	// Hold the only writer connection.
	tx, err := s.DBsForTest()[0].BeginTx(t.Context(), nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()

	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	err = s.CreateTenant(ctx, torpor.Tenant{Name: "acme"})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("CreateTenant while the writer is busy: %v, want context.DeadlineExceeded", err)
	}
	// Reads do not wait for the writer.
	if _, err := s.ListTenants(t.Context()); err != nil {
		t.Fatalf("ListTenants while the writer is busy: %v", err)
	}
}

func TestCloseTwice(t *testing.T) {
	s := open(t, filepath.Join(t.TempDir(), "torpor.db"))
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// rawDB opens path with the plain driver, outside the store.
func rawDB(t *testing.T, path string) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

func setUserVersion(t *testing.T, path string, v int) {
	t.Helper()
	if _, err := rawDB(t, path).ExecContext(t.Context(), fmt.Sprintf("PRAGMA user_version = %d", v)); err != nil {
		t.Fatal(err)
	}
}

func userVersion(t *testing.T, path string) int {
	t.Helper()
	var v int
	if err := rawDB(t, path).QueryRowContext(t.Context(), "PRAGMA user_version").Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}
