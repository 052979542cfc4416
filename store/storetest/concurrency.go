package storetest

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

func concurrencyTests() []test {
	return []test{
		{"UpdatesToDifferentSandboxes", testParallelUpdates},
		{"RacingUpdatesOneWins", testRacingUpdates},
		{"RacingCreatesOneWins", testRacingCreates},
		{"CursorFollowerMissesNoEvent", testCursorFollower},
	}
}

// Many writers, each on its own sandbox, with readers alongside: every
// update lands, none is refused, and the events of each sandbox are in its
// own order.
func testParallelUpdates(t *testing.T, h *harness) {
	const workers, updates = 8, 20
	for w := range workers {
		sb := newSandbox(fmt.Sprintf("sb_w%d", w), "acme", torpor.StateRunning, at(time.Duration(w)*time.Second))
		h.create(sb, event(sb, torpor.EventCreated, at(0), nil))
	}

	ctx := t.Context()
	errs := make(chan error, workers*updates+2)
	done := make(chan struct{})
	var writers, readers sync.WaitGroup
	for w := range workers {
		writers.Go(func() {
			sb := newSandbox(fmt.Sprintf("sb_w%d", w), "acme", torpor.StateRunning, at(time.Duration(w)*time.Second))
			sb.Version = 1
			for i := range updates {
				sb.Boots = i + 1
				sb.Metadata = map[string]string{"n": strconv.Itoa(i + 1)}
				e := event(sb, torpor.EventStateChange, at(time.Duration(i)*time.Millisecond), map[string]string{"n": strconv.Itoa(i + 1)})
				if err := h.s.UpdateSandbox(ctx, sb, e); err != nil {
					errs <- fmt.Errorf("UpdateSandbox(%s, version %d): %w", sb.ID, sb.Version, err)
					return
				}
			}
		})
	}
	for range 2 {
		readers.Go(func() {
			for {
				select {
				case <-done:
					return
				default:
				}
				if _, err := h.s.ListSandboxes(ctx, torpor.SandboxFilter{Tenant: "acme"}); err != nil {
					errs <- fmt.Errorf("ListSandboxes during writes: %w", err)
					return
				}
				if _, err := h.s.ListEvents(ctx, torpor.EventFilter{Limit: 50}); err != nil {
					errs <- fmt.Errorf("ListEvents during writes: %w", err)
					return
				}
			}
		})
	}
	writers.Wait()
	close(done)
	readers.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if t.Failed() {
		return
	}

	for w := range workers {
		id := fmt.Sprintf("sb_w%d", w)
		if sb := h.get(id); sb.Version != updates+1 || sb.Boots != updates {
			t.Errorf("%s: version %d, boots %d; want %d and %d", id, sb.Version, sb.Boots, updates+1, updates)
		}
		evs := h.events(torpor.EventFilter{SandboxID: id})
		if len(evs) != updates+1 {
			t.Errorf("%s: %d events, want %d", id, len(evs), updates+1)
			continue
		}
		for i, e := range evs[1:] {
			if e.Attrs["n"] != strconv.Itoa(i+1) {
				t.Errorf("%s: event %d is update %s, want %d", id, i+1, e.Attrs["n"], i+1)
			}
		}
	}
	all := h.events(torpor.EventFilter{})
	if len(all) != workers*(updates+1) {
		t.Errorf("%d events in all, want %d", len(all), workers*(updates+1))
	}
	checkIncreasing(t, all)
}

// Two writers holding the same version update at once: exactly one wins,
// the other gets a conflict, and only the winner's change and event are
// stored.
func testRacingUpdates(t *testing.T, h *harness) {
	const rounds = 20
	sb := newSandbox("sb_race", "acme", torpor.StateRunning, at(0))
	h.create(sb)
	ctx := t.Context()

	for round := range rounds {
		cur := h.get(sb.ID)
		racers := []*torpor.Sandbox{cur.Clone(), cur.Clone()}
		errs := make([]error, len(racers))
		start := make(chan struct{})
		var wg sync.WaitGroup
		for i, r := range racers {
			r.Handle = fmt.Sprintf("round %d racer %d", round, i)
			wg.Go(func() {
				<-start
				errs[i] = h.s.UpdateSandbox(ctx, r, event(r, torpor.EventStateChange, at(0), map[string]string{"handle": r.Handle}))
			})
		}
		close(start)
		wg.Wait()

		winner := -1
		for i, err := range errs {
			switch {
			case err == nil && winner >= 0:
				t.Fatalf("round %d: both updates of version %d succeeded", round, cur.Version)
			case err == nil:
				winner = i
			default:
				wantCode(t, err, torpor.EConflict, fmt.Sprintf("round %d: the losing update", round))
				if racers[i].Version != cur.Version {
					t.Errorf("round %d: the loser's Version moved to %d", round, racers[i].Version)
				}
			}
		}
		if winner < 0 {
			t.Fatalf("round %d: both updates of version %d failed", round, cur.Version)
		}
		got := h.get(sb.ID)
		if got.Version != cur.Version+1 || got.Handle != racers[winner].Handle {
			t.Fatalf("round %d: stored version %d handle %q; want %d and the winner's %q",
				round, got.Version, got.Handle, cur.Version+1, racers[winner].Handle)
		}
	}

	evs := h.events(torpor.EventFilter{SandboxID: sb.ID})
	if len(evs) != rounds {
		t.Fatalf("%d events after %d races, want one per race", len(evs), rounds)
	}
	for i, e := range evs {
		if !strings.HasPrefix(e.Attrs["handle"], fmt.Sprintf("round %d ", i)) {
			t.Errorf("event %d is from %q, want round %d's winner", i, e.Attrs["handle"], i)
		}
	}
}

// Several callers create the same id at once: one wins, the others get a
// conflict, and the record is the winner's.
func testRacingCreates(t *testing.T, h *harness) {
	const racers = 8
	ctx := t.Context()
	errs := make([]error, racers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range racers {
		wg.Go(func() {
			sb := newSandbox("sb_same", fmt.Sprintf("tenant%d", i), torpor.StateRunning, at(0))
			<-start
			errs[i] = h.s.CreateSandbox(ctx, sb, event(sb, torpor.EventCreated, at(0), nil))
		})
	}
	close(start)
	wg.Wait()

	winner := -1
	for i, err := range errs {
		if err == nil {
			if winner >= 0 {
				t.Fatalf("racers %d and %d both created sb_same", winner, i)
			}
			winner = i
			continue
		}
		wantCode(t, err, torpor.EConflict, fmt.Sprintf("racer %d's create", i))
	}
	if winner < 0 {
		t.Fatal("no racer created sb_same")
	}
	if got, want := h.get("sb_same").Tenant, fmt.Sprintf("tenant%d", winner); got != want {
		t.Errorf("stored tenant %q, want the winner's %q", got, want)
	}
	if evs := h.events(torpor.EventFilter{}); len(evs) != 1 {
		t.Errorf("%d events after racing creates, want the winner's one", len(evs))
	}
}

// A client that follows the event stream with a cursor while writers
// commit in parallel sees every event exactly once: an event never becomes
// visible after one with a larger Seq was listed (the SSE stream relies on
// it).
func testCursorFollower(t *testing.T, h *harness) {
	const workers, updates = 4, 25
	for w := range workers {
		sb := newSandbox(fmt.Sprintf("sb_w%d", w), "acme", torpor.StateRunning, at(0))
		h.create(sb)
	}
	ctx := t.Context()
	errs := make(chan error, workers+1)
	var writers sync.WaitGroup
	for w := range workers {
		writers.Go(func() {
			sb := h.get(fmt.Sprintf("sb_w%d", w))
			for i := range updates {
				sb.Boots = i + 1
				if err := h.s.UpdateSandbox(ctx, sb, event(sb, torpor.EventStateChange, at(0), nil)); err != nil {
					errs <- fmt.Errorf("UpdateSandbox(%s): %w", sb.ID, err)
					return
				}
			}
		})
	}
	writing := make(chan struct{})
	go func() { writers.Wait(); close(writing) }()

	var seen []torpor.Event
	var after int64
	follow := func() error {
		page, err := h.s.ListEvents(ctx, torpor.EventFilter{After: after, Limit: 7})
		if err != nil {
			return err
		}
		if len(page) > 0 {
			seen = append(seen, page...)
			after = page[len(page)-1].Seq
		}
		return nil
	}
	var followErr error
	for done := false; !done && followErr == nil; {
		select {
		case <-writing:
			done = true
		default:
		}
		followErr = follow()
	}
	// Never leave writers running past the test; then drain the last
	// commits.
	<-writing
	for n := -1; n != len(seen) && followErr == nil; {
		n = len(seen)
		followErr = follow()
	}
	if followErr != nil {
		t.Fatalf("ListEvents while following the stream: %v", followErr)
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}

	all := h.events(torpor.EventFilter{})
	if len(seen) != len(all) || len(all) != workers*updates {
		t.Fatalf("the follower saw %d events; the store holds %d; %d were written", len(seen), len(all), workers*updates)
	}
	for i := range all {
		if seen[i].Seq != all[i].Seq {
			t.Fatalf("the follower's event %d has Seq %d, the store's has %d", i, seen[i].Seq, all[i].Seq)
		}
	}
}
