package torpor

import (
	"context"
	"io"
	"time"
)

// A fleet is several torpor daemons (nodes) sharing one store (PostgreSQL)
// and, optionally, one object store (docs/fleet.md). Each sandbox is owned
// by one node, the only one that acts on it; the others forward requests
// for it to its owner.

// NodeState is where a node is in the fleet.
type NodeState string

const (
	// NodeUp: the node heartbeats and takes new sandboxes.
	NodeUp NodeState = "up"
	// NodeDraining: the node moves its sandboxes away and takes no new
	// ones (torpor nodes drain).
	NodeDraining NodeState = "draining"
	// NodeDown: the node missed its heartbeats for the fleet's down
	// timeout; its epoch moved on, so nothing it still does is accepted.
	NodeDown NodeState = "down"
)

// Node is one daemon of a fleet.
type Node struct {
	Name string `json:"name"`
	// Address is the host:port of its API, and ProxyAddress that of its
	// port proxy (empty: none), where other nodes forward requests.
	Address      string            `json:"address"`
	ProxyAddress string            `json:"proxy_address,omitempty"`
	Labels       map[string]string `json:"labels"`
	// Runtimes are the runtime kinds it runs.
	Runtimes []string `json:"runtimes"`
	// Host describes what a VM snapshot needs of a host to resume on it
	// (QEMU and guest kernel versions, acceleration, CPU model, sandbox
	// network: the SnapshotArchiver.Host of each of its runtimes that has
	// one); two nodes are compatible when equal.
	Host string `json:"host,omitempty"`
	// Capacity is what it lends to sandboxes and Used what its sandboxes
	// hold of it (as of its last heartbeat).
	Capacity Resources `json:"capacity"`
	Used     Resources `json:"used"`
	// GPUs is its GPU host's capacity (Count 0: it has none), and what
	// the leases of its GPU sandboxes hold of it as of its last heartbeat.
	GPUs NodeGPUs `json:"gpus"`
	// Sandboxes counts its sandboxes by state (filled in by ListNodes).
	Sandboxes map[State]int `json:"sandboxes"`
	State     NodeState     `json:"state"`
	// Instance is an opaque random id of the daemon's data dir (empty:
	// none given). A second data dir that runs under the same name (a
	// cloned host) is refused by JoinNode while the node is not down, and
	// fenced where it slipped through, so that two daemons never serve
	// one node's sandboxes.
	Instance string `json:"-"`
	// Epoch is the node's incarnation: it moves on when the node is
	// declared down, which fences off anything the old one still does.
	Epoch       int64     `json:"epoch"`
	JoinedAt    time.Time `json:"joined_at"`
	HeartbeatAt time.Time `json:"heartbeat_at"`
}

// NodeGPUs is a node's GPUs: how many, of which model, their VRAM in
// all, and how much of it the VRAM slices of its GPU leases hold (those
// that hold a seat: a spilled lease's slice is free for another). A
// create that asks for a GPU lease (accel) is placed only on a node with
// at least the GPUs it asks for and its slice free (docs/fleet.md).
type NodeGPUs struct {
	Count       int    `json:"count"`
	Model       string `json:"model,omitempty"`
	VRAMMiB     int64  `json:"vram_mib"`
	UsedVRAMMiB int64  `json:"used_vram_mib"`
}

// Fits reports whether g has gpus GPUs and vramMiB of VRAM free, less
// what else is on its way to it (pending MiB).
func (g NodeGPUs) Fits(gpus int, vramMiB, pending int64) bool {
	return gpus <= g.Count && g.UsedVRAMMiB+pending+vramMiB <= g.VRAMMiB
}

// Durability says where a sandbox's kept state (disk, memory snapshot)
// lives.
type Durability string

const (
	// DurabilityNode: only on its node; it is lost with the node.
	DurabilityNode Durability = "node"
	// DurabilityRemote: in the object store too; any node can start it
	// (a VM snapshot: any node of the same Host).
	DurabilityRemote Durability = "remote"
)

// RemoteState is where the object store keeps a sandbox's state: the
// manifest's key, written last, and what it lists.
type RemoteState struct {
	Manifest   string    `json:"manifest"`
	Bytes      int64     `json:"bytes"`
	Boots      int       `json:"boots"`
	UploadedAt time.Time `json:"uploaded_at"`
	// Host is the Host of the node that uploaded a VM memory snapshot
	// (a snapshot-paused sandbox's state), which only a node of the same
	// Host resumes; empty for a disk, which any node starts.
	Host string `json:"host,omitempty"`
}

// FailureLost is the failure of a sandbox whose state was only on a node
// that went down.
const FailureLost = "lost"

// ReasonFenced refines the unavailable error of a write by a node whose
// epoch is no longer current (it was declared down).
const ReasonFenced = "fenced"

// Fenced is the error a store returns for a write by a node that is no
// longer current.
func Fenced(node string) *Error {
	return &Error{Code: EUnavailable, Reason: ReasonFenced, RetryAfter: time.Second,
		Message: "node " + node + " was declared down; it may not change sandboxes until it joins again"}
}

// ReasonNodeInUse refines the conflict of a join by a daemon of another
// data dir (another Node.Instance) under the name of a node that is not
// down.
const ReasonNodeInUse = "node_in_use"

// NodeInUse is the error of such a join.
func NodeInUse(node string) *Error {
	return &Error{Code: EConflict, Reason: ReasonNodeInUse,
		Message: "node " + node + " runs from another data dir: another torpor daemon (a copy of this host?) runs as this node; " +
			"give each daemon of a fleet its own node name, or stop the other daemon and let the fleet declare the node down (docs/fleet.md)"}
}

// ReasonMoved refines the unavailable error of a request that reached a
// node which does not own the sandbox (its owner changed under the
// request): sent again, it goes to the owner.
const ReasonMoved = "moved"

// Moved is the error of a request for a sandbox that node owns, made to
// another node.
func Moved(id, node string) *Error {
	return &Error{Code: EUnavailable, Reason: ReasonMoved, RetryAfter: time.Second,
		Message: "sandbox " + id + " is on node " + node + "; send the request again"}
}

// NodeStore keeps the fleet's nodes. Times are the database's, so that the
// nodes' clocks need not agree.
type NodeStore interface {
	// JoinNode registers n (Name, Instance, addresses, labels, runtimes,
	// host, capacity, GPUs) as up and returns its epoch: the one it had while
	// it was never declared down, a new one when it was (or is new). A
	// node that is not down and joined with another Instance refuses the
	// join (NodeInUse); an empty Instance matches any. From then on the
	// store fences the sandbox writes of this store handle with that
	// node, epoch and instance (see Fenced).
	JoinNode(ctx context.Context, n Node) (epoch int64, err error)
	// Heartbeat records that the node is alive now, with what it uses
	// (and the VRAM its GPU leases hold, NodeGPUs.UsedVRAMMiB);
	// a node declared down (another epoch), or taken by another instance
	// than the one this handle joined as, gets Fenced. It returns the
	// node's state (up, or draining when someone asked for a drain).
	Heartbeat(ctx context.Context, name string, epoch int64, used Resources, usedVRAMMiB int64) (NodeState, error)
	// ListNodes returns every node, by name, with its sandbox counts.
	ListNodes(ctx context.Context) ([]Node, error)
	// SetNodeState sets an up node draining or a draining one up; a
	// down or unknown node is a conflict or not_found.
	SetNodeState(ctx context.Context, name string, s NodeState) error
	// DeclareDown marks down every up or draining node whose last
	// heartbeat is older than timeout by the database's clock, giving
	// each a new epoch, and returns them as they were (HeartbeatAt is
	// their last one).
	DeclareDown(ctx context.Context, timeout time.Duration) ([]Node, error)
	// Exclusive runs fn while holding the fleet-wide lock called name,
	// which one caller at a time holds (PostgreSQL: an advisory lock); it
	// returns false without running fn when another holds it. fn's
	// context is cancelled when the lock is lost (its database session
	// ended), since another may then take it: fn must stop.
	Exclusive(ctx context.Context, name string, fn func(ctx context.Context) error) (bool, error)
}

// ObjectStore keeps blobs by key (an S3 bucket, docs/fleet.md). Keys are
// slash-separated paths of [A-Za-z0-9._-] segments.
type ObjectStore interface {
	// Put stores r (size bytes; -1: unknown) under key, replacing what was
	// there; a key is either wholly written or not at all.
	Put(ctx context.Context, key string, r io.Reader, size int64) error
	// Get opens what key holds; a missing key is not_found.
	Get(ctx context.Context, key string) (io.ReadCloser, error)
	// Delete removes key; a missing key is no error.
	Delete(ctx context.Context, key string) error
	// Where names the store for logs, without credentials.
	Where() string
}

// DiskArchiver is an optional Runtime capability: a stopped (hibernated)
// sandbox's disk written as one stream, and a disk made again from such a
// stream on another node, so that the sandbox can start there.
type DiskArchiver interface {
	// ExportDisk writes the disk of a sandbox whose instance is stopped
	// (a conflict otherwise) to w and returns how many bytes it wrote.
	ExportDisk(ctx context.Context, ref InstanceRef, w io.Writer) (int64, error)
	// ImportDisk makes the disk of sandbox id from a stream ExportDisk
	// wrote (replacing any disk it has), ready for a Boot.
	ImportDisk(ctx context.Context, id string, r io.Reader) error
}

// SnapshotArchiver is an optional Runtime capability, a Snapshotter whose
// snapshots travel: the whole state of a snapshot-paused sandbox (its
// disk, its memory snapshot and what its restore needs) written as one
// stream, and made again from such a stream on another node of the same
// Host, so that the sandbox resumes there where it stopped (Restore).
type SnapshotArchiver interface {
	Snapshotter
	// ExportSnapshot writes the state of a sandbox whose instance is
	// snapshotted (a conflict otherwise) to w and returns how many bytes
	// it wrote.
	ExportSnapshot(ctx context.Context, ref InstanceRef, w io.Writer) (int64, error)
	// ImportSnapshot makes the disk and snapshot of sandbox id from a
	// stream ExportSnapshot wrote (replacing any it has), ready for a
	// Restore, moving them into place only once all of the stream has
	// been read and found good. A stream made on another Host is a
	// conflict with Reason FailureSnapshot.
	ImportSnapshot(ctx context.Context, id string, r io.Reader) (SnapshotInfo, error)
	// Host describes what a snapshot of this runtime needs of a host to be
	// restored on it (Node.Host): snapshots restore where Host is equal.
	Host() string
}
