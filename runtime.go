package torpor

import (
	"context"
	"io"
	"net"
	"net/netip"
	"strings"
	"time"
)

// Runtime runs sandbox instances: it boots them on a per-sandbox disk made
// from a template, freezes and thaws them, stops them (disk kept) and
// destroys them (disk gone). Every method is idempotent and safe to call
// again after a daemon crash, and addresses an instance by sandbox id plus
// the opaque handle that Boot returned and the store kept.
//
// Extras such as snapshots are optional interfaces checked at run time.
type Runtime interface {
	// Kind names the runtime, e.g. "runc".
	Kind() string
	// PauseModes lists the pause kinds the runtime supports.
	PauseModes() []PauseMode
	// Boot starts a fresh instance on the sandbox's disk (creating the disk
	// on first boot), runs the setup commands and starts the entrypoint or
	// the idle init. A leftover instance of the same sandbox is removed
	// first. A failed setup returns an *Error with Reason FailureSetup.
	Boot(ctx context.Context, spec BootSpec) (handle string, err error)
	// Freeze stops every process of the instance, keeping its memory.
	Freeze(ctx context.Context, ref InstanceRef) error
	// Thaw continues a frozen instance exactly where it stopped.
	Thaw(ctx context.Context, ref InstanceRef) error
	// Stop ends the instance's processes and keeps its disk.
	Stop(ctx context.Context, ref InstanceRef) error
	// Destroy ends the instance and removes its disk and any snapshot.
	Destroy(ctx context.Context, ref InstanceRef) error
	// Inspect tells the state of the instance.
	Inspect(ctx context.Context, ref InstanceRef) (InstanceStatus, error)
	// Wait blocks until the instance stops (or ctx ends) and says why it
	// stopped.
	Wait(ctx context.Context, ref InstanceRef) (InstanceStatus, error)
	// Exec runs a command inside a running instance.
	Exec(ctx context.Context, ref InstanceRef, req ExecRequest) (ExecResult, error)
	// List returns the ids of every sandbox the runtime holds anything for
	// (an instance, a disk, a mount), so that leftovers can be cleaned.
	List(ctx context.Context) ([]string, error)
}

// InstanceRef addresses a sandbox's instance in a runtime.
type InstanceRef struct {
	SandboxID string
	Handle    string
}

// BootSpec is what a runtime needs to boot an instance.
type BootSpec struct {
	SandboxID string
	Template  Template
	Resources Resources
	Env       map[string]string
	Hostname  string
	// Setup and Entrypoint: see RuntimeConfig.
	Setup      []string
	Entrypoint []string
	// AllowInternet lets the instance reach addresses outside the host's
	// sandbox network; otherwise only the proxy and hooks reach it.
	AllowInternet bool
	// Network holds the sandbox's egress rules; only an EgressEnforcer
	// runtime is given any.
	Network *NetworkRules
	// Volumes are the tenant's volumes bound into the instance; only a
	// VolumeHost runtime is given any.
	Volumes []VolumeBind
}

// EgressEnforcer is a Runtime that enforces a sandbox's egress rules
// (docs/egress.md) in the kernel.
type EgressEnforcer interface {
	// SetEgress replaces the rules of a booted instance (running or
	// frozen) in place; nil removes them.
	SetEgress(ctx context.Context, ref InstanceRef, rules *NetworkRules) error
}

// InstanceState is what a runtime sees of an instance.
type InstanceState string

const (
	InstanceRunning InstanceState = "running"
	InstanceFrozen  InstanceState = "frozen"
	// InstanceStopped: the instance exited; Failure says how.
	InstanceStopped InstanceState = "stopped"
	// InstanceMissing: no instance at all (never booted, stopped and
	// removed, or lost with the host).
	InstanceMissing InstanceState = "missing"
)

// InstanceStatus is the answer of Inspect and Wait.
type InstanceStatus struct {
	State InstanceState
	// Failure says why a stopped instance stopped, when the runtime knows.
	Failure *Failure
	// DiskExists reports whether the sandbox's disk is there.
	DiskExists bool
}

// ExecRequest is a command to run inside a sandbox.
type ExecRequest struct {
	Cmd []string
	Env map[string]string
	Cwd string
	// User runs the command as a user of the sandbox: a name from its
	// /etc/passwd, or uid[:gid]. Empty: root.
	User    string
	Stdin   io.Reader
	Stdout  io.Writer
	Stderr  io.Writer
	Timeout time.Duration
}

// ExecResult is how a command ended.
type ExecResult struct {
	ExitCode int  `json:"exit_code"`
	TimedOut bool `json:"timed_out"`
}

// FileRoot is an optional Runtime capability: the sandbox's root
// filesystem as a directory on the host, so that the daemon can read and
// write its files without running anything inside it (and read those of a
// frozen sandbox without thawing it). Every path below it must be resolved
// confined to it (openat2 RESOLVE_IN_ROOT): processes inside the sandbox
// control what it contains.
type FileRoot interface {
	// RootFS returns the host path of the sandbox's mounted root
	// filesystem. A sandbox whose root is not mounted (hibernated, failed)
	// is a conflict.
	RootFS(ctx context.Context, ref InstanceRef) (string, error)
}

// CPUReporter is an optional Runtime capability: how much CPU time a
// sandbox's processes have used since it booted. The idle engine uses it,
// when configured, to count a busy sandbox as active.
type CPUReporter interface {
	CPUUsage(ctx context.Context, ref InstanceRef) (time.Duration, error)
}

// Dialer is an optional Runtime capability: a connection to an address
// inside the sandbox's own network (its loopback included), for HTTP hooks
// and the port proxy.
type Dialer interface {
	DialContext(ctx context.Context, ref InstanceRef, network, addr string) (net.Conn, error)
}

// Validate checks what every runtime needs of a boot spec: a valid id, a
// host name, environment, setup and entrypoint without NUL bytes, and
// resources that are not negative. A runtime checks its own limits (and
// the template's files) on top.
func (s BootSpec) Validate() error {
	if !ValidID(s.SandboxID) {
		return Invalid("sandbox_id", "invalid sandbox id %q", s.SandboxID)
	}
	if s.Hostname != "" && !validHostname(s.Hostname) {
		return Invalid("hostname", "invalid host name %q", s.Hostname)
	}
	if err := CheckEnv("env", s.Env); err != nil {
		return err
	}
	for _, c := range s.Setup {
		if strings.ContainsRune(c, 0) {
			return Invalid("setup", "a setup command holds a NUL byte")
		}
	}
	for i, a := range s.Entrypoint {
		if strings.ContainsRune(a, 0) || (i == 0 && a == "") {
			return Invalid("entrypoint", "invalid entrypoint argument %d", i)
		}
	}
	res := s.Resources
	if res.VCPUs < 0 || res.MemoryMiB < 0 || res.Pids < 0 || res.DiskMiB < 0 {
		return Invalid("resources", "resources cannot be negative")
	}
	if res.MemoryMiB > 0 && res.MemoryMiB < 8 {
		return Invalid("resources.memory_mib", "a sandbox needs at least 8 MiB of memory")
	}
	return nil
}

// CheckEnv is the runtimes' own check of environment variables (an exec's
// or a boot's): names without '=' or NUL, values without NUL. The API's
// stricter rules are ValidateEnv.
func CheckEnv(param string, env map[string]string) error {
	for k, v := range env {
		if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) {
			return Invalid(param, "invalid environment variable %q", k)
		}
	}
	return nil
}

func validHostname(h string) bool {
	if len(h) > 63 {
		return false
	}
	for i := 0; i < len(h); i++ {
		c := h[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' ||
			(c == '-' || c == '.' || c == '_') && i > 0
		if !ok {
			return false
		}
	}
	return true
}

// Snapshotter is an optional Runtime capability: a pause that writes the
// whole instance (memory, CPU and device state) to disk and ends its
// process, so that a paused sandbox holds no CPU and no memory.
type Snapshotter interface {
	// Snapshot writes the running (or frozen) instance to disk and ends
	// it. Afterwards Inspect reports InstanceMissing with DiskExists.
	Snapshot(ctx context.Context, ref InstanceRef) (SnapshotInfo, error)
	// Restore continues a snapshotted instance exactly where it stopped
	// and returns its new handle. A snapshot that cannot be restored
	// (missing, corrupt, made by another version) is an *Error with
	// Reason FailureSnapshot; the disk is kept so Boot can start afresh.
	Restore(ctx context.Context, ref InstanceRef) (handle string, err error)
}

// SnapshotInfo says where a snapshot is kept and how big it is.
type SnapshotInfo struct {
	Path      string `json:"path"`
	SizeBytes int64  `json:"size_bytes"`
}

// Isolation kinds a sandbox may ask for ("isolation" in a create request).
const (
	IsolationContainer = "container"
	IsolationVM        = "vm"
)

// RuntimeInfo describes a runtime this node can run (GET /v1/runtimes).
type RuntimeInfo struct {
	Kind       string      `json:"kind"`
	Isolation  string      `json:"isolation"`
	PauseModes []PauseMode `json:"pause_modes"`
	// Default marks the runtime a request that names none gets.
	Default bool `json:"default"`
	// Details are what the runtime says of itself: its acceleration (kvm
	// or tcg), versions.
	Details map[string]string `json:"details,omitempty"`
}

// Describer is an optional Runtime capability: its isolation and details
// for GET /v1/runtimes. A runtime without it is a container runtime.
type Describer interface {
	Describe() RuntimeInfo
}

// Addresser is an optional Runtime capability: the IPv4 address a sandbox
// has on the host's sandbox network, which the host (and nothing else)
// reaches directly. ok is false when the sandbox has none: the runtime
// has no sandbox network, or the sandbox never booted with one.
type Addresser interface {
	Address(ctx context.Context, ref InstanceRef) (addr netip.Addr, ok bool)
	// Networked reports whether the runtime puts sandboxes on the sandbox
	// network at all (and so can let one reach the internet).
	Networked() bool
}

// UsageReporter is an optional Runtime capability: the memory and disk a
// sandbox's instance uses now, for metrics. A runtime tells what it can
// measure and leaves the rest unknown; it never guesses.
type UsageReporter interface {
	ResourceUsage(ctx context.Context, ref InstanceRef) (ResourceUsage, error)
}

// ResourceUsage is what a sandbox's instance uses at a moment. A nil
// figure is one that is not known.
type ResourceUsage struct {
	// CPU is the CPU time its processes used since it booted
	// (CPUReporter).
	CPU *time.Duration
	// MemoryBytes is the memory charged to it (for a container: its
	// cgroup's, page cache included); MemoryCacheBytes the page cache in
	// it.
	MemoryBytes      *int64
	MemoryCacheBytes *int64
	// DiskBytes is the space its own writable disk takes (the template's
	// shared layers not counted).
	DiskBytes *int64
}
