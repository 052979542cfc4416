// Package fake is an in-memory torpor.Runtime for tests of the lifecycle
// engine and the API. It keeps the state machine of a real runtime (boot,
// freeze, thaw, stop, destroy, wait) without running any process; exec
// answers through a function the test sets. Its Host outlives a Runtime
// object, so tests can model a daemon restart.
package fake

import (
	"context"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/torpor-dev/torpor"
)

// Host holds the instances and disks; it plays the role of the machine.
type Host struct {
	mu sync.Mutex
	// volumeHolder is set by SetVolumeHolder (volumes.go).
	volumeHolder func(id string) (string, bool)
	instances    map[string]*instance
	disks        map[string]bool
	fail         map[string]error
	// ExecFunc answers Exec; nil answers exit code 0 with no output.
	ExecFunc func(ctx context.Context, id string, req torpor.ExecRequest) (torpor.ExecResult, error)
	// DialFunc answers DialContext; nil refuses every connection.
	DialFunc func(ctx context.Context, id, network, addr string) (net.Conn, error)
	// BootHook, when set, runs at the start of every Boot.
	BootHook func(ctx context.Context, spec torpor.BootSpec) error
	// FreezeHook, when set, runs at the start of every Freeze (a slow
	// pause, for instance).
	FreezeHook func(ctx context.Context, id string) error
	// FilesDir, when set, holds each sandbox's root filesystem as a
	// directory FilesDir/<id> (see RootFS).
	FilesDir string
	// NoPython makes RunCode answer as for a template without python3.
	NoPython bool
	// SnapshotHost is what the host's runtimes say of it as Host (the
	// snapshots they import must have been made on one that says the
	// same); empty: "fake".
	SnapshotHost string

	boots map[string]int
	cpu   map[string]time.Duration
	usage map[string]torpor.ResourceUsage
	// snapshots holds the instances written to a snapshot, by sandbox id;
	// a nil entry is a snapshot that cannot be restored.
	snapshots map[string]*instance
	// checkpoints holds each sandbox's checkpoint names (checkpoint.go).
	checkpoints map[string]map[string]bool
}

type instance struct {
	state   torpor.InstanceState
	failure *torpor.Failure
	done    chan struct{}
	spec    torpor.BootSpec
	// code: the languages whose toy interpreter has run a snippet.
	code map[string]bool
	// procs: the toy background processes, by id.
	procs map[int]*fakeProc
}

// NewHost returns an empty host.
func NewHost() *Host {
	return &Host{instances: map[string]*instance{}, disks: map[string]bool{}, fail: map[string]error{}, boots: map[string]int{}, cpu: map[string]time.Duration{}, snapshots: map[string]*instance{}}
}

// Runtime is a torpor.Runtime over a Host.
type Runtime struct{ h *Host }

// New returns a runtime object over h. Several may share one host.
func New(h *Host) *Runtime { return &Runtime{h: h} }

// FailNext makes the next call of op ("boot", "freeze", "thaw", "stop",
// "destroy", "exec", "export_disk", "import_disk") fail with err.
func (h *Host) FailNext(op string, err error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.fail[op] = err
}

// Exit ends a sandbox's instance as if its entrypoint exited with failure f.
func (h *Host) Exit(id string, f *torpor.Failure) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if in, ok := h.instances[id]; ok && in.state != torpor.InstanceStopped {
		in.state, in.failure = torpor.InstanceStopped, f
		close(in.done)
	}
}

// Lose removes an instance without a trace, as a host reboot would.
func (h *Host) Lose(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if in, ok := h.instances[id]; ok {
		if in.state != torpor.InstanceStopped {
			close(in.done)
		}
		delete(h.instances, id)
	}
}

// Boots counts how often a sandbox was booted.
func (h *Host) Boots(id string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.boots[id]
}

// State returns the instance state of a sandbox.
func (h *Host) State(id string) torpor.InstanceState {
	h.mu.Lock()
	defer h.mu.Unlock()
	if in, ok := h.instances[id]; ok {
		return in.state
	}
	return torpor.InstanceMissing
}

// HasDisk reports whether a sandbox's disk exists.
func (h *Host) HasDisk(id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.disks[id]
}

// Spec returns the spec a sandbox's instance was last booted with.
func (h *Host) Spec(id string) torpor.BootSpec {
	h.mu.Lock()
	defer h.mu.Unlock()
	if in, ok := h.instances[id]; ok {
		return in.spec
	}
	return torpor.BootSpec{}
}

// checkID refuses an invalid sandbox id before it reaches the host's
// maps, as the real runtimes refuse one before it reaches a path: every
// call that takes a sandbox id answers invalid_argument for it.
func checkID(id string) error {
	if !torpor.ValidID(id) {
		return torpor.Invalid("sandbox_id", "invalid sandbox id %q", id)
	}
	return nil
}

func (h *Host) takeFail(op string) error {
	err := h.fail[op]
	delete(h.fail, op)
	return err
}

// DialContext connects through Host.DialFunc to a running instance.
func (r *Runtime) DialContext(ctx context.Context, ref torpor.InstanceRef, network, addr string) (net.Conn, error) {
	if err := checkID(ref.SandboxID); err != nil {
		return nil, err
	}
	r.h.mu.Lock()
	in, err := r.live(ref.SandboxID)
	if err == nil && in.state == torpor.InstanceFrozen {
		err = torpor.Errorf(torpor.EConflict, "sandbox %s is frozen", ref.SandboxID)
	}
	fn := r.h.DialFunc
	r.h.mu.Unlock()
	if err != nil {
		return nil, err
	}
	if fn == nil {
		return nil, fmt.Errorf("fake: connection to %s refused", addr)
	}
	return fn(ctx, ref.SandboxID, network, addr)
}

// AddCPU adds CPU time used by a sandbox's processes.
func (h *Host) AddCPU(id string, d time.Duration) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.cpu[id] += d
}

// SetResourceUsage sets the memory and disk figures ResourceUsage reports
// for a sandbox (its CPU comes from AddCPU).
func (h *Host) SetResourceUsage(id string, u torpor.ResourceUsage) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.usage == nil {
		h.usage = map[string]torpor.ResourceUsage{}
	}
	h.usage[id] = u
}

// ResourceUsage reports a live instance's CPU time and the figures given
// by SetResourceUsage (none known when never set).
func (r *Runtime) ResourceUsage(ctx context.Context, ref torpor.InstanceRef) (torpor.ResourceUsage, error) {
	if err := checkID(ref.SandboxID); err != nil {
		return torpor.ResourceUsage{}, err
	}
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	if _, err := r.live(ref.SandboxID); err != nil {
		return torpor.ResourceUsage{}, err
	}
	u := r.h.usage[ref.SandboxID]
	cpu := r.h.cpu[ref.SandboxID]
	u.CPU = &cpu
	return u, nil
}

// CPUUsage returns the CPU time a sandbox has used (see AddCPU).
func (r *Runtime) CPUUsage(ctx context.Context, ref torpor.InstanceRef) (time.Duration, error) {
	if err := checkID(ref.SandboxID); err != nil {
		return 0, err
	}
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	if _, err := r.live(ref.SandboxID); err != nil {
		return 0, err
	}
	return r.h.cpu[ref.SandboxID], nil
}

// Kind returns "fake".
func (r *Runtime) Kind() string { return "fake" }

// PauseModes returns freeze, then snapshot.
func (r *Runtime) PauseModes() []torpor.PauseMode {
	return []torpor.PauseMode{torpor.PauseFreeze, torpor.PauseSnapshot}
}

// Snapshot ends the instance and keeps it, to be restored. Snapshotting
// a snapshotted sandbox returns the snapshot, as the vm runtime does.
func (r *Runtime) Snapshot(ctx context.Context, ref torpor.InstanceRef) (torpor.SnapshotInfo, error) {
	if err := checkID(ref.SandboxID); err != nil {
		return torpor.SnapshotInfo{}, err
	}
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	if err := r.h.takeFail("snapshot"); err != nil {
		return torpor.SnapshotInfo{}, err
	}
	if in := r.h.snapshots[ref.SandboxID]; in != nil {
		if _, ok := r.h.instances[ref.SandboxID]; !ok {
			return snapshotInfo(ref.SandboxID, in), nil
		}
	}
	in, err := r.liveFor("snapshot", ref.SandboxID)
	if err != nil {
		return torpor.SnapshotInfo{}, err
	}
	close(in.done)
	delete(r.h.instances, ref.SandboxID)
	in.state = torpor.InstanceRunning
	r.h.snapshots[ref.SandboxID] = in
	return snapshotInfo(ref.SandboxID, in), nil
}

func snapshotInfo(id string, in *instance) torpor.SnapshotInfo {
	return torpor.SnapshotInfo{Path: "fake:" + id + "/snapshot", SizeBytes: in.spec.Resources.MemoryMiB << 19}
}

// handle is the handle of the sandbox's latest boot or restore.
func (h *Host) handle(id string) string { return fmt.Sprintf("fake:%s:%d", id, h.boots[id]) }

// Restore brings a snapshotted instance back. Restoring a sandbox whose
// instance runs (or is frozen) returns its handle, as the vm runtime does.
func (r *Runtime) Restore(ctx context.Context, ref torpor.InstanceRef) (string, error) {
	if err := checkID(ref.SandboxID); err != nil {
		return "", err
	}
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	if err := r.h.takeFail("restore"); err != nil {
		return "", err
	}
	if cur, ok := r.h.instances[ref.SandboxID]; ok && cur.state != torpor.InstanceStopped {
		return r.h.handle(ref.SandboxID), nil
	}
	in, ok := r.h.snapshots[ref.SandboxID]
	if !ok || in == nil {
		return "", &torpor.Error{Code: torpor.EConflict, Reason: torpor.FailureSnapshot,
			Message: fmt.Sprintf("the snapshot of %s cannot be restored", ref.SandboxID)}
	}
	delete(r.h.snapshots, ref.SandboxID)
	in.done = make(chan struct{})
	r.h.instances[ref.SandboxID] = in
	r.h.boots[ref.SandboxID]++ // a new handle
	return r.h.handle(ref.SandboxID), nil
}

// CorruptSnapshot makes the snapshot of id impossible to restore.
func (h *Host) CorruptSnapshot(id string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if _, ok := h.snapshots[id]; ok {
		h.snapshots[id] = nil
	}
}

// HasSnapshot reports whether id has a snapshot.
func (h *Host) HasSnapshot(id string) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	_, ok := h.snapshots[id]
	return ok
}

// Boot starts a fresh instance. It refuses a spec the real runtimes
// refuse (torpor.BootSpec.Validate) before it touches any instance.
func (r *Runtime) Boot(ctx context.Context, spec torpor.BootSpec) (string, error) {
	if err := spec.Validate(); err != nil {
		return "", err
	}
	if hook := r.h.BootHook; hook != nil {
		if err := hook(ctx, spec); err != nil {
			return "", err
		}
	}
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	r.stopLocked(spec.SandboxID)
	r.h.disks[spec.SandboxID] = true
	r.h.boots[spec.SandboxID]++
	if err := r.h.takeFail("boot"); err != nil {
		f := &torpor.Failure{Code: torpor.FailureSetup, Message: err.Error()}
		r.h.instances[spec.SandboxID] = &instance{state: torpor.InstanceStopped, failure: f, done: closed(), spec: spec}
		return "", err
	}
	r.h.instances[spec.SandboxID] = &instance{state: torpor.InstanceRunning, done: make(chan struct{}), spec: spec}
	return r.h.handle(spec.SandboxID), nil
}

func closed() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

func (r *Runtime) live(id string) (*instance, error) {
	in, ok := r.h.instances[id]
	if !ok || in.state == torpor.InstanceStopped {
		return nil, torpor.Errorf(torpor.ENotFound, "sandbox %s has no running instance", id)
	}
	return in, nil
}

// liveFor refuses verb, which needs a live instance, as the real runtimes
// do: not_found when the sandbox has no instance, a conflict when its
// instance has stopped.
func (r *Runtime) liveFor(verb, id string) (*instance, error) {
	in, ok := r.h.instances[id]
	switch {
	case !ok:
		return nil, torpor.Errorf(torpor.ENotFound, "cannot %s: sandbox %s has no instance", verb, id)
	case in.state == torpor.InstanceStopped:
		return nil, &torpor.Error{Code: torpor.EConflict, Reason: "state",
			Message: fmt.Sprintf("cannot %s: the instance of sandbox %s has stopped", verb, id)}
	}
	return in, nil
}

// Freeze marks the instance frozen.
func (r *Runtime) Freeze(ctx context.Context, ref torpor.InstanceRef) error {
	if err := checkID(ref.SandboxID); err != nil {
		return err
	}
	if hook := r.h.FreezeHook; hook != nil {
		if err := hook(ctx, ref.SandboxID); err != nil {
			return err
		}
	}
	return r.setFrozen(ref.SandboxID, "freeze", torpor.InstanceFrozen)
}

// Thaw marks the instance running.
func (r *Runtime) Thaw(ctx context.Context, ref torpor.InstanceRef) error {
	return r.setFrozen(ref.SandboxID, "thaw", torpor.InstanceRunning)
}

func (r *Runtime) setFrozen(id, op string, to torpor.InstanceState) error {
	if err := checkID(id); err != nil {
		return err
	}
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	if err := r.h.takeFail(op); err != nil {
		return err
	}
	in, err := r.liveFor(op, id)
	if err != nil {
		return err
	}
	in.state = to
	return nil
}

// Stop ends the instance; the disk stays.
func (r *Runtime) Stop(ctx context.Context, ref torpor.InstanceRef) error {
	if err := checkID(ref.SandboxID); err != nil {
		return err
	}
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	if err := r.h.takeFail("stop"); err != nil {
		return err
	}
	r.stopLocked(ref.SandboxID)
	return nil
}

func (r *Runtime) stopLocked(id string) {
	delete(r.h.snapshots, id)
	if in, ok := r.h.instances[id]; ok {
		if in.state != torpor.InstanceStopped {
			close(in.done)
		}
		delete(r.h.instances, id)
	}
}

// Destroy ends the instance and removes the disk.
func (r *Runtime) Destroy(ctx context.Context, ref torpor.InstanceRef) error {
	if err := checkID(ref.SandboxID); err != nil {
		return err
	}
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	if err := r.h.takeFail("destroy"); err != nil {
		return err
	}
	r.stopLocked(ref.SandboxID)
	delete(r.h.disks, ref.SandboxID)
	return nil
}

// Inspect reports the instance's state.
func (r *Runtime) Inspect(ctx context.Context, ref torpor.InstanceRef) (torpor.InstanceStatus, error) {
	if err := checkID(ref.SandboxID); err != nil {
		return torpor.InstanceStatus{}, err
	}
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	return r.statusLocked(ref.SandboxID), nil
}

func (r *Runtime) statusLocked(id string) torpor.InstanceStatus {
	st := torpor.InstanceStatus{State: torpor.InstanceMissing, DiskExists: r.h.disks[id]}
	if in, ok := r.h.instances[id]; ok {
		st.State, st.Failure = in.state, in.failure
	}
	return st
}

// Wait blocks until the instance stops.
func (r *Runtime) Wait(ctx context.Context, ref torpor.InstanceRef) (torpor.InstanceStatus, error) {
	if err := checkID(ref.SandboxID); err != nil {
		return torpor.InstanceStatus{}, err
	}
	r.h.mu.Lock()
	in, ok := r.h.instances[ref.SandboxID]
	var done chan struct{}
	if ok {
		done = in.done // a restore replaces it, under the lock
	}
	r.h.mu.Unlock()
	if !ok {
		return torpor.InstanceStatus{State: torpor.InstanceMissing}, nil
	}
	select {
	case <-ctx.Done():
		return torpor.InstanceStatus{}, ctx.Err()
	case <-done:
	}
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	st := r.statusLocked(ref.SandboxID)
	if st.State != torpor.InstanceStopped {
		st.State, st.Failure = torpor.InstanceMissing, nil
	}
	if in.failure != nil {
		st.State, st.Failure = torpor.InstanceStopped, in.failure
	}
	return st, nil
}

// Exec answers through Host.ExecFunc.
func (r *Runtime) Exec(ctx context.Context, ref torpor.InstanceRef, req torpor.ExecRequest) (torpor.ExecResult, error) {
	if err := checkID(ref.SandboxID); err != nil {
		return torpor.ExecResult{}, err
	}
	r.h.mu.Lock()
	if err := r.h.takeFail("exec"); err != nil {
		r.h.mu.Unlock()
		return torpor.ExecResult{}, err
	}
	in, err := r.liveFor("exec", ref.SandboxID)
	if err == nil && in.state == torpor.InstanceFrozen {
		err = torpor.Errorf(torpor.EConflict, "sandbox %s is frozen", ref.SandboxID)
	}
	fn := r.h.ExecFunc
	r.h.mu.Unlock()
	if err != nil {
		return torpor.ExecResult{}, err
	}
	if fn == nil {
		return torpor.ExecResult{}, nil
	}
	return fn(ctx, ref.SandboxID, req)
}

// List returns every sandbox with an instance or a disk.
func (r *Runtime) List(ctx context.Context) ([]string, error) {
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	seen := map[string]bool{}
	var ids []string
	for id := range r.h.instances {
		seen[id] = true
		ids = append(ids, id)
	}
	for id := range r.h.disks {
		if !seen[id] {
			ids = append(ids, id)
		}
	}
	return ids, nil
}

var _ torpor.Runtime = (*Runtime)(nil)
