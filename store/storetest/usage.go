package storetest

import (
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

func usageTests() []test {
	return []test{
		{"RowsRoundTrip", testUsageRoundTrip},
		{"RowsOnlyWithTheirUpdate", testUsageWithStaleUpdate},
		{"NoSecondRowFromTheSameStart", testUsageOnce},
		{"FilterByTenantSandboxAndWindow", testUsageFilter},
		{"MarkSeenKeepsTheLatestAndTheVersion", testMarkSeen},
	}
}

// row returns a ledger row of sb in kind from a to b (offsets from base).
func row(sb *torpor.Sandbox, kind torpor.UsageKind, a, b time.Duration) torpor.UsageRecord {
	return torpor.UsageRecord{SandboxID: sb.ID, Tenant: sb.Tenant, Kind: kind, Start: at(a), End: at(b),
		Seconds: (b - a).Seconds(), VCPUSeconds: 1.5, MemoryGiBSeconds: 2.5, DiskGiBSeconds: 3.5,
		SnapshotGiBSeconds: 0.25, Cost: 0.000125}
}

func (h *harness) usage(f torpor.UsageFilter) []torpor.UsageRecord {
	h.t.Helper()
	rows, err := h.s.ListUsage(h.t.Context(), f)
	if err != nil {
		h.t.Fatalf("ListUsage(%+v): %v", f, err)
	}
	return rows
}

func testUsageRoundTrip(t *testing.T, h *harness) {
	sb := newSandbox("sb_u", "acme", torpor.StateRunning, at(0))
	h.create(sb)
	want := []torpor.UsageRecord{row(sb, torpor.UsageRunning, 0, time.Minute), row(sb, torpor.UsageFrozen, time.Minute, time.Hour)}
	sb.State = torpor.StatePaused
	if err := h.s.UpdateSandboxUsage(t.Context(), sb, want, event(sb, torpor.EventPaused, at(time.Hour), nil)); err != nil {
		t.Fatal(err)
	}
	h.restart()
	got := h.usage(torpor.UsageFilter{})
	if len(got) != 2 {
		t.Fatalf("ListUsage returned %d rows, want 2", len(got))
	}
	for i := range want {
		want[i].Seq = got[i].Seq
		checkSame(t, "usage row", got[i], want[i])
	}
	if got[0].Seq >= got[1].Seq {
		t.Errorf("rows out of ledger order: seq %d then %d", got[0].Seq, got[1].Seq)
	}
	if len(h.events(torpor.EventFilter{})) != 1 {
		t.Error("the event written with the rows is missing")
	}
}

// A stale update writes neither its record nor its rows: the frontier and
// the rows move together.
func testUsageWithStaleUpdate(t *testing.T, h *harness) {
	sb := newSandbox("sb_u", "acme", torpor.StateRunning, at(0))
	h.create(sb)
	stale := sb.Clone()
	h.update(sb)
	err := h.s.UpdateSandboxUsage(t.Context(), stale, []torpor.UsageRecord{row(sb, torpor.UsageRunning, 0, time.Minute)})
	if !torpor.IsCode(err, torpor.EConflict) {
		t.Fatalf("stale UpdateSandboxUsage: %v, want a conflict", err)
	}
	if rows := h.usage(torpor.UsageFilter{}); len(rows) != 0 {
		t.Errorf("a refused update left %d usage rows", len(rows))
	}
}

// Two rows of one sandbox from the same instant would bill that time
// twice: the second is refused, with the record update it came with.
func testUsageOnce(t *testing.T, h *harness) {
	sb := newSandbox("sb_u", "acme", torpor.StateRunning, at(0))
	h.create(sb)
	if err := h.s.UpdateSandboxUsage(t.Context(), sb, []torpor.UsageRecord{row(sb, torpor.UsageRunning, 0, time.Minute)}); err != nil {
		t.Fatal(err)
	}
	version := sb.Version
	sb.State = torpor.StatePaused
	err := h.s.UpdateSandboxUsage(t.Context(), sb, []torpor.UsageRecord{row(sb, torpor.UsageRunning, 0, 2*time.Minute)})
	if !torpor.IsCode(err, torpor.EConflict) {
		t.Fatalf("a second row from the same start: %v, want a conflict", err)
	}
	if got := h.get(sb.ID); got.Version != version || got.State != torpor.StateRunning {
		t.Errorf("the refused update changed the record: version %d state %s", got.Version, got.State)
	}
	if rows := h.usage(torpor.UsageFilter{}); len(rows) != 1 {
		t.Errorf("%d rows, want 1", len(rows))
	}
	if err := h.s.UpdateSandboxUsage(t.Context(), sb, []torpor.UsageRecord{{SandboxID: sb.ID, Tenant: sb.Tenant,
		Kind: torpor.UsageRunning, Start: at(time.Hour), End: at(time.Hour)}}); !torpor.IsCode(err, torpor.EInvalid) {
		t.Errorf("an empty row: %v, want invalid_argument", err)
	}
}

func testUsageFilter(t *testing.T, h *harness) {
	a := newSandbox("sb_a", "acme", torpor.StateRunning, at(0))
	b := newSandbox("sb_b", "globex", torpor.StateRunning, at(0))
	h.create(a)
	h.create(b)
	for _, step := range []struct {
		sb   *torpor.Sandbox
		from time.Duration
	}{{a, 0}, {b, 0}, {a, time.Hour}, {b, time.Hour}, {a, 2 * time.Hour}} {
		if err := h.s.UpdateSandboxUsage(t.Context(), step.sb, []torpor.UsageRecord{
			row(step.sb, torpor.UsageRunning, step.from, step.from+time.Hour)}); err != nil {
			t.Fatal(err)
		}
	}
	count := func(f torpor.UsageFilter) int { return len(h.usage(f)) }
	cases := []struct {
		name string
		f    torpor.UsageFilter
		want int
	}{
		{"all", torpor.UsageFilter{}, 5},
		{"tenant", torpor.UsageFilter{Tenant: "acme"}, 3},
		{"sandbox", torpor.UsageFilter{SandboxID: "sb_b"}, 2},
		{"window overlapping two hours", torpor.UsageFilter{From: at(90 * time.Minute), To: at(150 * time.Minute)}, 3},
		{"window ending where rows start", torpor.UsageFilter{To: at(time.Hour)}, 2},
		{"window starting where rows end", torpor.UsageFilter{From: at(2 * time.Hour)}, 1},
		{"limit", torpor.UsageFilter{Limit: 2}, 2},
	}
	for _, c := range cases {
		if got := count(c.f); got != c.want {
			t.Errorf("%s: %d rows, want %d", c.name, got, c.want)
		}
	}
	first := h.usage(torpor.UsageFilter{Limit: 2})
	if rest := h.usage(torpor.UsageFilter{After: first[1].Seq}); len(rest) != 3 {
		t.Errorf("after the cursor: %d rows, want 3", len(rest))
	}
}

func testMarkSeen(t *testing.T, h *harness) {
	sb := newSandbox("sb_s", "acme", torpor.StateRunning, at(0))
	sb.Usage.SeenAt = at(time.Second)
	h.create(sb)
	if err := h.s.MarkSeen(t.Context(), at(time.Minute), sb.ID, "sb_missing"); err != nil {
		t.Fatal(err)
	}
	if err := h.s.MarkSeen(t.Context(), at(30*time.Second), sb.ID); err != nil {
		t.Fatal(err)
	}
	got := h.get(sb.ID)
	if !got.Usage.SeenAt.Equal(at(time.Minute)) {
		t.Errorf("SeenAt = %s, want the latest mark %s", got.Usage.SeenAt, at(time.Minute))
	}
	if got.Version != 1 {
		t.Errorf("MarkSeen changed the version to %d", got.Version)
	}
	// An update with an older SeenAt does not move it back.
	got.State = torpor.StatePaused
	h.update(got)
	h.restart()
	if again := h.get(sb.ID); !again.Usage.SeenAt.Equal(at(time.Minute)) {
		t.Errorf("after an update and a restart SeenAt = %s, want %s", again.Usage.SeenAt, at(time.Minute))
	}
}
