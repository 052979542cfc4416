package storetest

import (
	"slices"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

func eventTests() []test {
	return []test{
		{"RoundTripEveryField", testEventRoundTrip},
		{"StoreAssignsSeq", testEventSeqAssigned},
		{"OldestFirstAcrossSandboxes", testEventOrder},
		{"AfterCursor", testEventsAfter},
		{"FilterByTenant", testEventsTenant},
		{"ExceptTenant", testEventsExceptTenant},
		{"FilterBySandbox", testEventsSandbox},
		{"LimitAndPaging", testEventsLimit},
		{"Newest", testEventsNewest},
	}
}

func testEventRoundTrip(t *testing.T, h *harness) {
	sb := newSandbox("sb_ev", "acme", torpor.StateRunning, at(0))
	when := at(1500 * time.Microsecond)
	withAttrs := event(sb, torpor.EventPaused, when, map[string]string{"mode": "snapshot", "reason": "idle for 300s", "empty": ""})
	emptyAttrs := event(sb, torpor.EventStateChange, when, map[string]string{})
	noAttrs := event(sb, torpor.EventCreated, when, nil)
	h.create(sb, withAttrs, emptyAttrs, noAttrs)

	got := h.events(torpor.EventFilter{})
	if len(got) != 3 {
		t.Fatalf("ListEvents returned %d events, want 3", len(got))
	}
	for i, want := range []torpor.Event{withAttrs, emptyAttrs, noAttrs} {
		want.Seq = got[i].Seq
		checkSame(t, "event "+want.Type, got[i], want)
	}
}

// A Seq set by the caller is ignored: the store numbers every event.
func testEventSeqAssigned(t *testing.T, h *harness) {
	sb := newSandbox("sb_ev", "acme", torpor.StateRunning, at(0))
	a := event(sb, torpor.EventCreated, at(0), nil)
	b := event(sb, torpor.EventStarted, at(0), nil)
	a.Seq, b.Seq = 7, 7
	h.create(sb, a, b)
	evs := h.events(torpor.EventFilter{})
	if len(evs) != 2 {
		t.Fatalf("ListEvents returned %d events, want 2", len(evs))
	}
	checkIncreasing(t, evs)
}

// writeEventLog writes a small history across two tenants and three
// sandboxes, interleaved, and returns it as the store listed it.
func writeEventLog(h *harness) []torpor.Event {
	h.t.Helper()
	a1 := newSandbox("sb_a1", "acme", torpor.StateRunning, at(0))
	g1 := newSandbox("sb_g1", "globex", torpor.StateRunning, at(time.Second))
	a2 := newSandbox("sb_a2", "acme", torpor.StateRunning, at(2*time.Second))
	h.create(a1, event(a1, torpor.EventCreated, at(0), nil))
	h.create(g1, event(g1, torpor.EventCreated, at(time.Second), nil))
	h.create(a2, event(a2, torpor.EventCreated, at(2*time.Second), nil))
	a1.State = torpor.StatePaused
	h.update(a1, event(a1, torpor.EventPaused, at(3*time.Second), nil))
	g1.State = torpor.StateHibernated
	h.update(g1, event(g1, torpor.EventHibernated, at(4*time.Second), nil))
	a1.State = torpor.StateRunning
	h.update(a1, event(a1, torpor.EventResumed, at(5*time.Second), nil))
	a2.State = torpor.StateTerminated
	h.update(a2, event(a2, torpor.EventTerminated, at(6*time.Second), nil))

	evs := h.events(torpor.EventFilter{})
	checkIncreasing(h.t, evs)
	if len(evs) != 7 {
		h.t.Fatalf("ListEvents returned %d events, want 7", len(evs))
	}
	return evs
}

// eventKeys names events by sandbox and type.
func eventKeys(evs []torpor.Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.SandboxID + " " + e.Type
	}
	return out
}

func wantEvents(t *testing.T, what string, got []torpor.Event, want ...string) {
	t.Helper()
	if g := eventKeys(got); !slices.Equal(g, want) {
		t.Errorf("%s: got events %q, want %q", what, g, want)
	}
}

// Events come in the order they were committed, whatever their sandbox or
// their Time.
func testEventOrder(t *testing.T, h *harness) {
	evs := writeEventLog(h)
	wantEvents(t, "every event", evs,
		"sb_a1 sandbox.created", "sb_g1 sandbox.created", "sb_a2 sandbox.created",
		"sb_a1 sandbox.paused", "sb_g1 sandbox.hibernated", "sb_a1 sandbox.resumed",
		"sb_a2 sandbox.terminated")

	// A later write with an earlier Time still comes last.
	sb := h.get("sb_g1")
	h.update(sb, event(sb, torpor.EventReconciled, at(-time.Hour), nil))
	all := h.events(torpor.EventFilter{})
	if last := all[len(all)-1]; last.Type != torpor.EventReconciled {
		t.Errorf("the newest write is listed as %s, not last", last.Type)
	}
}

func testEventsAfter(t *testing.T, h *harness) {
	evs := writeEventLog(h)
	got := h.events(torpor.EventFilter{After: evs[3].Seq})
	wantEvents(t, "after the 4th", got, eventKeys(evs[4:])...)
	wantEvents(t, "after the last", h.events(torpor.EventFilter{After: evs[6].Seq}))
	wantEvents(t, "after 0", h.events(torpor.EventFilter{After: 0}), eventKeys(evs)...)
}

func testEventsTenant(t *testing.T, h *harness) {
	evs := writeEventLog(h)
	wantEvents(t, "tenant globex", h.events(torpor.EventFilter{Tenant: "globex"}),
		"sb_g1 sandbox.created", "sb_g1 sandbox.hibernated")
	wantEvents(t, "tenant acme after the 4th", h.events(torpor.EventFilter{Tenant: "acme", After: evs[3].Seq}),
		"sb_a1 sandbox.resumed", "sb_a2 sandbox.terminated")
	wantEvents(t, "tenant nobody", h.events(torpor.EventFilter{Tenant: "nobody"}))
}

// ExceptTenant leaves out one tenant's events, and the cursor and the
// limit count only what is left (a page is never short because of them).
func testEventsExceptTenant(t *testing.T, h *harness) {
	evs := writeEventLog(h)
	wantEvents(t, "every tenant but globex", h.events(torpor.EventFilter{ExceptTenant: "globex"}),
		"sb_a1 sandbox.created", "sb_a2 sandbox.created", "sb_a1 sandbox.paused",
		"sb_a1 sandbox.resumed", "sb_a2 sandbox.terminated")
	wantEvents(t, "every tenant but globex, 2 after the 1st", h.events(torpor.EventFilter{ExceptTenant: "globex", After: evs[0].Seq, Limit: 2}),
		"sb_a2 sandbox.created", "sb_a1 sandbox.paused")
	wantEvents(t, "globex but not globex", h.events(torpor.EventFilter{Tenant: "globex", ExceptTenant: "globex"}))
}

func testEventsSandbox(t *testing.T, h *harness) {
	writeEventLog(h)
	wantEvents(t, "sandbox sb_a1", h.events(torpor.EventFilter{SandboxID: "sb_a1"}),
		"sb_a1 sandbox.created", "sb_a1 sandbox.paused", "sb_a1 sandbox.resumed")
	wantEvents(t, "sandbox sb_a1 of tenant globex", h.events(torpor.EventFilter{SandboxID: "sb_a1", Tenant: "globex"}))
	wantEvents(t, "unknown sandbox", h.events(torpor.EventFilter{SandboxID: "sb_nosuch"}))
}

// Limit caps a page; following the cursor page by page yields every event
// once, in order.
func testEventsLimit(t *testing.T, h *harness) {
	evs := writeEventLog(h)
	wantEvents(t, "limit 2", h.events(torpor.EventFilter{Limit: 2}), eventKeys(evs[:2])...)
	wantEvents(t, "limit 100", h.events(torpor.EventFilter{Limit: 100}), eventKeys(evs)...)

	var paged []torpor.Event
	var after int64
	for range len(evs) + 1 {
		page := h.events(torpor.EventFilter{After: after, Limit: 3})
		if len(page) > 3 {
			t.Fatalf("a page with Limit 3 has %d events", len(page))
		}
		if len(page) == 0 {
			break
		}
		paged = append(paged, page...)
		after = page[len(page)-1].Seq
	}
	wantEvents(t, "paged by 3", paged, eventKeys(evs)...)
	wantEvents(t, "acme, limit 1, after the first",
		h.events(torpor.EventFilter{Tenant: "acme", After: evs[0].Seq, Limit: 1}), "sb_a2 sandbox.created")
}

// Newest returns only the newest event that matches, whatever the limit,
// and nothing when none matches past the cursor.
func testEventsNewest(t *testing.T, h *harness) {
	evs := writeEventLog(h)
	newest := func(keep func(torpor.Event) bool) []string {
		for i := len(evs) - 1; i >= 0; i-- {
			if keep(evs[i]) {
				return eventKeys(evs[i : i+1])
			}
		}
		return nil
	}
	all := func(torpor.Event) bool { return true }
	wantEvents(t, "newest", h.events(torpor.EventFilter{Newest: true}), newest(all)...)
	wantEvents(t, "newest, limit 3", h.events(torpor.EventFilter{Newest: true, Limit: 3}), newest(all)...)
	wantEvents(t, "newest of globex", h.events(torpor.EventFilter{Newest: true, Tenant: "globex"}),
		newest(func(e torpor.Event) bool { return e.Tenant == "globex" })...)
	wantEvents(t, "newest but globex's", h.events(torpor.EventFilter{Newest: true, ExceptTenant: "globex"}),
		newest(func(e torpor.Event) bool { return e.Tenant != "globex" })...)
	wantEvents(t, "newest of sb_a1", h.events(torpor.EventFilter{Newest: true, SandboxID: "sb_a1"}),
		newest(func(e torpor.Event) bool { return e.SandboxID == "sb_a1" })...)
	wantEvents(t, "newest past the last", h.events(torpor.EventFilter{Newest: true, After: evs[len(evs)-1].Seq}))
	wantEvents(t, "newest of nobody", h.events(torpor.EventFilter{Newest: true, Tenant: "nobody"}))
}
