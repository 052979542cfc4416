package postgres_test

import (
	"errors"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/store/postgres"
	"github.com/torpor-dev/torpor/store/postgres/pgtest"
)

// A daemon's store takes its database for itself: a second exclusive
// Open is refused while the first is open, also after the server restarted
// under it, and succeeds once it is closed.
func TestExclusiveOpen(t *testing.T) {
	srv := pgtest.New(t)
	url, dir := srv.NewDatabase(t), t.TempDir()
	opt := postgres.Options{URL: url, KeyDir: dir, Exclusive: true}
	a, err := postgres.Open(t.Context(), opt)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if _, err := postgres.Open(t.Context(), opt); !errors.Is(err, postgres.ErrDatabaseInUse) {
		t.Fatalf("a second exclusive Open: %v, want ErrDatabaseInUse", err)
	}

	if err := srv.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	// The holder notices within its check period and takes the lock again.
	deadline := time.Now().Add(30 * time.Second)
	for {
		b, err := postgres.Open(t.Context(), opt)
		if errors.Is(err, postgres.ErrDatabaseInUse) {
			break
		}
		if err == nil {
			b.Close()
		}
		if time.Now().After(deadline) {
			t.Fatalf("30 s after a server restart a second exclusive Open still gets %v", err)
		}
		time.Sleep(500 * time.Millisecond)
	}

	a.Close()
	b, err := postgres.Open(t.Context(), opt)
	if err != nil {
		t.Fatalf("an exclusive Open after the holder closed: %v", err)
	}
	b.Close()
}
