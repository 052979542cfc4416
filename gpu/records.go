package gpu

import "github.com/torpor-dev/torpor/gpu/gpulease"

// What is persisted of a lease is declared in gpu/gpulease, so that a
// store keeps leases without importing the manager; these are its names
// here, as os re-exports io/fs.
type (
	Store       = gpulease.Store
	Flagger     = gpulease.Flagger
	Flag        = gpulease.Flag
	Phase       = gpulease.Phase
	Record      = gpulease.Record
	SuspendMode = gpulease.SuspendMode
	Accel       = gpulease.Accel
	Spec        = gpulease.Spec
	Meters      = gpulease.Meters
	Counters    = gpulease.Counters
	RowKind     = gpulease.RowKind
	UsageRow    = gpulease.UsageRow
	Segment     = gpulease.Segment
)

const (
	PhaseResident  = gpulease.PhaseResident
	PhaseSuspended = gpulease.PhaseSuspended
	PhaseDead      = gpulease.PhaseDead
	PhaseDestroyed = gpulease.PhaseDestroyed

	SuspendNone        = gpulease.SuspendNone
	SuspendTransparent = gpulease.SuspendTransparent

	RowBusy      = gpulease.RowBusy
	RowIdle      = gpulease.RowIdle
	RowResume    = gpulease.RowResume
	RowSuspended = gpulease.RowSuspended

	CauseJob        = gpulease.CauseJob
	CauseIdle       = gpulease.CauseIdle
	CauseResume     = gpulease.CauseResume
	CauseFreezeOnly = gpulease.CauseFreezeOnly
	CauseFrozenNone = gpulease.CauseFrozenNone
	CauseSpilled    = gpulease.CauseSpilled
)

// The kinds of a lease's open interval keep their short names inside the
// manager: they are its bookkeeping, not its API.
type segKind = gpulease.SegKind

const (
	segNone      = gpulease.SegNone
	segIdle      = gpulease.SegIdle
	segBusy      = gpulease.SegBusy
	segResume    = gpulease.SegResume
	segFrozen    = gpulease.SegFrozen
	segSuspended = gpulease.SegSuspended
)
