package postgres_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/store/postgres"
	"github.com/torpor-dev/torpor/store/postgres/pgtest"
)

// Two daemons (two stores, each with its own pool) on one database, as
// two nodes of a fleet, race the same transition of one sandbox: in every
// round exactly one wins and the other gets a conflict, and only the
// winner's event is stored. Their events, written at once, reach a
// follower in order, none skipped.
func TestTwoStoresOneDatabase(t *testing.T) {
	url, dir := pgtest.NewDatabase(t), t.TempDir()
	ctx := t.Context()
	// Two nodes of a fleet, each fencing its writes with its epoch.
	var stores []*postgres.Store
	for _, node := range []string{"node-a", "node-b"} {
		s, err := postgres.Open(ctx, postgres.Options{URL: url, KeyDir: dir, Node: node})
		if err != nil {
			t.Fatalf("Open as %s: %v", node, err)
		}
		defer s.Close()
		if _, err := s.JoinNode(ctx, torpor.Node{Name: node}); err != nil {
			t.Fatal(err)
		}
		stores = append(stores, s)
	}
	a, b := stores[0], stores[1]
	t0 := time.Date(2025, 3, 14, 0, 0, 0, 0, time.UTC)
	sb := &torpor.Sandbox{ID: "sb_race", Tenant: "acme", State: torpor.StateRunning, CreatedAt: t0}
	if err := a.CreateSandbox(ctx, sb); err != nil {
		t.Fatal(err)
	}
	const rounds = 30
	for round := range rounds {
		cur, err := a.GetSandbox(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		racers := []*torpor.Sandbox{cur.Clone(), cur.Clone()}
		errs := make([]error, 2)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i, s := range []torpor.Store{a, b} {
			r := racers[i]
			r.Handle = fmt.Sprintf("round %d store %d", round, i)
			wg.Go(func() {
				<-start
				errs[i] = s.UpdateSandbox(ctx, r, torpor.Event{Type: torpor.EventStateChange, SandboxID: r.ID, Tenant: "acme", Time: t0,
					Attrs: map[string]string{"handle": r.Handle}})
			})
		}
		close(start)
		wg.Wait()
		won := -1
		for i, err := range errs {
			switch {
			case err == nil && won >= 0:
				t.Fatalf("round %d: both stores won version %d", round, cur.Version)
			case err == nil:
				won = i
			case !torpor.IsCode(err, torpor.EConflict):
				t.Fatalf("round %d: the loser got %v, want a conflict", round, err)
			}
		}
		if won < 0 {
			t.Fatalf("round %d: neither store won: %v", round, errs)
		}
		got, _ := b.GetSandbox(ctx, sb.ID)
		if got.Handle != racers[won].Handle || got.Version != cur.Version+1 {
			t.Fatalf("round %d: stored %q at version %d, want the winner's %q at %d", round, got.Handle, got.Version, racers[won].Handle, cur.Version+1)
		}
	}
	evs, err := b.ListEvents(ctx, torpor.EventFilter{SandboxID: sb.ID})
	if err != nil || len(evs) != rounds {
		t.Fatalf("%d events (%v), want one per round: %d", len(evs), err, rounds)
	}

	// Writers on both stores, a follower reading with a cursor.
	const writers, updates = 4, 25
	for w := range writers {
		s := &torpor.Sandbox{ID: fmt.Sprintf("sb_w%d", w), Tenant: "acme", State: torpor.StateRunning, CreatedAt: t0}
		if err := a.CreateSandbox(ctx, s); err != nil {
			t.Fatal(err)
		}
	}
	cursor := evs[len(evs)-1].Seq
	var wg sync.WaitGroup
	done := make(chan struct{})
	for w := range writers {
		st := []torpor.Store{a, b}[w%2]
		wg.Go(func() {
			s, _ := st.GetSandbox(ctx, fmt.Sprintf("sb_w%d", w))
			for range updates {
				if err := st.UpdateSandbox(ctx, s, torpor.Event{Type: torpor.EventStateChange, SandboxID: s.ID, Tenant: "acme", Time: t0}); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	go func() { wg.Wait(); close(done) }()
	var seen []torpor.Event
	for finished := false; ; {
		select {
		case <-done:
			finished = true
		default:
		}
		got, err := a.ListEvents(ctx, torpor.EventFilter{After: cursor})
		if err != nil {
			t.Fatal(err)
		}
		if len(got) > 0 {
			seen, cursor = append(seen, got...), got[len(got)-1].Seq
		}
		if finished && len(got) == 0 {
			break
		}
	}
	all, _ := a.ListEvents(ctx, torpor.EventFilter{After: evs[len(evs)-1].Seq})
	if len(seen) != writers*updates || len(all) != len(seen) {
		t.Fatalf("the follower saw %d events, the store holds %d, %d were written", len(seen), len(all), writers*updates)
	}
}
