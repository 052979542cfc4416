// Package gpulease holds what is persisted of a GPU lease: its record,
// the spec and phase inside it, its meters and usage rows, the abuse flags
// the watchdog raises, and the Store and Flagger interfaces that keep
// them. It is a leaf of package gpu, the lease manager, so that a store
// can keep GPU leases without importing the manager; package gpu
// re-exports every name here (as os does for io/fs), so the manager and
// its callers read gpu.Record.
package gpulease

import (
	"context"
	"time"
)

// Store persists a lease's record together with its new usage rows, in
// one write, so that a billed second is never in memory only.
type Store interface {
	SaveLease(ctx context.Context, rec Record, rows []UsageRow) error
}

// Flagger flags an API key for abuse.
type Flagger interface {
	FlagKey(ctx context.Context, f Flag) error
}

// Flag is one abuse flag the watchdog raises.
type Flag struct {
	Tenant   string    `json:"tenant"`
	KeyID    string    `json:"key_id"`
	LeaseID  string    `json:"lease_id"`
	UsedMiB  int64     `json:"used_mib"`
	LimitMiB int64     `json:"limit_mib"`
	Reason   string    `json:"reason"`
	At       time.Time `json:"at"`
	// NonWorkerOnly: the lease was inside its resume grace, so only its
	// non-worker processes were counted.
	NonWorkerOnly bool `json:"non_worker_only,omitempty"`
}

// Phase is where a lease is.
type Phase string

const (
	// PhaseResident: the lease holds its seat and its VRAM is on the
	// card, running or frozen (Frozen says which).
	PhaseResident Phase = "resident"
	// PhaseSuspended: the worker's GPU state is spilled to host memory,
	// the seat is free and the lease's processes are frozen.
	PhaseSuspended Phase = "suspended"
	// PhaseDead: the lease's processes are gone (watchdog kill, worker
	// exit, a restart that found it dead); nothing accrues.
	PhaseDead Phase = "dead"
	// PhaseDestroyed: deleted.
	PhaseDestroyed Phase = "destroyed"
)

// Record is what the daemon persists of a lease so that a restart
// re-seeds it (Manager.Adopt). Meters are settled up to Seg.Start: the
// rows for every earlier second are saved with the record.
type Record struct {
	Spec         Spec      `json:"spec"`
	Phase        Phase     `json:"phase"`
	Frozen       bool      `json:"frozen,omitempty"`
	FreezeOnly   bool      `json:"freeze_only,omitempty"`
	FreezeReason string    `json:"freeze_reason,omitempty"`
	Op           string    `json:"op,omitempty"`
	CapMiB       *int64    `json:"cap_mib,omitempty"`
	ResumedAt    time.Time `json:"resumed_at,omitzero"`
	LastActivity time.Time `json:"last_activity"`
	// LastSeen is the lease's last sign of life: when its worker was last
	// seen alive.
	LastSeen     time.Time `json:"last_seen"`
	DeadReason   string    `json:"dead_reason,omitempty"`
	ReserveError string    `json:"reserve_error,omitempty"`
	Meters       Meters    `json:"meters"`
	Seg          Segment   `json:"segment"`
}

// SuspendMode says what pausing a lease does.
type SuspendMode string

const (
	// SuspendNone: pause freezes the whole lease; its VRAM stays on the
	// card and it is billed in full.
	SuspendNone SuspendMode = "none"
	// SuspendTransparent: pause spills the worker's GPU state to host
	// memory and frees the seat, or, on a hard-cap host where that is not
	// safe, freezes the lease (freeze-only).
	SuspendTransparent SuspendMode = "transparent"
)

// Accel is a validated accel request: every field has its value.
type Accel struct {
	GPUs         int         `json:"gpus"`
	VRAMMiB      int64       `json:"vram_mib"`
	SuspendMode  SuspendMode `json:"suspend_mode"`
	IdleTimeoutS int         `json:"idle_timeout_s"`
}

// Spec is what the manager needs to hold a lease: who owns it, its
// validated accel request, and where its processes are on the host.
type Spec struct {
	ID     string `json:"id"`
	Tenant string `json:"tenant"`
	// KeyID is the API key that created the lease; the watchdog flags it.
	KeyID string `json:"key_id,omitempty"`
	Accel Accel  `json:"accel"`
	// Group names the lease's processes on the host (its cgroup).
	Group string `json:"group"`
	// WorkerPID is the host pid of the lease's worker.
	WorkerPID int   `json:"worker_pid"`
	Devices   []int `json:"devices,omitempty"`
	// LimitMiB is the watchdog's limit for the lease's VRAM; 0 means the
	// slice (Accel.VRAMMiB).
	LimitMiB int64 `json:"limit_mib,omitempty"`
}
