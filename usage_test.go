package torpor

import (
	"math"
	"testing"
	"time"
)

func TestUsageKindOf(t *testing.T) {
	cases := []struct {
		state State
		mode  PauseMode
		prev  UsageKind
		want  UsageKind
	}{
		{StateStarting, "", UsageNone, UsageRunning}, // a new sandbox runs from its creation
		{StateStarting, "", UsageHibernated, UsageHibernated},
		{StateRunning, "", UsageHibernated, UsageRunning},
		{StatePausing, PauseFreeze, UsageRunning, UsageRunning}, // running until frozen
		{StatePaused, PauseFreeze, UsageRunning, UsageFrozen},
		{StatePaused, PauseSnapshot, UsageRunning, UsageSnapshotPaused},
		{StateResuming, PauseSnapshot, UsageSnapshotPaused, UsageSnapshotPaused}, // paused until it runs
		{StateHibernating, "", UsageFrozen, UsageFrozen},
		{StateHibernated, "", UsageFrozen, UsageHibernated},
		{StateFailed, "", UsageRunning, UsageHibernated}, // a failed sandbox keeps its disk
		{StateRestarting, "", UsageRunning, UsageRunning},
		{StateTerminating, "", UsageFrozen, UsageFrozen},
		{StateTerminated, "", UsageFrozen, UsageNone},
	}
	for _, c := range cases {
		if got := UsageKindOf(c.state, c.mode, c.prev); got != c.want {
			t.Errorf("UsageKindOf(%s, %q, %q) = %q, want %q", c.state, c.mode, c.prev, got, c.want)
		}
	}
}

// The rule of each kind: what is charged while a sandbox is in it.
func TestChargeRules(t *testing.T) {
	p := Pricing{VCPUSecond: 1, MemoryGiBSecond: 1000, DiskGiBMonth: SecondsPerMonth * 1e6, SnapshotGiBMonth: SecondsPerMonth * 1e9}
	sb := &Sandbox{ID: "sb", Tenant: "acme", Resources: Resources{VCPUs: 2, MemoryMiB: 1024, DiskMiB: 2048},
		Snapshot: &SnapshotInfo{SizeBytes: 1 << 29}}
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	cases := []struct {
		kind UsageKind
		want float64 // per second: cpu 2, memory 1000, disk 2e6, snapshot 0.5e9
	}{
		{UsageRunning, 2 + 1000 + 2e6},
		{UsageFrozen, 1000 + 2e6},
		{UsageSnapshotPaused, 2e6 + 0.5e9},
		{UsageHibernated, 2e6},
	}
	for _, c := range cases {
		r := p.Charge(sb, c.kind, t0, t0.Add(10*time.Second))
		if math.Abs(r.Cost-10*c.want) > 1e-6*c.want {
			t.Errorf("%s: cost %f, want %f", c.kind, r.Cost, 10*c.want)
		}
		if r.Seconds != 10 || r.Kind != c.kind || r.SandboxID != "sb" || r.Tenant != "acme" {
			t.Errorf("%s: row %+v", c.kind, r)
		}
	}
	if err := (Pricing{VCPUSecond: -1}).Validate(); !IsCode(err, EInvalid) {
		t.Errorf("a negative price: %v", err)
	}
}

func TestSummarizeUsageSplitsDaysAndClips(t *testing.T) {
	day := time.Date(2026, 3, 1, 0, 0, 0, 0, time.UTC)
	sb := &Sandbox{ID: "a", Tenant: "acme", Resources: Resources{VCPUs: 1, MemoryMiB: 1024}}
	p := Pricing{VCPUSecond: 1}
	rows := []UsageRecord{
		p.Charge(sb, UsageRunning, day.Add(22*time.Hour), day.Add(26*time.Hour)), // across midnight
		p.Charge(&Sandbox{ID: "b", Tenant: "acme"}, UsageHibernated, day, day.Add(time.Hour)),
	}
	groups, total, err := SummarizeUsage(rows, GroupByDay)
	if err != nil {
		t.Fatal(err)
	}
	if len(groups) != 2 || groups[0].Key != "2026-03-01" || groups[0].RunningS != 7200 || groups[0].HibernatedS != 3600 ||
		groups[1].Key != "2026-03-02" || groups[1].RunningS != 7200 || groups[1].Cost != 7200 {
		t.Fatalf("by day: %+v", groups)
	}
	if total.RunningS != 14400 || total.Cost != 14400 || total.Rows != 2 || total.BilledS != 14400 {
		t.Errorf("total %+v", total)
	}
	bySandbox, _, _ := SummarizeUsage(rows, GroupBySandbox)
	if len(bySandbox) != 2 || bySandbox[0].Key != "a" || bySandbox[1].Key != "b" {
		t.Errorf("by sandbox: %+v", bySandbox)
	}
	if _, _, err := SummarizeUsage(rows, "week"); !IsCode(err, EInvalid) {
		t.Errorf("group_by week: %v", err)
	}
	c, ok := rows[0].Clip(day.Add(23*time.Hour), day.Add(24*time.Hour))
	if !ok || c.Seconds != 3600 || c.Cost != 3600 || c.VCPUSeconds != 3600 {
		t.Errorf("clip: %+v", c)
	}
	if _, ok := rows[0].Clip(day, day.Add(22*time.Hour)); ok {
		t.Error("a window that ends where the row starts holds part of it")
	}
}
