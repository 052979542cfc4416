// Package torpor holds the domain of the torpor sandbox platform: sandboxes,
// their states and failures, tenants and keys, events, the error kinds, and
// the interfaces the lifecycle engine needs from a runtime, a store and a
// clock. It imports no transport, SQL or runtime code.
package torpor

import (
	"crypto/rand"
	"time"
)

// State is where a sandbox is in its lifecycle.
type State string

// The states of DESIGN.md §1 and spec 003.
const (
	StateStarting    State = "starting"
	StateRunning     State = "running"
	StatePausing     State = "pausing"
	StatePaused      State = "paused"
	StateResuming    State = "resuming"
	StateHibernating State = "hibernating"
	StateHibernated  State = "hibernated"
	StateRestarting  State = "restarting"
	StateTerminating State = "terminating"
	StateTerminated  State = "terminated"
	StateFailed      State = "failed"
	// StateArchiving and StateArchived: a sandbox hibernated for its
	// policy's archive_after_hibernated_seconds has its disk packed into
	// one compressed archive in an object store and its working copy
	// freed from the node (docs/archive.md). A start restores it.
	StateArchiving State = "archiving"
	StateArchived  State = "archived"
)

// AllStates lists every state in lifecycle order.
var AllStates = []State{
	StateStarting, StateRunning, StatePausing, StatePaused, StateResuming,
	StateHibernating, StateHibernated, StateRestarting, StateTerminating,
	StateTerminated, StateFailed, StateArchiving, StateArchived,
}

// Valid reports whether s is one of the known states.
func (s State) Valid() bool {
	for _, k := range AllStates {
		if s == k {
			return true
		}
	}
	return false
}

// Transitional reports whether s is a short in-between state that a verb
// passes through (and that a restarted daemon must finish or roll back).
func (s State) Transitional() bool {
	switch s {
	case StateStarting, StatePausing, StateResuming, StateHibernating, StateRestarting, StateTerminating, StateArchiving:
		return true
	}
	return false
}

// PauseMode is how a pause stops a sandbox's processes.
type PauseMode string

const (
	// PauseFreeze stops the processes with the cgroup freezer; memory stays resident.
	PauseFreeze PauseMode = "freeze"
	// PauseSnapshot writes memory and CPU state to disk and releases the RAM.
	PauseSnapshot PauseMode = "snapshot"
)

// Failure codes carried by a failed sandbox.
const (
	FailureSetup      = "setup_failed"
	FailureEntrypoint = "entrypoint_exited"
	FailureOOM        = "out_of_memory"
	FailureRuntime    = "runtime_error"
	// FailureSnapshot: a snapshot could not be restored; the disk is kept.
	FailureSnapshot = "snapshot_unrestorable"
)

// Failure says why a sandbox is failed.
type Failure struct {
	Code     string `json:"code"`
	Message  string `json:"message"`
	ExitCode *int   `json:"exit_code,omitempty"`
}

// ArchiveInfo says where an archived sandbox's disk is: one compressed
// archive (the runtime's disk export) under Key in the archive store.
type ArchiveInfo struct {
	Key   string `json:"key"`
	Bytes int64  `json:"bytes"`
	// Kind is what was archived: "disk" (a hibernated sandbox's disk) or
	// "snapshot" (a sandbox paused by snapshot: its disk and memory, which
	// a start restores to paused and resumes).
	Kind string `json:"kind"`
	// ArchivedAt is when the archive was finished (zero while archiving).
	ArchivedAt time.Time `json:"archived_at,omitzero"`
}

// Resources are the limits a sandbox runs under.
type Resources struct {
	VCPUs     float64 `json:"vcpus"`
	MemoryMiB int64   `json:"memory_mib"`
	Pids      int64   `json:"pids"`
	DiskMiB   int64   `json:"disk_mib"`
}

// RuntimeConfig is what runs inside a sandbox at each boot (spec 003:
// setup commands, then the entrypoint) and on which runtime.
type RuntimeConfig struct {
	// Kind names the runtime ("runc"); empty means the server's default.
	Kind string `json:"kind,omitempty"`
	// Setup holds shell commands (run with /bin/sh -c) at each boot, in
	// order, before the entrypoint. A failing command fails the boot.
	Setup []string `json:"setup,omitempty"`
	// Entrypoint is the argv of the long-running service. When it exits the
	// sandbox fails with its exit status. Empty: a minimal init waits.
	Entrypoint []string `json:"entrypoint,omitempty"`
}

// Sandbox is one isolated environment and its lifecycle record.
type Sandbox struct {
	ID             string            `json:"id"`
	Tenant         string            `json:"tenant"`
	Template       string            `json:"template"`
	State          State             `json:"state"`
	StateSince     time.Time         `json:"state_since"`
	Failure        *Failure          `json:"failure"`
	CreatedAt      time.Time         `json:"created_at"`
	LastActivityAt time.Time         `json:"last_activity_at"`
	TerminatedAt   *time.Time        `json:"terminated_at,omitempty"`
	Resources      Resources         `json:"resources"`
	Metadata       map[string]string `json:"metadata"`
	Runtime        RuntimeConfig     `json:"runtime"`
	// PauseModes are the pause kinds this sandbox's runtime can do.
	PauseModes []PauseMode `json:"pause_modes"`
	// PauseMode is how the sandbox is (or is being) paused; empty otherwise.
	PauseMode PauseMode `json:"pause_mode,omitempty"`
	// Boots counts fresh boots (create, start from hibernation, restart).
	Boots int `json:"boots"`
	// Snapshot is where a snapshot-paused sandbox's memory is kept.
	Snapshot *SnapshotInfo `json:"snapshot,omitempty"`
	// AllowInternet lets the sandbox reach the internet; otherwise only the
	// proxy and hooks reach it and it reaches nothing.
	AllowInternet bool `json:"allow_internet"`
	// Network holds the sandbox's egress rules (docs/egress.md); nil:
	// none.
	Network *NetworkRules `json:"network,omitempty"`
	// Accel is the GPU lease the sandbox holds (nil: none), and GPU what
	// the lease manager says of it now (a gpu.Status; filled in by the
	// engine when it returns a sandbox, never stored).
	Accel *Accel `json:"accel,omitempty"`
	GPU   any    `json:"gpu,omitempty"`
	// Address is the sandbox's address on the host's sandbox network,
	// which the host reaches directly (filled in by the engine when it
	// returns a sandbox that has one, never stored).
	Address string `json:"address,omitempty"`
	// KeyID is the API key that created the sandbox (the GPU watchdog
	// flags it).
	KeyID string `json:"key_id,omitempty"`
	// FromPool says the sandbox was claimed from a warm pool of its
	// template (docs/pools.md) rather than booted for its create.
	FromPool bool `json:"from_pool"`
	// Node is the fleet node that owns the sandbox, the only one that acts
	// on it, and NodeEpoch that node's epoch when it took it (a node acts
	// only while both are its own). Empty: no node holds it (its state
	// is in the object store: a hibernated disk, which a node with room,
	// its node labels and its GPUs may start, or a VM snapshot, which only
	// a node of the same Host may resume).
	Node      string `json:"node"`
	NodeEpoch int64  `json:"node_epoch"`
	// NodeLabels are the labels its create asked of its node: a node
	// that starts it again (after its node went down, or a drain) has
	// them too.
	NodeLabels map[string]string `json:"node_labels,omitempty"`
	// Durability says where the sandbox's kept state lives (node: only
	// on its node; remote: in the object store too), and Remote where the
	// object store keeps it.
	Durability Durability   `json:"durability"`
	Remote     *RemoteState `json:"-"`
	// Archive is where an archived (or archiving) sandbox's disk is kept
	// (docs/archive.md); nil otherwise.
	Archive *ArchiveInfo `json:"archive,omitempty"`
	// RestoredFromArchiveAt is when the sandbox was last restored from its
	// archive (a start of an archived sandbox); nil if it never was.
	RestoredFromArchiveAt *time.Time `json:"restored_from_archive_at,omitempty"`
	// Checkpoints are the sandbox's named checkpoints (docs/fork.md).
	Checkpoints []CheckpointInfo `json:"checkpoints,omitempty"`
	// Forking is a fork of this sandbox under way (never shown); ForkOp,
	// on a fork being made, names it (cleared once the fork stands).
	Forking *ForkOp `json:"-"`
	ForkOp  string  `json:"-"`
	// RestoringCheckpoint names the checkpoint a restore is putting back
	// (never shown): a reconcile finishes it.
	RestoringCheckpoint string `json:"-"`
	// Pool names the template of the warm pool a sandbox is a ready
	// member of, owned by PoolTenant and shown to no one; empty for every
	// sandbox a tenant owns, a claimed one included.
	Pool string `json:"-"`

	// The idle policy in the two forms a caller may use (see Policy).
	Timeout         OptSeconds      `json:"timeout"`
	Lifecycle       *Lifecycle      `json:"lifecycle"`
	LifecyclePolicy LifecyclePolicy `json:"lifecycle_policy"`
	// EndAt is the sandbox's end time (E2B's timeout): a sandbox running
	// at EndAt gets OnEnd, whatever its activity. A paused or hibernated
	// sandbox's end does not run: each start and resume sets EndAt to then
	// plus EndAfterSeconds (when that is set). Nil: no end.
	EndAt           *time.Time `json:"end_at"`
	EndAfterSeconds int64      `json:"end_after_seconds,omitempty"`
	// OnEnd is what happens at EndAt: kill (empty too), pause or
	// hibernate.
	OnEnd string `json:"on_end,omitempty"`
	// Meters are the seconds, cost and transitions metered so far.
	Meters Meters `json:"meters"`
	// Usage is the open metering interval (see UsageState).
	Usage UsageState `json:"-"`
	// Hooks run on transitions; IgnoreImageHooks skips the template's.
	Hooks            []Hook       `json:"hooks"`
	IgnoreImageHooks bool         `json:"ignore_image_hooks"`
	HookFailure      *HookFailure `json:"hook_failure"`
	// Ports says which ports the proxy opens to anyone; the others need
	// TrafficToken (header X-Torpor-Token or query torpor_token).
	Ports        []PortSpec `json:"ports"`
	TrafficToken string     `json:"traffic_token"`
	// Secrets are the tenant's secrets the sandbox gets at each boot and
	// in each exec'd process: names and where they go, never values.
	Secrets []SecretRef `json:"secrets,omitempty"`
	// VolumeMounts are the tenant's volumes the sandbox mounts at each
	// boot (docs/volumes.md).
	VolumeMounts []VolumeMount `json:"volume_mounts,omitempty"`
	// Wakeups are the sandbox's scheduled wake-ups (docs/schedule.md).
	Wakeups []Wakeup `json:"wakeups"`
	// Schedule is derived by the engine when it returns a sandbox.
	Schedule

	// Env is never returned by the API: it often carries secrets.
	Env map[string]string `json:"-"`
	// Handle is the runtime's opaque reattachment handle.
	Handle string `json:"-"`
	// Version increases with every stored change; stores compare it to
	// refuse lost updates.
	Version int64 `json:"-"`
}

// Clone returns a deep copy, so callers can change it without touching s.
func (s *Sandbox) Clone() *Sandbox {
	c := *s
	c.Metadata = cloneMap(s.Metadata)
	c.Env = cloneMap(s.Env)
	c.Runtime.Setup = append([]string(nil), s.Runtime.Setup...)
	c.Runtime.Entrypoint = append([]string(nil), s.Runtime.Entrypoint...)
	c.PauseModes = append([]PauseMode(nil), s.PauseModes...)
	c.UpcomingEvents = append([]ScheduledEvent(nil), s.UpcomingEvents...)
	c.Ports = append([]PortSpec(nil), s.Ports...)
	c.Wakeups = CloneWakeups(s.Wakeups)
	if s.Secrets != nil {
		c.Secrets = append([]SecretRef(nil), s.Secrets...)
	}
	c.VolumeMounts = CloneVolumeMounts(s.VolumeMounts)
	c.Network = s.Network.Clone()
	if s.Hooks != nil {
		c.Hooks = make([]Hook, len(s.Hooks))
		for i, h := range s.Hooks {
			h.Arguments = append([]string(nil), h.Arguments...)
			c.Hooks[i] = h
		}
	}
	if s.HookFailure != nil {
		hf := *s.HookFailure
		c.HookFailure = &hf
	}
	if s.Lifecycle != nil {
		l := *s.Lifecycle
		if l.AutoResume != nil {
			v := *l.AutoResume
			l.AutoResume = &v
		}
		c.Lifecycle = &l
	}
	if s.Failure != nil {
		f := *s.Failure
		if f.ExitCode != nil {
			code := *f.ExitCode
			f.ExitCode = &code
		}
		c.Failure = &f
	}
	if s.Snapshot != nil {
		si := *s.Snapshot
		c.Snapshot = &si
	}
	if s.Accel != nil {
		a := *s.Accel
		c.Accel = &a
	}
	if s.Archive != nil {
		a := *s.Archive
		c.Archive = &a
	}
	if s.RestoredFromArchiveAt != nil {
		t := *s.RestoredFromArchiveAt
		c.RestoredFromArchiveAt = &t
	}
	if s.Checkpoints != nil {
		c.Checkpoints = append([]CheckpointInfo(nil), s.Checkpoints...)
	}
	if s.Forking != nil {
		f := *s.Forking
		f.Children = append([]string(nil), f.Children...)
		c.Forking = &f
	}
	if s.Remote != nil {
		r := *s.Remote
		c.Remote = &r
	}
	if s.TerminatedAt != nil {
		t := *s.TerminatedAt
		c.TerminatedAt = &t
	}
	if s.EndAt != nil {
		t := *s.EndAt
		c.EndAt = &t
	}
	return &c
}

func cloneMap(m map[string]string) map[string]string {
	if m == nil {
		return nil
	}
	c := make(map[string]string, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// Template is a root filesystem that sandboxes are created from, plus the
// defaults a sandbox made from it starts with. Its files are shared
// read-only by every sandbox made from it. See template.go.
type Template struct {
	Name string `json:"name"`
	// RootFS is the host path of a single-directory root filesystem (the
	// built-in base template). Unused when Layers is set.
	RootFS string `json:"-"`
	// Layers are the host paths of the read-only layer directories, lowest
	// first, stacked by overlayfs. Whiteouts in them are in overlayfs form.
	Layers []string `json:"-"`
	// Source says where the files came from; Digest identifies them (the
	// image manifest digest, or the single layer's digest).
	Source TemplateSource `json:"source"`
	Digest string         `json:"digest,omitempty"`
	// SizeBytes is the unpacked size of its layers.
	SizeBytes int64 `json:"size_bytes"`
	// Defaults apply to every sandbox created from the template.
	Defaults  TemplateDefaults `json:"defaults"`
	CreatedAt time.Time        `json:"created_at"`
	// InUse counts the sandboxes that are not terminated and use the
	// template; stores fill it in when they read templates.
	InUse int `json:"in_use"`
}

// Tenant owns sandboxes and keys; a tenant sees only its own sandboxes.
type Tenant struct {
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
	// Quota bounds what the tenant's sandboxes hold together.
	Quota Quota `json:"quota"`
	// Usage is what they hold now; the API fills it in from the engine,
	// stores do not keep it.
	Usage *QuotaUsage `json:"usage,omitempty"`
}

// APIKey authenticates requests for a tenant. Only a hash of the secret is
// stored.
type APIKey struct {
	ID     string `json:"id"`
	Tenant string `json:"tenant"`
	Admin  bool   `json:"admin"`
	// Tier is TierStandard or TierFree.
	Tier      string    `json:"tier"`
	Hash      string    `json:"-"`
	CreatedAt time.Time `json:"created_at"`
}

// Event records something that happened to a sandbox. Events are written in
// the same transaction as the state change they describe.
type Event struct {
	// Seq is the event's position in the global stream (the cursor),
	// assigned by the store.
	Seq       int64             `json:"seq"`
	Type      string            `json:"type"`
	SandboxID string            `json:"sandbox_id"`
	Tenant    string            `json:"tenant"`
	Time      time.Time         `json:"time"`
	Attrs     map[string]string `json:"attrs,omitempty"`
}

// Event types.
const (
	EventCreated    = "sandbox.created"
	EventStarted    = "sandbox.started"
	EventPaused     = "sandbox.paused"
	EventResumed    = "sandbox.resumed"
	EventHibernated = "sandbox.hibernated"
	EventRestarted  = "sandbox.restarted"
	EventFailed     = "sandbox.failed"
	EventTerminated = "sandbox.terminated"
	EventReconciled = "sandbox.reconciled"
	// EventLost: after a restart the sandbox's instance was found dead; the
	// event's time is its last recorded sign of life.
	EventLost        = "sandbox.lost"
	EventStateChange = "sandbox.state"
	// EventUploaded: a hibernated sandbox's disk is in the object store
	// (durability remote); EventReleased: its node let it go (drained or
	// declared down), so any node may start it; EventClaimed: a node took
	// a sandbox no live node held (docs/fleet.md).
	EventUploaded = "sandbox.uploaded"
	EventReleased = "sandbox.released"
	EventClaimed  = "sandbox.claimed"
	// EventArchived: a hibernated sandbox's disk is in its archive and its
	// working copy is gone from the node (docs/archive.md). A start that
	// restores it says so on its sandbox.started event (restored_from
	// archive).
	EventArchived = "sandbox.archived"
)

const idAlphabet = "abcdefghijklmnopqrstuvwxyz0123456789"

// NewID returns prefix followed by n random lowercase letters and digits,
// safe in host names and paths.
func NewID(prefix string, n int) string {
	out := make([]byte, 0, n)
	buf := make([]byte, n+8)
	for len(out) < n {
		if _, err := rand.Read(buf); err != nil {
			panic("torpor: no randomness: " + err.Error())
		}
		for _, c := range buf {
			// 252 = 7*36: dropping bytes above it keeps every character equally likely.
			if c < 252 && len(out) < n {
				out = append(out, idAlphabet[int(c)%len(idAlphabet)])
			}
		}
	}
	return prefix + string(out)
}

// ValidID reports whether id could have been made by NewID: it guards every
// id that reaches a path or a runtime from outside.
func ValidID(id string) bool {
	if len(id) == 0 || len(id) > 64 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '_') {
			return false
		}
	}
	return true
}
