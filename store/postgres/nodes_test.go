package postgres_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/store/postgres"
	"github.com/torpor-dev/torpor/store/postgres/pgtest"
)

// waitForLockWait waits until n sessions of the database are waiting for
// a lock of the kind event ("advisory", "transactionid", ...), or fails.
func waitForLockWait(t *testing.T, conn *pgx.Conn, event string, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var waiting int
		if err := conn.QueryRow(t.Context(), `SELECT count(*) FROM pg_stat_activity
			WHERE datname = current_database() AND wait_event_type = 'Lock' AND wait_event = $1`, event).Scan(&waiting); err != nil {
			t.Fatal(err)
		}
		if waiting >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("after 10 s, %d sessions wait for a lock of kind %s, want %d", waiting, event, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// DeclareDown serialises with a node's writes: it waits for a write in
// flight, which commits while the node is still up, and a write that
// comes while DeclareDown is under way waits for it and is then fenced.
func TestDeclareDownWaitsForWritesInFlight(t *testing.T) {
	url, dir := pgtest.NewDatabase(t), t.TempDir()
	a, b := open(t, url, dir), open(t, url, dir)
	defer a.Close()
	defer b.Close()
	ctx := t.Context()
	if _, err := a.JoinNode(ctx, torpor.Node{Name: "node-a"}); err != nil {
		t.Fatal(err)
	}
	sb := &torpor.Sandbox{ID: "sb_1", Tenant: "acme", State: torpor.StateRunning, Node: "node-a", CreatedAt: time.Now().UTC()}
	if err := a.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}

	// A write of node-a in flight: past its fence check, held up by a
	// lock on the sandbox's row.
	holder := connect(t, url)
	tx, err := holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// Before the stores close, which waits for their writes: a failed
	// check must not leave the write held up.
	defer func() { tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx, `SELECT 1 FROM sandboxes WHERE id = 'sb_1' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	watch := connect(t, url)
	wrote := make(chan error, 1)
	go func() {
		w := sb.Clone()
		w.State = torpor.StatePaused
		wrote <- a.UpdateSandbox(ctx, w)
	}()
	waitForLockWait(t, watch, "transactionid", 1)

	type declared struct {
		down []torpor.Node
		err  error
	}
	downs := make(chan declared, 1)
	go func() {
		d, err := b.DeclareDown(ctx, 0)
		downs <- declared{d, err}
	}()
	select {
	case d := <-downs:
		t.Fatalf("DeclareDown returned (%v, %v) while a write of the node was in flight", d.down, d.err)
	case <-time.After(50 * time.Millisecond):
	}
	waitForLockWait(t, watch, "advisory", 1)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if err := <-wrote; err != nil {
		t.Fatalf("the write in flight: %v, want it committed before the node went down", err)
	}
	if d := <-downs; d.err != nil || len(d.down) != 1 || d.down[0].Name != "node-a" || d.down[0].State != torpor.NodeUp {
		t.Fatalf("DeclareDown = %+v, %v; want node-a as it was, up", d.down, d.err)
	}
	got, err := b.GetSandbox(ctx, "sb_1")
	if err != nil || got.State != torpor.StatePaused || got.Version != 2 {
		t.Fatalf("the sandbox after the write in flight: %+v, %v; want paused at version 2", got, err)
	}

	// Now DeclareDown of node-b is under way (held up by a heartbeat's
	// row lock) when node-b writes: the write waits, then is fenced.
	b2 := open(t, url, dir)
	defer b2.Close()
	epoch, err := b2.JoinNode(ctx, torpor.Node{Name: "node-b"})
	if err != nil {
		t.Fatal(err)
	}
	tx, err = holder.Begin(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := tx.Exec(ctx, `SELECT 1 FROM nodes WHERE name = 'node-b' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	go func() {
		d, err := a.DeclareDown(ctx, 0)
		downs <- declared{d, err}
	}()
	waitForLockWait(t, watch, "transactionid", 1)
	go func() {
		w := got.Clone()
		w.ID, w.Node = "sb_2", "node-b"
		wrote <- b2.CreateSandbox(ctx, w)
	}()
	waitForLockWait(t, watch, "advisory", 1)
	if err := tx.Rollback(ctx); err != nil {
		t.Fatal(err)
	}
	if d := <-downs; d.err != nil || len(d.down) != 1 || d.down[0].Name != "node-b" || d.down[0].Epoch != epoch {
		t.Fatalf("DeclareDown = %+v, %v; want node-b at epoch %d", d.down, d.err, epoch)
	}
	if err := <-wrote; !torpor.IsCode(err, torpor.EUnavailable) || !strings.Contains(err.Error(), "node-b") {
		t.Fatalf("a write that waited for DeclareDown: %v, want it fenced", err)
	}
	if _, err := a.GetSandbox(ctx, "sb_2"); !torpor.IsCode(err, torpor.ENotFound) {
		t.Errorf("the fenced create: %v, want no sandbox", err)
	}
}

// Exclusive is fleet-wide: while one store holds a lock, another store on
// the same database gets false, and takes it once the first let go, also
// after the holder's fn failed.
func TestExclusiveAcrossStores(t *testing.T) {
	url, dir := pgtest.NewDatabase(t), t.TempDir()
	a, b := open(t, url, dir), open(t, url, dir)
	defer a.Close()
	defer b.Close()
	ctx := t.Context()
	boom := errors.New("boom")
	ok, err := a.Exclusive(ctx, "reaper", func(ctx context.Context) error {
		held, err := b.Exclusive(ctx, "reaper", func(context.Context) error {
			t.Error("the second store ran while the first held the lock")
			return nil
		})
		if held || err != nil {
			t.Errorf("the second store's Exclusive = %v, %v; want false", held, err)
		}
		return boom
	})
	if !ok || !errors.Is(err, boom) {
		t.Fatalf("Exclusive = %v, %v; want true and fn's error", ok, err)
	}
	ok, err = b.Exclusive(ctx, "reaper", func(context.Context) error { return nil })
	if !ok || err != nil {
		t.Fatalf("the second store's Exclusive after the first let go = %v, %v", ok, err)
	}
}

// terminateLockHolders ends, from conn (an admin session), every other
// session of the database that holds an advisory lock, as a server
// restart would, and waits until they are gone. It returns how many it
// ended.
func terminateLockHolders(t *testing.T, conn *pgx.Conn) int {
	t.Helper()
	var n int
	// pg_terminate_backend with a timeout waits for the session to exit,
	// which frees its locks.
	if err := conn.QueryRow(t.Context(), `SELECT count(*) FROM (SELECT DISTINCT pid FROM pg_locks
		WHERE locktype = 'advisory' AND granted AND pid <> pg_backend_pid()
			AND database = (SELECT oid FROM pg_database WHERE datname = current_database())) h
		WHERE pg_terminate_backend(h.pid, 5000)`).Scan(&n); err != nil {
		t.Fatal(err)
	}
	return n
}

// Exclusive lasts as long as the database session holding the lock: when
// that session ends (a server restart; here it is terminated), fn's
// context is cancelled within a couple of seconds, Exclusive says the
// lock was lost, and another store takes the lock, so that two nodes
// never do the work at once for long.
func TestExclusiveEndsWithItsSession(t *testing.T) {
	url, dir := pgtest.NewDatabase(t), t.TempDir()
	a, b := open(t, url, dir), open(t, url, dir)
	defer a.Close()
	defer b.Close()
	admin := connect(t, url)
	ctx := t.Context()
	// Lets fn go where its context is never cancelled, before the stores
	// close (which waits for the lock's connection).
	release := make(chan struct{})
	defer close(release)
	held := make(chan struct{})
	var cancelled time.Duration
	done := make(chan struct{})
	var ok bool
	var err error
	go func() {
		defer close(done)
		ok, err = a.Exclusive(ctx, "webhooks", func(fctx context.Context) error {
			close(held)
			select {
			case <-fctx.Done():
			case <-release:
			}
			return nil
		})
	}()
	<-held
	if again, err := b.Exclusive(ctx, "webhooks", func(context.Context) error { return nil }); again || err != nil {
		t.Fatalf("a second store's Exclusive while the first holds the lock = %v, %v; want false", again, err)
	}
	if n := terminateLockHolders(t, admin); n != 1 {
		t.Fatalf("ended %d sessions holding advisory locks, want the one of the lock", n)
	}
	ended := time.Now()
	select {
	case <-done:
		cancelled = time.Since(ended)
	case <-time.After(5 * time.Second):
		t.Fatal("fn's context is not cancelled 5 s after the lock's session ended")
	}
	if cancelled > 2500*time.Millisecond {
		t.Errorf("fn's context was cancelled %v after the lock's session ended, want within about 2 s", cancelled)
	}
	if !ok || !torpor.IsCode(err, torpor.EUnavailable) || !strings.Contains(err.Error(), "lost the lock") {
		t.Errorf("Exclusive whose session ended = %v, %v; want true and an unavailable error saying the lock was lost", ok, err)
	}
	ran := false
	if again, err := b.Exclusive(ctx, "webhooks", func(context.Context) error { ran = true; return nil }); !again || err != nil || !ran {
		t.Errorf("a second store's Exclusive once the first lost the lock = %v, %v (ran %v); want true", again, err, ran)
	}
	// The first store's pool replaced the connection: it takes the lock
	// again once free.
	if again, err := a.Exclusive(ctx, "webhooks", func(context.Context) error { return nil }); !again || err != nil {
		t.Errorf("the first store's Exclusive afterwards = %v, %v; want true", again, err)
	}
}

// BenchmarkFencedUpdate: one durable state change with an event, by a
// store that never joined (unfenced) and by one that joined a fleet
// (fenced: the fence lock and the epoch check ride in the same batch),
// taking turns on a local server with fsync on. The ratio is fenced over
// unfenced.
func BenchmarkFencedUpdate(b *testing.B) {
	url, dir := pgtest.NewDurable(b).NewDatabase(b), b.TempDir()
	ctx := b.Context()
	plain, fenced := open(b, url, dir), open(b, url, dir)
	defer plain.Close()
	defer fenced.Close()
	if _, err := fenced.JoinNode(ctx, torpor.Node{Name: "node-a"}); err != nil {
		b.Fatal(err)
	}
	t0 := time.Date(2025, 3, 14, 0, 0, 0, 0, time.UTC)
	var sbs []*torpor.Sandbox
	var lat [2][]time.Duration
	for k, s := range []*postgres.Store{plain, fenced} {
		sb := &torpor.Sandbox{ID: "sb_" + strconv.Itoa(k), Tenant: "acme", State: torpor.StateRunning, Node: "node-a", CreatedAt: t0}
		if err := s.CreateSandbox(ctx, sb); err != nil {
			b.Fatal(err)
		}
		sbs = append(sbs, sb)
	}
	for i := 0; b.Loop(); i++ {
		for k, s := range []*postgres.Store{plain, fenced} {
			sb := sbs[k]
			sb.Boots = i
			t1 := time.Now()
			if err := s.UpdateSandbox(ctx, sb, torpor.Event{Type: torpor.EventStateChange, SandboxID: sb.ID, Tenant: "acme", Time: t0}); err != nil {
				b.Fatal(err)
			}
			lat[k] = append(lat[k], time.Since(t1))
		}
	}
	b.ReportMetric(p50(lat[0]), "unfenced-p50-ms")
	b.ReportMetric(p50(lat[1]), "fenced-p50-ms")
	b.ReportMetric(p50(lat[1])/p50(lat[0]), "p50-fenced/unfenced")
}
