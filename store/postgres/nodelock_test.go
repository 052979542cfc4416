package postgres_test

import (
	"errors"
	"strings"
	"sync"
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

// The nodes of a fleet share one database, each under its own name: a
// second daemon with a node name already running is refused with a
// message naming it, and a daemon outside the fleet (Exclusive) and the
// fleet's nodes refuse each other.
func TestNodeLocks(t *testing.T) {
	url, dir := pgtest.NewDatabase(t), t.TempDir()
	ctx := t.Context()
	openAs := func(node string, exclusive bool) (*postgres.Store, error) {
		return postgres.Open(ctx, postgres.Options{URL: url, KeyDir: dir, Node: node, Exclusive: exclusive})
	}
	a, err := openAs("node-a", false)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	b, err := openAs("node-b", false)
	if err != nil {
		t.Fatalf("a second node on the database: %v", err)
	}
	defer b.Close()

	// Each refusal waits for a holder that may be going away; together.
	var wg sync.WaitGroup
	wg.Go(func() {
		s, err := openAs("node-a", false)
		if err == nil {
			s.Close()
		}
		if !errors.Is(err, postgres.ErrNodeInUse) || !strings.Contains(err.Error(), `"node-a"`) {
			t.Errorf("a second node-a: %v, want ErrNodeInUse naming node-a", err)
		}
	})
	wg.Go(func() {
		s, err := openAs("", true)
		if err == nil {
			s.Close()
		}
		if !errors.Is(err, postgres.ErrDatabaseInUse) {
			t.Errorf("an exclusive daemon beside a fleet: %v, want ErrDatabaseInUse", err)
		}
	})
	wg.Wait()

	a.Close()
	b.Close()
	c, err := openAs("", true)
	if err != nil {
		t.Fatalf("an exclusive daemon once the fleet left: %v", err)
	}
	defer c.Close()
	if s, err := openAs("node-a", false); !errors.Is(err, postgres.ErrDatabaseInUse) {
		if err == nil {
			s.Close()
		}
		t.Errorf("a node beside an exclusive daemon: %v, want ErrDatabaseInUse", err)
	}
	c.Close()
	if s, err := openAs("node-a", false); err != nil {
		t.Errorf("node-a once the database is free: %v", err)
	} else {
		s.Close()
	}
}
