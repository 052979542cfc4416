package gpulease

import "time"

// Meters are a lease's totals, shown in GET /v1/sandboxes/{id}. Seconds
// are split by what the lease did; BilledS is what it is charged for.
//
//   - ResidentS: the lease held its seat (VRAM on the card): running,
//     busy, resuming or frozen.
//   - BilledS: every resident second. A frozen lease (a none pause or a
//     freeze-only suspend) keeps holding its slice, so it is billed in
//     full; a spilled transparent lease bills 0 while it is paused.
//   - FrozenS, Freezes: time and count of freezes (both kinds).
//   - FrozenBilledS: the billed seconds of freeze-only intervals of a
//     transparent lease (its only frozen time).
//   - RunningS: resident and not frozen (busy + idle + resume).
//   - BusyS: a job in flight; IdleS: resident, unfrozen, no job;
//     ResumeS: restoring and re-reserving after a spill; SuspendedS:
//     spilled, not billed.
type Meters struct {
	SuspendMode   SuspendMode `json:"suspend_mode"`
	ResidentS     float64     `json:"resident_s"`
	BilledS       float64     `json:"billed_s"`
	RunningS      float64     `json:"running_s"`
	BusyS         float64     `json:"busy_s"`
	IdleS         float64     `json:"idle_s"`
	ResumeS       float64     `json:"resume_s"`
	SuspendedS    float64     `json:"suspended_s"`
	FrozenS       float64     `json:"frozen_s"`
	Freezes       int64       `json:"freezes"`
	FrozenBilledS float64     `json:"frozen_billed_s"`
	Spills        int64       `json:"spills"`
	Resumes       int64       `json:"resumes"`
	Jobs          int64       `json:"jobs"`
	// IdleTimeoutS is the lease's idle auto-pause timeout (0: off);
	// AutoPaused counts the pauses the idle sweep made.
	IdleTimeoutS int   `json:"idle_timeout_s"`
	AutoPaused   int64 `json:"auto_paused"`
}

// Counters are what a node reports for the front to settle: cumulative
// charged seconds by kind. Busy carries the exec's busy seconds, the idle
// seconds and a transparent lease's freeze-only frozen intervals; for a
// none lease it is the whole residency, frozen time included. Busy +
// Resume == BilledS.
type Counters struct {
	Busy   float64 `json:"busy_s"`
	Resume float64 `json:"resume_s"`
}

// Counters returns the settlement counters of the meters.
func (m Meters) Counters() Counters {
	return Counters{Busy: m.BilledS - m.ResumeS, Resume: m.ResumeS}
}

// RowKind is what a usage row charges for. Rows with Billed set are
// charged; the others are analytics.
type RowKind string

const (
	// RowBusy: a job ran, or the lease was frozen holding its seat (a
	// freeze-only interval, or a none pause) — charged in full.
	RowBusy RowKind = "busy"
	// RowIdle: resident with no job — charged.
	RowIdle RowKind = "idle"
	// RowResume: restoring and re-reserving after a spill — charged.
	RowResume RowKind = "resume"
	// RowSuspended: spilled — not charged.
	RowSuspended RowKind = "suspended"
)

// Causes a row may carry.
const (
	CauseJob        = "job"
	CauseIdle       = "idle"
	CauseResume     = "resume"
	CauseFreezeOnly = "freeze_only"
	CauseFrozenNone = "frozen_resident"
	CauseSpilled    = "spilled"
)

// UsageRow is one stretch of a lease's life for the usage ledger. A
// lease's rows do not overlap and leave no gap from its creation to its
// end (a restored-dead lease's trail ends at its last sign of life).
type UsageRow struct {
	LeaseID  string    `json:"lease_id"`
	Tenant   string    `json:"tenant"`
	Kind     RowKind   `json:"kind"`
	Cause    string    `json:"cause"`
	Billed   bool      `json:"billed"`
	Start    time.Time `json:"start"`
	End      time.Time `json:"end"`
	Seconds  float64   `json:"seconds"`
	GPUs     int       `json:"gpus"`
	SliceMiB int64     `json:"slice_mib"`
}

// SegKind is what an open interval of a lease is.
type SegKind string

const (
	SegNone      SegKind = "" // dead or destroyed: nothing accrues
	SegIdle      SegKind = "idle"
	SegBusy      SegKind = "busy"
	SegResume    SegKind = "resume"
	SegFrozen    SegKind = "frozen"
	SegSuspended SegKind = "suspended"
)

// Segment is a lease's open usage interval.
type Segment struct {
	Kind  SegKind   `json:"kind"`
	Start time.Time `json:"start"`
	// FreezeOnly marks a frozen interval of a transparent lease.
	FreezeOnly bool `json:"freeze_only,omitempty"`
}
