package gpu

import (
	"sync"
	"time"
)

// Why a resident lease is frozen on the freeze-only path of a hard-cap
// host (Status.FreezeReason).
const (
	FreezeReasonNonWorkerVRAM    = "non_worker_vram_resident"
	FreezeReasonProbeUnavailable = "vram_probe_unavailable"
)

// Why a lease is dead (Status.DeadReason).
const (
	DeadWatchdog      = "watchdog_vram_limit"
	DeadRestoredDead  = "restored_dead"
	DeadWorkerExited  = "worker_exited"
	DeadRestoreFailed = "restore_failed"
)

// Transitions a lease can have in flight (Status.Transition).
const (
	opPausing  = "pausing"
	opResuming = "resuming"
	opThawing  = "thawing"
)

// Status is what the API shows of a lease.
type Status struct {
	ID          string      `json:"id"`
	Tenant      string      `json:"tenant"`
	SuspendMode SuspendMode `json:"suspend_mode"`
	// Phase is the wire phase: resident, suspended (spilled, or resident
	// and frozen), dead or destroyed.
	Phase Phase `json:"phase"`
	// Frozen: the lease is resident and frozen; its VRAM never left the
	// card and its seat is still accounted.
	Frozen       bool   `json:"frozen"`
	FreezeReason string `json:"freeze_reason,omitempty"`
	FreezeOnly   bool   `json:"freeze_only,omitempty"`
	// Spilled: the worker's GPU state is in host memory.
	Spilled    bool   `json:"spilled,omitempty"`
	HoldsSeat  bool   `json:"holds_seat"`
	Busy       bool   `json:"busy"`
	Transition string `json:"transition,omitempty"`
	SliceMiB   int64  `json:"slice_mib"`
	// CapMiB is the sticky cap of the worker's reservation set by the
	// last resume (absent: no cap); TargetMiB what the worker reserves.
	CapMiB           *int64     `json:"cap_mib,omitempty"`
	TargetMiB        int64      `json:"target_mib"`
	ReserveError     string     `json:"reserve_error,omitempty"`
	DeadReason       string     `json:"dead_reason,omitempty"`
	LastActivityAt   time.Time  `json:"last_activity_at"`
	ResumeGraceUntil *time.Time `json:"resume_grace_until,omitempty"`
	Meters           Meters     `json:"meters"`
}

type claim struct {
	op   string
	done chan struct{}
}

// lease is the manager's state of one lease. Every field but saveMu is
// guarded by Manager.mu.
type lease struct {
	spec Spec
	// phase is the committed phase; frozen says the processes are stopped
	// (a freeze, or a spill).
	phase        Phase
	frozen       bool
	freezeOnly   bool
	freezeReason string
	// op is the transition in flight, if any: others wait for its commit.
	op           *claim
	job          bool
	capMiB       *int64
	resumedAt    time.Time
	lastActivity time.Time
	lastSeen     time.Time
	savedAt      time.Time
	deadReason   string
	reserveErr   string
	meters       Meters
	seg          Segment
	pending      []UsageRow

	// saveMu keeps one save of the lease at a time, so that no row is
	// written twice.
	saveMu sync.Mutex
}

// target is what the worker reserves: the slice, or the sticky cap when
// it is lower. It is measured against the original slice target.
func (l *lease) target() int64 {
	t := l.spec.Accel.VRAMMiB
	if l.capMiB != nil && *l.capMiB < t {
		t = *l.capMiB
	}
	return t
}

// switchSeg settles the open interval at now and opens kind.
func (l *lease) switchSeg(now time.Time, kind segKind, freezeOnly bool) {
	l.closeSeg(now)
	l.seg = Segment{Kind: kind, Start: now, FreezeOnly: freezeOnly}
}

// closeSeg settles the open interval at end: into the meters, and a row.
func (l *lease) closeSeg(end time.Time) {
	if r, ok := accrue(&l.meters, l.seg, end, l.spec); ok {
		l.pending = append(l.pending, r)
	}
	l.seg = Segment{Kind: segNone, Start: end}
}

// runningSeg is the interval a resident, unfrozen lease is in.
func (l *lease) runningSeg() segKind {
	if l.job {
		return segBusy
	}
	return segIdle
}

func (l *lease) claim(op string) *claim {
	c := &claim{op: op, done: make(chan struct{})}
	l.op = c
	return c
}

func (l *lease) release(c *claim) {
	if l.op == c {
		l.op = nil
	}
	close(c.done)
}

func (l *lease) status(now time.Time, grace time.Duration) Status {
	m := l.meters
	accrue(&m, l.seg, now, l.spec)
	m.SuspendMode = l.spec.Accel.SuspendMode
	m.IdleTimeoutS = l.spec.Accel.IdleTimeoutS
	s := Status{
		ID: l.spec.ID, Tenant: l.spec.Tenant, SuspendMode: l.spec.Accel.SuspendMode,
		Phase:        l.phase,
		Frozen:       l.phase == PhaseResident && l.frozen,
		FreezeReason: l.freezeReason, FreezeOnly: l.freezeOnly,
		Spilled:   l.phase == PhaseSuspended,
		HoldsSeat: l.phase == PhaseResident,
		Busy:      l.job,
		SliceMiB:  l.spec.Accel.VRAMMiB, TargetMiB: l.target(),
		ReserveError: l.reserveErr, DeadReason: l.deadReason,
		LastActivityAt: l.lastActivity,
		Meters:         m,
	}
	if s.Frozen {
		// A frozen lease stays resident inside, but the wire says it is
		// suspended.
		s.Phase = PhaseSuspended
	}
	if l.capMiB != nil {
		c := *l.capMiB
		s.CapMiB = &c
	}
	if l.op != nil {
		s.Transition = l.op.op
	}
	if !l.resumedAt.IsZero() && grace > 0 && now.Before(l.resumedAt.Add(grace)) {
		until := l.resumedAt.Add(grace)
		s.ResumeGraceUntil = &until
	}
	return s
}

func (l *lease) record() Record {
	r := Record{
		Spec: l.spec, Phase: l.phase, Frozen: l.frozen, FreezeOnly: l.freezeOnly,
		FreezeReason: l.freezeReason, ResumedAt: l.resumedAt,
		LastActivity: l.lastActivity, LastSeen: l.lastSeen,
		DeadReason: l.deadReason, ReserveError: l.reserveErr,
		Meters: l.meters, Seg: l.seg,
	}
	if l.op != nil {
		r.Op = l.op.op
	}
	if l.capMiB != nil {
		c := *l.capMiB
		r.CapMiB = &c
	}
	return r
}
