package storetest

import (
	"fmt"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

func sandboxTests() []test {
	return []test{
		{"CreateThenGetReturnsEveryField", testCreateGetEveryField},
		{"CreateStartsVersionAtOne", testCreateVersionOne},
		{"ZeroValuesRoundTrip", testZeroValues},
		{"NilAndEmptyMapsStayDistinct", testNilAndEmptyMaps},
		{"FailureExitCodeZeroIsKept", testExitCodeZero},
		{"TimesComeBackInUTCToTheMicrosecond", testTimePrecision},
		{"StoredRecordIsACopy", testNoAliasing},
		{"DuplicateIDIsConflict", testDuplicateSandbox},
		{"EmptyIDIsInvalid", testEmptyID},
		{"GetMissingIsNotFound", testGetMissing},
	}
}

// Every field, including those the API hides (Env, Handle, Version), comes
// back as it was written.
func testCreateGetEveryField(t *testing.T, h *harness) {
	sb := fullSandbox("sb_full", "acme")
	requireAllSet(t, sb)
	want := sb.Clone()
	want.Version = 1

	h.create(sb)
	checkSandbox(t, "GetSandbox after CreateSandbox", h.get(sb.ID), want)
}

// Whatever Version the caller passes, a new record is version 1, and the
// caller's struct says so.
func testCreateVersionOne(t *testing.T, h *harness) {
	for i, v := range []int64{0, 1, 7} {
		sb := newSandbox(torpor.NewID("sb_", 8), "acme", torpor.StateRunning, at(time.Duration(i)*time.Second))
		sb.Version = v
		h.create(sb)
		if sb.Version != 1 {
			t.Errorf("after CreateSandbox with Version %d: sb.Version = %d, want 1", v, sb.Version)
		}
		if got := h.get(sb.ID).Version; got != 1 {
			t.Errorf("created with Version %d: stored Version = %d, want 1", v, got)
		}
	}
}

// A sandbox with nothing but an id comes back with every other field zero:
// nil maps, slices and pointers, zero times.
func testZeroValues(t *testing.T, h *harness) {
	sb := &torpor.Sandbox{ID: "sb_zero"}
	h.create(sb)
	checkSandbox(t, "zero-valued sandbox", h.get(sb.ID), &torpor.Sandbox{ID: "sb_zero", Version: 1})
}

// nil and empty maps are different answers in the API (null vs {}); a
// store keeps them apart, on create and on update.
func testNilAndEmptyMaps(t *testing.T, h *harness) {
	nilMaps := newSandbox("sb_nil", "acme", torpor.StateRunning, at(0))
	empty := newSandbox("sb_empty", "acme", torpor.StateRunning, at(time.Second))
	empty.Metadata, empty.Env = map[string]string{}, map[string]string{}
	h.create(nilMaps)
	h.create(empty)

	check := func(when string, id string, wantNil bool) {
		t.Helper()
		got := h.get(id)
		if (got.Metadata == nil) != wantNil || len(got.Metadata) != 0 {
			t.Errorf("%s: %s Metadata = %s, want nil=%v and empty", when, id, showMap(got.Metadata), wantNil)
		}
		if (got.Env == nil) != wantNil || len(got.Env) != 0 {
			t.Errorf("%s: %s Env = %s, want nil=%v and empty", when, id, showMap(got.Env), wantNil)
		}
	}
	check("after create", "sb_nil", true)
	check("after create", "sb_empty", false)

	// Swap them with updates.
	nilMaps.Metadata, nilMaps.Env = map[string]string{}, map[string]string{}
	empty.Metadata, empty.Env = nil, nil
	h.update(nilMaps)
	h.update(empty)
	check("after update", "sb_nil", false)
	check("after update", "sb_empty", true)
}

func showMap(m map[string]string) string {
	if m == nil {
		return "nil"
	}
	return fmt.Sprintf("a map of %d entries", len(m))
}

// An exit status of 0 is an answer ("the entrypoint exited cleanly"), not
// the absence of one.
func testExitCodeZero(t *testing.T, h *harness) {
	zero := 0
	withZero := newSandbox("sb_exit0", "acme", torpor.StateFailed, at(0))
	withZero.Failure = &torpor.Failure{Code: torpor.FailureEntrypoint, Message: "entrypoint exited", ExitCode: &zero}
	without := newSandbox("sb_noexit", "acme", torpor.StateFailed, at(time.Second))
	without.Failure = &torpor.Failure{Code: torpor.FailureOOM, Message: "out of memory"}
	h.create(withZero)
	h.create(without)

	if f := h.get(withZero.ID).Failure; f == nil || f.ExitCode == nil || *f.ExitCode != 0 {
		t.Errorf("Failure with exit code 0 came back as %s", showFailure(f))
	}
	if f := h.get(without.ID).Failure; f == nil || f.ExitCode != nil {
		t.Errorf("Failure without exit code came back as %s", showFailure(f))
	}
}

func showFailure(f *torpor.Failure) string {
	switch {
	case f == nil:
		return "nil"
	case f.ExitCode == nil:
		return f.Code + " with no exit code"
	}
	return f.Code + " with an exit code"
}

// Times written in any zone and with nanoseconds come back in UTC, the
// same instant to the microsecond at least.
func testTimePrecision(t *testing.T, h *harness) {
	zone := time.FixedZone("UTC+5:30", 5*3600+30*60)
	in := time.Date(2024, time.February, 29, 23, 59, 59, 123456789, zone)
	sb := newSandbox("sb_times", "acme", torpor.StateTerminated, in)
	sb.StateSince = in.Add(time.Nanosecond)
	sb.LastActivityAt = in.Add(999 * time.Nanosecond)
	term := in.Add(time.Hour)
	sb.TerminatedAt = &term
	h.create(sb)
	got := h.get(sb.ID)

	for _, c := range []struct {
		name      string
		got, want time.Time
	}{
		{"CreatedAt", got.CreatedAt, sb.CreatedAt},
		{"StateSince", got.StateSince, sb.StateSince},
		{"LastActivityAt", got.LastActivityAt, sb.LastActivityAt},
		{"TerminatedAt", deref(got.TerminatedAt), term},
	} {
		checkNear(t, c.name, c.got, c.want)
	}
}

// checkNear fails the test unless got is in UTC and within a microsecond
// of want.
func checkNear(t *testing.T, what string, got, want time.Time) {
	t.Helper()
	if got.Location() != time.UTC {
		t.Errorf("%s: came back in %s, want UTC", what, got.Location())
	}
	if d := got.Sub(want).Abs(); d >= time.Microsecond {
		t.Errorf("%s: got %s, want %s (off by %s; a microsecond must be kept)",
			what, got.Format(time.RFC3339Nano), want.UTC().Format(time.RFC3339Nano), d)
	}
}

func deref(p *time.Time) time.Time {
	if p == nil {
		return time.Time{}
	}
	return *p
}

// Changing the caller's struct after a write, or a returned record after a
// read, changes nothing stored.
func testNoAliasing(t *testing.T, h *harness) {
	sb := fullSandbox("sb_copy", "acme")
	// A second fixture, not sb.Clone(): the test must share nothing with sb.
	want := fullSandbox("sb_copy", "acme")
	want.Version = 1
	h.create(sb)

	sb.Metadata["owner"] = "mallory"
	sb.Env["API_TOKEN"] = "stolen"
	sb.Runtime.Setup[0] = "rm -rf /"
	*sb.Failure.ExitCode = 0
	got := h.get(sb.ID)
	checkSandbox(t, "record after changing the caller's struct", got, want)

	got.Metadata["owner"] = "eve"
	got.PauseModes[0] = "none"
	checkSandbox(t, "record after changing a returned copy", h.get(sb.ID), want)
}

// Creating an id that exists is a conflict; the stored record and its
// events stay as they were, and the refused create appends no event.
func testDuplicateSandbox(t *testing.T, h *harness) {
	first := newSandbox("sb_dup", "acme", torpor.StateRunning, at(0))
	h.create(first, event(first, torpor.EventCreated, at(0), nil))
	want := h.get(first.ID)

	second := newSandbox("sb_dup", "other", torpor.StatePaused, at(time.Hour))
	err := h.s.CreateSandbox(t.Context(), second, event(second, torpor.EventCreated, at(time.Hour), nil))
	wantCode(t, err, torpor.EConflict, "CreateSandbox with an existing id")
	if second.Version != 0 {
		t.Errorf("refused create set sb.Version to %d, want it left at 0", second.Version)
	}
	checkSandbox(t, "record after a refused duplicate create", h.get(first.ID), want)
	if evs := h.events(torpor.EventFilter{}); len(evs) != 1 || evs[0].Tenant != "acme" {
		t.Errorf("events after a refused duplicate create: %+v, want only the first create's", evs)
	}
}

// A sandbox without an id is bad input, not an internal error.
func testEmptyID(t *testing.T, h *harness) {
	err := h.s.CreateSandbox(t.Context(), newSandbox("", "acme", torpor.StateRunning, at(0)))
	wantCode(t, err, torpor.EInvalid, "CreateSandbox with an empty id")
}

func testGetMissing(t *testing.T, h *harness) {
	_, err := h.s.GetSandbox(t.Context(), "sb_nosuch")
	wantCode(t, err, torpor.ENotFound, "GetSandbox of an unknown id")
}
