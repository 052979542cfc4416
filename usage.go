package torpor

import (
	"fmt"
	"sort"
	"time"
)

// UsageKind is what a sandbox holds during a stretch of its life, and so
// what it is charged for (docs/billing.md).
type UsageKind string

const (
	// UsageRunning: processes run; CPU, memory and disk are held.
	UsageRunning UsageKind = "running"
	// UsageFrozen: paused by freeze; memory and disk are still held.
	UsageFrozen UsageKind = "frozen"
	// UsageSnapshotPaused: paused to disk; the disk and the snapshot are
	// held, no CPU and no memory.
	UsageSnapshotPaused UsageKind = "snapshot_paused"
	// UsageHibernated: no processes; only the disk is held. A failed
	// sandbox keeps its disk and is metered the same way.
	UsageHibernated UsageKind = "hibernated"
	// UsageArchived: the disk is packed in its compressed archive in an
	// object store (docs/archive.md); only the archive's bytes are held,
	// charged at the archive price.
	UsageArchived UsageKind = "archived"
	// UsageNone: terminated; nothing is held and nothing is charged.
	UsageNone UsageKind = ""
)

// UsageKinds lists the kinds that are metered.
var UsageKinds = []UsageKind{UsageRunning, UsageFrozen, UsageSnapshotPaused, UsageHibernated, UsageArchived}

// Resident reports whether a sandbox holds memory in this kind.
func (k UsageKind) Resident() bool { return k == UsageRunning || k == UsageFrozen }

// UsageKindOf says what a sandbox in state s (paused with mode) is
// metered as, given the kind it was metered as until now (prev). The kind
// changes only where a transition lands (running, paused, hibernated,
// failed, terminated); the in-between states of a verb go on as before
// (a pausing sandbox runs until it is frozen, a resuming one stays paused
// until it runs), except that a new sandbox is running from its creation.
func UsageKindOf(s State, mode PauseMode, prev UsageKind) UsageKind {
	switch s {
	case StateRunning:
		return UsageRunning
	case StatePaused:
		if mode == PauseSnapshot {
			return UsageSnapshotPaused
		}
		return UsageFrozen
	case StateHibernated, StateFailed:
		return UsageHibernated
	case StateArchived:
		return UsageArchived
	case StateTerminated:
		return UsageNone
	}
	if prev == UsageNone {
		return UsageRunning
	}
	return prev
}

// UsageState is a sandbox's open metering interval: Kind since Since.
// Every second before Since is in the usage ledger already; the engine
// moves Since forward only in the same store transaction that writes the
// rows for the seconds it passes over.
type UsageState struct {
	Kind  UsageKind
	Since time.Time
	// SeenAt is the last time the sandbox's instance was known to be
	// alive. An interval of a resident kind whose instance turns out dead
	// after a daemon restart closes here, not at the restart.
	SeenAt time.Time
}

// UsageSeconds count the seconds spent in each usage kind.
type UsageSeconds struct {
	RunningS        float64 `json:"running_s"`
	FrozenS         float64 `json:"frozen_s"`
	SnapshotPausedS float64 `json:"snapshot_paused_s"`
	HibernatedS     float64 `json:"hibernated_s"`
	ArchivedS       float64 `json:"archived_s"`
	// ResidentS counts the seconds the sandbox held memory (running or
	// frozen); BilledS the seconds it was charged for compute (CPU or
	// memory), which for a container or VM is the same.
	ResidentS float64 `json:"resident_s"`
	BilledS   float64 `json:"billed_s"`
}

// add counts the seconds of a usage row.
func (u *UsageSeconds) add(r UsageRecord) {
	switch r.Kind {
	case UsageRunning:
		u.RunningS += r.Seconds
	case UsageFrozen:
		u.FrozenS += r.Seconds
	case UsageSnapshotPaused:
		u.SnapshotPausedS += r.Seconds
	case UsageHibernated:
		u.HibernatedS += r.Seconds
	case UsageArchived:
		u.ArchivedS += r.Seconds
	}
	if r.Kind.Resident() {
		u.ResidentS += r.Seconds
	}
	if r.VCPUSeconds > 0 || r.MemoryGiBSeconds > 0 {
		u.BilledS += r.Seconds
	}
}

// Meters are a sandbox's totals: seconds in each kind, what was charged,
// and counts of its transitions. Seconds and cost cover the settled
// ledger rows; the API adds the open interval when it shows them.
type Meters struct {
	UsageSeconds
	Cost float64 `json:"cost"`

	Pauses         int64 `json:"pauses"`
	AutoPaused     int64 `json:"auto_paused"`
	Resumes        int64 `json:"resumes"`
	AutoResumed    int64 `json:"auto_resumed"`
	Hibernations   int64 `json:"hibernations"`
	AutoHibernated int64 `json:"auto_hibernated"`
}

// Add counts a usage row into the meters.
func (m *Meters) Add(r UsageRecord) {
	m.add(r)
	m.Cost += r.Cost
}

func (m Meters) String() string {
	return fmt.Sprintf("running %.0fs, frozen %.0fs, snapshot-paused %.0fs, hibernated %.0fs, archived %.0fs; cost %.6f; pauses %d (auto %d), resumes %d (auto %d), hibernations %d (auto %d)",
		m.RunningS, m.FrozenS, m.SnapshotPausedS, m.HibernatedS, m.ArchivedS, m.Cost,
		m.Pauses, m.AutoPaused, m.Resumes, m.AutoResumed, m.Hibernations, m.AutoHibernated)
}

// UsageRecord is one row of the usage ledger: what a sandbox held from
// Start to End, and what it cost. The rows of a sandbox never overlap and
// leave no gap between its creation and its termination.
type UsageRecord struct {
	// Seq is the row's place in the ledger, assigned by the store.
	Seq       int64     `json:"seq"`
	SandboxID string    `json:"sandbox_id"`
	Tenant    string    `json:"tenant"`
	Kind      UsageKind `json:"kind"`
	Start     time.Time `json:"start"`
	End       time.Time `json:"end"`
	Seconds   float64   `json:"seconds"`
	// The charged quantities: what the rule of Kind charges, times the
	// seconds (docs/billing.md).
	VCPUSeconds        float64 `json:"vcpu_s"`
	MemoryGiBSeconds   float64 `json:"memory_gib_s"`
	DiskGiBSeconds     float64 `json:"disk_gib_s"`
	SnapshotGiBSeconds float64 `json:"snapshot_gib_s"`
	Cost               float64 `json:"cost"`
	// Open marks an interval that is still running when the ledger is
	// read: provisional, not yet a ledger row.
	Open bool `json:"open,omitempty"`
}

// Pricing is what each held resource costs, in the operator's currency.
type Pricing struct {
	Currency         string  `json:"currency"`
	VCPUSecond       float64 `json:"vcpu_second"`
	MemoryGiBSecond  float64 `json:"memory_gib_second"`
	DiskGiBMonth     float64 `json:"disk_gib_month"`
	SnapshotGiBMonth float64 `json:"snapshot_gib_month"`
	// ArchiveGiBMonth prices an archived sandbox's archive (its
	// compressed bytes, docs/archive.md).
	ArchiveGiBMonth float64 `json:"archive_gib_month"`
}

// SecondsPerMonth is the month of the per-GiB-month prices: 30 days.
const SecondsPerMonth = 30 * 24 * 3600

// DefaultPricing is a server's pricing when its configuration sets none:
// figures of the order of public cloud list prices.
var DefaultPricing = Pricing{
	Currency:         "USD",
	VCPUSecond:       0.000014,
	MemoryGiBSecond:  0.0000045,
	DiskGiBMonth:     0.08,
	SnapshotGiBMonth: 0.05,
	ArchiveGiBMonth:  0.02,
}

// Validate refuses negative prices.
func (p Pricing) Validate() error {
	for name, v := range map[string]float64{
		"pricing.vcpu_second": p.VCPUSecond, "pricing.memory_gib_second": p.MemoryGiBSecond,
		"pricing.disk_gib_month": p.DiskGiBMonth, "pricing.snapshot_gib_month": p.SnapshotGiBMonth,
		"pricing.archive_gib_month": p.ArchiveGiBMonth,
	} {
		if v < 0 {
			return Invalid(name, "a price must not be negative")
		}
	}
	return nil
}

// Charge returns the ledger row for sb holding kind from start to end:
//   - running: vCPUs, memory and disk;
//   - frozen: memory and disk (the memory is still held);
//   - snapshot_paused: disk and the snapshot's size;
//   - hibernated (and failed): disk;
//   - archived: the archive's compressed bytes, as DiskGiBSeconds of the
//     row (its kind says which disk), at ArchiveGiBMonth.
func (p Pricing) Charge(sb *Sandbox, kind UsageKind, start, end time.Time) UsageRecord {
	secs := end.Sub(start).Seconds()
	r := UsageRecord{SandboxID: sb.ID, Tenant: sb.Tenant, Kind: kind, Start: start, End: end, Seconds: secs}
	const mib = 1.0 / 1024
	mem := float64(sb.Resources.MemoryMiB) * mib
	disk := float64(sb.Resources.DiskMiB) * mib
	switch kind {
	case UsageRunning:
		r.VCPUSeconds = sb.Resources.VCPUs * secs
		r.MemoryGiBSeconds = mem * secs
		r.DiskGiBSeconds = disk * secs
	case UsageFrozen:
		r.MemoryGiBSeconds = mem * secs
		r.DiskGiBSeconds = disk * secs
	case UsageSnapshotPaused:
		r.DiskGiBSeconds = disk * secs
		if sb.Snapshot != nil {
			r.SnapshotGiBSeconds = float64(sb.Snapshot.SizeBytes) / (1 << 30) * secs
		}
	case UsageHibernated:
		r.DiskGiBSeconds = disk * secs
	case UsageArchived:
		if sb.Archive != nil {
			r.DiskGiBSeconds = float64(sb.Archive.Bytes) / (1 << 30) * secs
		}
		r.Cost = r.DiskGiBSeconds * p.ArchiveGiBMonth / SecondsPerMonth
		return r
	}
	r.Cost = r.VCPUSeconds*p.VCPUSecond + r.MemoryGiBSeconds*p.MemoryGiBSecond +
		(r.DiskGiBSeconds*p.DiskGiBMonth+r.SnapshotGiBSeconds*p.SnapshotGiBMonth)/SecondsPerMonth
	return r
}

// UsageFilter selects ledger rows: those of Tenant (every tenant when
// empty) and SandboxID (every sandbox when empty) that overlap [From, To)
// (unbounded where zero), after the cursor After, oldest first.
type UsageFilter struct {
	Tenant    string
	SandboxID string
	From, To  time.Time
	After     int64
	Limit     int
}

// Clip returns the part of r inside [from, to) (unbounded where zero), its
// quantities and cost scaled to the part's length, and false when nothing
// of r is inside.
func (r UsageRecord) Clip(from, to time.Time) (UsageRecord, bool) {
	start, end := r.Start, r.End
	if !from.IsZero() && from.After(start) {
		start = from
	}
	if !to.IsZero() && to.Before(end) {
		end = to
	}
	if !end.After(start) {
		return UsageRecord{}, false
	}
	if start.Equal(r.Start) && end.Equal(r.End) {
		return r, true
	}
	f := end.Sub(start).Seconds() / r.End.Sub(r.Start).Seconds()
	c := r
	c.Start, c.End, c.Seconds = start, end, end.Sub(start).Seconds()
	c.VCPUSeconds *= f
	c.MemoryGiBSeconds *= f
	c.DiskGiBSeconds *= f
	c.SnapshotGiBSeconds *= f
	c.Cost *= f
	return c, true
}

// Ways to group usage.
const (
	GroupBySandbox = "sandbox"
	GroupByDay     = "day"
	GroupByTenant  = "tenant"
)

// UsageTotals add up usage rows.
type UsageTotals struct {
	// Key names the group: a sandbox id, a day (2006-01-02, UTC) or a
	// tenant; empty for the grand total.
	Key string `json:"key,omitempty"`
	UsageSeconds
	VCPUSeconds        float64 `json:"vcpu_s"`
	MemoryGiBSeconds   float64 `json:"memory_gib_s"`
	DiskGiBSeconds     float64 `json:"disk_gib_s"`
	SnapshotGiBSeconds float64 `json:"snapshot_gib_s"`
	Cost               float64 `json:"cost"`
	Rows               int     `json:"rows"`
}

// Add counts r into t.
func (t *UsageTotals) Add(r UsageRecord) {
	t.add(r)
	t.VCPUSeconds += r.VCPUSeconds
	t.MemoryGiBSeconds += r.MemoryGiBSeconds
	t.DiskGiBSeconds += r.DiskGiBSeconds
	t.SnapshotGiBSeconds += r.SnapshotGiBSeconds
	t.Cost += r.Cost
	t.Rows++
}

// SummarizeUsage totals rows by groupBy (GroupBySandbox, GroupByDay,
// GroupByTenant; "" for no groups), groups sorted by key, and overall. A
// row that spans midnight is split between its days.
func SummarizeUsage(rows []UsageRecord, groupBy string) (groups []UsageTotals, total UsageTotals, err error) {
	byKey := map[string]*UsageTotals{}
	add := func(key string, r UsageRecord) {
		g := byKey[key]
		if g == nil {
			g = &UsageTotals{Key: key}
			byKey[key] = g
		}
		g.Add(r)
	}
	for _, r := range rows {
		total.Add(r)
		switch groupBy {
		case "":
		case GroupBySandbox:
			add(r.SandboxID, r)
		case GroupByTenant:
			add(r.Tenant, r)
		case GroupByDay:
			for day := r.Start.UTC().Truncate(24 * time.Hour); day.Before(r.End); day = day.Add(24 * time.Hour) {
				if part, ok := r.Clip(day, day.Add(24*time.Hour)); ok {
					add(day.Format(time.DateOnly), part)
				}
			}
		default:
			return nil, UsageTotals{}, Invalid("group_by", "must be %s, %s or %s", GroupBySandbox, GroupByDay, GroupByTenant)
		}
	}
	for _, g := range byKey {
		groups = append(groups, *g)
	}
	sort.Slice(groups, func(i, j int) bool { return groups[i].Key < groups[j].Key })
	return groups, total, nil
}

// UsageSpan is a stretch of a sandbox's life metered as one kind.
type UsageSpan struct {
	Kind       UsageKind
	Start, End time.Time
}

// appendSpan adds s to spans, dropping it when empty and joining it to the
// last one when they are of one kind and touch.
func appendSpan(spans []UsageSpan, s UsageSpan) []UsageSpan {
	if !s.End.After(s.Start) {
		return spans
	}
	if n := len(spans); n > 0 && spans[n-1].Kind == s.Kind && spans[n-1].End.Equal(s.Start) {
		spans[n-1].End = s.End
		return spans
	}
	return append(spans, s)
}

// SpansOfRows joins one sandbox's ledger rows, sorted by start, into spans
// of one kind. It fails when a row does not start where the one before it
// ends: a gap (seconds never billed) or an overlap (seconds billed twice).
func SpansOfRows(rows []UsageRecord) ([]UsageSpan, error) {
	var spans []UsageSpan
	for i, r := range rows {
		if i > 0 && !r.Start.Equal(rows[i-1].End) {
			return nil, fmt.Errorf("usage row %d of %s starts at %s but the one before ends at %s",
				i, r.SandboxID, r.Start.Format(time.RFC3339Nano), rows[i-1].End.Format(time.RFC3339Nano))
		}
		spans = appendSpan(spans, UsageSpan{Kind: r.Kind, Start: r.Start, End: r.End})
	}
	return spans, nil
}

// SpansOfEvents derives what one sandbox was metered as from its event
// log, oldest first: the state each transition landed in, from the instant
// it did, up to end for a sandbox still alive. It is the audit view of the
// ledger: a sandbox's SpansOfRows must equal it.
func SpansOfEvents(events []Event, end time.Time) []UsageSpan {
	var spans []UsageSpan
	kind := UsageNone
	var since time.Time
	for _, ev := range events {
		next := kind
		switch ev.Type {
		case EventCreated, EventStarted, EventResumed, EventRestarted, EventReconciled:
			next = UsageRunning
		case EventPaused:
			next = UsageFrozen
			if ev.Attrs["mode"] == string(PauseSnapshot) {
				next = UsageSnapshotPaused
			}
		case EventHibernated, EventFailed, EventLost:
			next = UsageHibernated
			if ev.Type == EventFailed && ev.Attrs["code"] == FailureLost {
				// Lost with its node: it holds nothing any more.
				next = UsageNone
			}
		case EventArchived:
			next = UsageArchived
		case EventTerminated:
			next = UsageNone
		}
		if next == kind {
			continue
		}
		if kind != UsageNone {
			spans = appendSpan(spans, UsageSpan{Kind: kind, Start: since, End: ev.Time})
		}
		kind, since = next, ev.Time
	}
	if kind != UsageNone {
		spans = appendSpan(spans, UsageSpan{Kind: kind, Start: since, End: end})
	}
	return spans
}
