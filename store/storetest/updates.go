package storetest

import (
	"slices"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

func updateTests() []test {
	return []test{
		{"UpdateReplacesRecordAndIncrementsVersion", testUpdateReplaces},
		{"StaleVersionIsConflictAndChangesNothing", testStaleVersion},
		{"FailedUpdateAppendsNoEvent", testFailedUpdateNoEvent},
		{"UpdateOfMissingSandboxIsNotFound", testUpdateMissing},
		{"EventsGetIncreasingSeqInTheOrderGiven", testUpdateEvents},
	}
}

// An update replaces every field and moves the version on by one, in the
// store and in the caller's struct.
func testUpdateReplaces(t *testing.T, h *harness) {
	sb := newSandbox("sb_upd", "acme", torpor.StateRunning, at(0))
	sb.Metadata = map[string]string{"team": "ml"}
	h.create(sb)

	next := fullSandbox("sb_upd", "acme")
	next.Version = sb.Version
	want := next.Clone()
	want.Version = 2
	h.update(next)
	if next.Version != 2 {
		t.Errorf("after the first update sb.Version = %d, want 2", next.Version)
	}
	checkSandbox(t, "record after an update", h.get(sb.ID), want)

	next.State = torpor.StateRunning
	next.Failure, next.TerminatedAt = nil, nil
	next.Boots++
	want = next.Clone()
	want.Version = 3
	h.update(next)
	if next.Version != 3 {
		t.Errorf("after the second update sb.Version = %d, want 3", next.Version)
	}
	checkSandbox(t, "record after a second update", h.get(sb.ID), want)
}

// Of two writers that read the same version, the second is refused: its
// change is not stored and its struct keeps its version.
func testStaleVersion(t *testing.T, h *harness) {
	sb := newSandbox("sb_stale", "acme", torpor.StateRunning, at(0))
	h.create(sb)
	a, b := h.get(sb.ID), h.get(sb.ID)

	a.State = torpor.StatePaused
	a.PauseMode = torpor.PauseFreeze
	h.update(a)
	want := h.get(sb.ID)

	b.State = torpor.StateHibernated
	b.Handle = "lost"
	err := h.s.UpdateSandbox(t.Context(), b)
	wantCode(t, err, torpor.EConflict, "UpdateSandbox with a stale Version")
	if b.Version != 1 {
		t.Errorf("refused update changed sb.Version to %d, want it left at 1", b.Version)
	}
	checkSandbox(t, "record after a refused update", h.get(sb.ID), want)

	// A version from the future is as stale as one from the past.
	b.Version = 10
	wantCode(t, h.s.UpdateSandbox(t.Context(), b), torpor.EConflict, "UpdateSandbox with a Version ahead of the store")
	checkSandbox(t, "record after a refused update", h.get(sb.ID), want)
}

// The events of a refused update are not appended.
func testFailedUpdateNoEvent(t *testing.T, h *harness) {
	sb := newSandbox("sb_noev", "acme", torpor.StateRunning, at(0))
	h.create(sb, event(sb, torpor.EventCreated, at(0), nil))
	stale := sb.Clone()
	sb.State = torpor.StatePaused
	h.update(sb, event(sb, torpor.EventPaused, at(time.Second), nil))
	before := h.events(torpor.EventFilter{})

	stale.State = torpor.StateTerminated
	err := h.s.UpdateSandbox(t.Context(), stale,
		event(stale, torpor.EventStateChange, at(2*time.Second), nil),
		event(stale, torpor.EventTerminated, at(2*time.Second), nil))
	wantCode(t, err, torpor.EConflict, "UpdateSandbox with a stale Version")

	missing := newSandbox("sb_ghost", "acme", torpor.StateRunning, at(0))
	missing.Version = 1
	err = h.s.UpdateSandbox(t.Context(), missing, event(missing, torpor.EventStateChange, at(3*time.Second), nil))
	wantCode(t, err, torpor.ENotFound, "UpdateSandbox of an unknown id")

	after := h.events(torpor.EventFilter{})
	if !slices.Equal(types(after), types(before)) {
		t.Errorf("events after refused updates: %q, want %q", types(after), types(before))
	}
}

// Updating a sandbox that was never created is not_found, not a conflict:
// the caller must not retry it.
func testUpdateMissing(t *testing.T, h *harness) {
	sb := newSandbox("sb_ghost", "acme", torpor.StateRunning, at(0))
	sb.Version = 1
	wantCode(t, h.s.UpdateSandbox(t.Context(), sb), torpor.ENotFound, "UpdateSandbox of an unknown id")
	if sb.Version != 1 {
		t.Errorf("refused update changed sb.Version to %d, want 1", sb.Version)
	}
	_, err := h.s.GetSandbox(t.Context(), sb.ID)
	wantCode(t, err, torpor.ENotFound, "GetSandbox after a refused update")
}

// Events written with a create and with updates are stored in the order
// given, each with a larger Seq than the one before.
func testUpdateEvents(t *testing.T, h *harness) {
	sb := newSandbox("sb_events", "acme", torpor.StateStarting, at(0))
	h.create(sb, event(sb, torpor.EventCreated, at(0), nil))
	sb.State = torpor.StateRunning
	h.update(sb,
		event(sb, torpor.EventStateChange, at(time.Second), map[string]string{"from": "starting", "to": "running"}),
		event(sb, torpor.EventStarted, at(time.Second), nil))
	sb.State = torpor.StatePaused
	h.update(sb, event(sb, torpor.EventPaused, at(2*time.Second), map[string]string{"mode": "freeze"}))

	evs := h.events(torpor.EventFilter{SandboxID: sb.ID})
	want := []string{torpor.EventCreated, torpor.EventStateChange, torpor.EventStarted, torpor.EventPaused}
	if !slices.Equal(types(evs), want) {
		t.Fatalf("events: %q, want %q", types(evs), want)
	}
	checkIncreasing(t, evs)
}

// checkIncreasing fails the test unless every Seq is positive and larger
// than the one before.
func checkIncreasing(t *testing.T, evs []torpor.Event) {
	t.Helper()
	for i, e := range evs {
		if e.Seq <= 0 {
			t.Errorf("event %d (%s) has Seq %d, want > 0", i, e.Type, e.Seq)
		}
		if i > 0 && e.Seq <= evs[i-1].Seq {
			t.Errorf("event %d (%s) has Seq %d, not after the previous %d", i, e.Type, e.Seq, evs[i-1].Seq)
		}
	}
}
