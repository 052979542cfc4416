package torpor

import (
	"context"
	"time"
)

// Checkpoints and fork (docs/fork.md). A checkpoint is a named, immutable
// copy of a sandbox's disk, taken without ending the sandbox; a fork is a
// new sandbox that boots on a copy of a checkpoint (or of its parent's
// disk as it is).

// Checkpoint kinds (CheckpointInfo.Kind).
const (
	// CheckpointDisk: a copy of the sandbox's disk only; processes and
	// memory are not kept (container sandboxes).
	CheckpointDisk = "disk"
)

// Checkpoint states: a checkpoint is stored as creating before its copy
// is made and ready once it is; a daemon that died in between removes the
// half-made copy and the entry.
const (
	CheckpointCreating = "creating"
	CheckpointReady    = "ready"
)

// MaxCheckpoints bounds the checkpoints one sandbox keeps; MaxForkCount
// the sandboxes one fork makes.
const (
	MaxCheckpoints = 32
	MaxForkCount   = 16
)

// CheckpointInfo is a checkpoint as its sandbox's record keeps it.
type CheckpointInfo struct {
	Name      string    `json:"name"`
	State     string    `json:"state"`
	CreatedAt time.Time `json:"created_at"`
	// SizeBytes is the space the copy takes (a reflink copy shares its
	// blocks with the disk until either changes).
	SizeBytes int64  `json:"size_bytes"`
	Kind      string `json:"kind"`
	// Method says how the copy was made: reflink, or copy.
	Method string `json:"method,omitempty"`
}

// ValidCheckpointName reports whether s names a checkpoint: 1..63 of
// [A-Za-z0-9._-], not starting with '.' or '-'.
func ValidCheckpointName(s string) bool {
	if len(s) == 0 || len(s) > 63 || s[0] == '.' || s[0] == '-' {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// Checkpointer is an optional Runtime capability: named copies of a
// sandbox's disk, kept apart from the disk (a Destroy of the instance
// keeps them; DeleteCheckpoint removes them), and new sandboxes' disks
// made from them.
type Checkpointer interface {
	// Checkpoint copies the disk of the sandbox as checkpoint name (an
	// existing one of that name is replaced). A running instance is frozen
	// for the copy and thawed after, so the copy is consistent; a frozen
	// one stays frozen; a stopped one is copied as it is.
	Checkpoint(ctx context.Context, ref InstanceRef, name string) (CheckpointInfo, error)
	// RestoreCheckpoint replaces the disk of a sandbox whose instance is
	// not live (a conflict otherwise) by a copy of checkpoint name.
	RestoreCheckpoint(ctx context.Context, ref InstanceRef, name string) error
	// CloneCheckpoint makes the disk of sandbox dstID, which has none, a
	// copy of sandbox srcID's checkpoint name, ready for a Boot.
	CloneCheckpoint(ctx context.Context, srcID, name, dstID string) error
	// DeleteCheckpoint removes checkpoint name of sandbox id; a missing
	// one is no error.
	DeleteCheckpoint(ctx context.Context, id, name string) error
	// ListCheckpoints returns, for every sandbox the runtime keeps
	// checkpoints of, their names (so that leftovers can be removed).
	ListCheckpoints(ctx context.Context) (map[string][]string, error)
}

// ForkRequest is the body of POST /v1/sandboxes/{id}/fork.
type ForkRequest struct {
	Count      int    `json:"count"`
	Checkpoint string `json:"checkpoint,omitempty"`
	// Metadata and Env, merged over the parent's, and Policy, applied
	// over it, are what a create from a snapshot (E2B's) asks of its
	// fork; not part of the native API.
	Metadata map[string]string `json:"-"`
	Env      map[string]string `json:"-"`
	Policy   *PolicyRequest    `json:"-"`
}

// Validate checks a fork request.
func (r ForkRequest) Validate() error {
	if r.Count < 1 || r.Count > MaxForkCount {
		return Invalid("count", "count must be 1..%d", MaxForkCount)
	}
	if r.Checkpoint != "" && !ValidCheckpointName(r.Checkpoint) {
		return Invalid("checkpoint", "invalid checkpoint name %q", r.Checkpoint)
	}
	return nil
}

// ForkResult is the answer of a fork.
type ForkResult struct {
	Sandboxes []*Sandbox `json:"sandboxes"`
	// Checkpoint is the checkpoint the forks were made from (empty: the
	// parent's disk as it was).
	Checkpoint string `json:"checkpoint,omitempty"`
	// ProcessesCarried says whether the forks continue the parent's
	// processes (false for container sandboxes: each boots afresh on its
	// copy of the disk).
	ProcessesCarried bool   `json:"processes_carried"`
	Note             string `json:"note,omitempty"`
}

// Metadata keys a fork carries.
const (
	MetaForkedFrom           = "forked_from"
	MetaForkedFromCheckpoint = "forked_from_checkpoint"
)

// ForkOp is a fork under way, kept in its parent's record until every
// fork is made (then all of them stand) or a reconcile after a crash
// removes the forks it names (then none does).
type ForkOp struct {
	ID       string   `json:"id"`
	Children []string `json:"children"`
	// TempCheckpoint is a checkpoint the fork made of its running parent
	// for itself, removed once the forks are made.
	TempCheckpoint string `json:"temp_checkpoint,omitempty"`
}
