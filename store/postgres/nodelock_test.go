package postgres_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/torpor-dev/torpor"
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
	// The holder notices within its check period and takes the lock
	// again. (Another Open meanwhile would take it first: see
	// TestLockTakenWhileAway.)
	waitForAdvisoryLocks(t, url, 1)
	if b, err := postgres.Open(t.Context(), opt); !errors.Is(err, postgres.ErrDatabaseInUse) {
		if err == nil {
			b.Close()
		}
		t.Fatalf("a second exclusive Open after a server restart: %v, want ErrDatabaseInUse", err)
	}
	if err := a.MarkSeen(t.Context(), time.Now()); err != nil {
		t.Errorf("a write of the holder after it took its lock again: %v", err)
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

// waitForAdvisoryLocks waits until n advisory locks are held on the
// database at url, connecting afresh each time (the server may be
// starting), or fails after 30 s.
func waitForAdvisoryLocks(t *testing.T, url string, n int) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		held := -1
		if conn, err := pgx.Connect(t.Context(), url); err == nil {
			_ = conn.QueryRow(t.Context(), `SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
				AND database = (SELECT oid FROM pg_database WHERE datname = current_database())`).Scan(&held)
			conn.Close(context.Background())
		}
		if held >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 30 s, %d advisory locks are held, want %d", held, n)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// A server restart ends the session of a node's lock; when another daemon
// under the same node name (a copy of the host, crash-looping on
// ErrNodeInUse) takes the lock before the holder is back, the holder
// finds it taken and stops acting as the node: its sandbox writes,
// heartbeats, joins and Exclusive are refused as fenced, for good, while
// the other daemon works. (Here the session is terminated, which a
// restart does to every session; the holder may win the race to the
// lock, and then the test tries again.)
func TestLockTakenWhileAway(t *testing.T) {
	url, dir := pgtest.NewDatabase(t), t.TempDir()
	ctx := t.Context()
	opt := postgres.Options{URL: url, KeyDir: dir, Node: "node-a"}
	a, err := postgres.Open(ctx, opt)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	epoch, err := a.JoinNode(ctx, torpor.Node{Name: "node-a", Instance: "first"})
	if err != nil {
		t.Fatal(err)
	}
	sb := &torpor.Sandbox{ID: "sb_1", Tenant: "acme", State: torpor.StateRunning, Node: "node-a", NodeEpoch: epoch, CreatedAt: time.Now().UTC()}
	if err := a.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	admin := connect(t, url)

	var b *postgres.Store
	for try := 1; b == nil; try++ {
		if try > 5 {
			t.Fatal("the holder took its lock again first 5 times in a row")
		}
		if n := terminateLockHolders(t, admin); n != 1 {
			t.Fatalf("ended %d sessions holding advisory locks, want the node lock's", n)
		}
		s, err := postgres.Open(ctx, opt)
		if errors.Is(err, postgres.ErrNodeInUse) {
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		b = s
	}
	defer b.Close()

	deadline := time.Now().Add(5 * time.Second)
	for {
		err := a.UpdateSandbox(ctx, sb.Clone())
		if err != nil {
			wantFencedErr(t, err, "the first daemon's update once the other took its lock")
			break
		}
		sb.Version++
		if time.Now().After(deadline) {
			t.Fatal("5 s after another daemon took its lock, the first still writes")
		}
		time.Sleep(50 * time.Millisecond)
	}
	_, err = a.Heartbeat(ctx, "node-a", epoch, torpor.Resources{}, 0)
	wantFencedErr(t, err, "the first daemon's heartbeat")
	wantFencedErr(t, a.MarkSeen(ctx, time.Now(), sb.ID), "the first daemon's MarkSeen")
	wantFencedErr(t, a.CreateSandbox(ctx, &torpor.Sandbox{ID: "sb_2", Tenant: "acme", State: torpor.StateRunning, CreatedAt: time.Now().UTC()}),
		"the first daemon's create")
	_, err = a.JoinNode(ctx, torpor.Node{Name: "node-a", Instance: "first"})
	wantFencedErr(t, err, "the first daemon's join")
	ran := false
	if ok, err := a.Exclusive(ctx, "webhooks", func(context.Context) error { ran = true; return nil }); ok || ran || err == nil {
		t.Errorf("the first daemon's Exclusive = %v, %v (ran %v); want false and an error", ok, err, ran)
	}
	// It stays so: it does not take the lock back when free.
	time.Sleep(1500 * time.Millisecond)
	wantFencedErr(t, a.MarkSeen(ctx, time.Now(), sb.ID), "the first daemon's MarkSeen later")

	// The other daemon works.
	if _, err := b.JoinNode(ctx, torpor.Node{Name: "node-a", Instance: "first"}); err != nil {
		t.Fatalf("the other daemon's join: %v", err)
	}
	got, err := b.GetSandbox(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if err := b.UpdateSandbox(ctx, got); err != nil {
		t.Errorf("the other daemon's update: %v", err)
	}
}

// wantFencedErr fails the test unless err is unavailable with reason
// fenced.
func wantFencedErr(t *testing.T, err error, what string) {
	t.Helper()
	var e *torpor.Error
	if !errors.As(err, &e) || e.Code != torpor.EUnavailable || e.Reason != torpor.ReasonFenced {
		t.Errorf("%s: %v, want the unavailable error with reason %q", what, err, torpor.ReasonFenced)
	}
}
