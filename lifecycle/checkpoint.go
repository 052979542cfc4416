package lifecycle

import (
	"context"
	"fmt"
	"maps"
	"time"

	"github.com/torpor-dev/torpor"
)

// Checkpoints, fork and restore (docs/fork.md). A checkpoint is a named
// copy of a sandbox's disk that its runtime keeps (torpor.Checkpointer),
// recorded in the sandbox's record; a fork makes new sandboxes that boot
// on copies of one; a restore puts one back as the sandbox's disk.
//
// Crash safety. A checkpoint is stored as creating before its copy is
// made and ready after; a reconcile removes a creating one's copy and
// entry. A delete drops the entry first and the copy after; a copy no
// record names is removed by the reconcile (reconcileCheckpoints). A fork
// stores its forks' ids in its parent's record (Forking) before it makes
// any; the forks stand once that is cleared (the fork's commit), and a
// reconcile removes the forks of a fork that was not. A restore stores
// the checkpoint's name (RestoringCheckpoint) before the disk is replaced;
// a reconcile replaces it again and boots the sandbox as it was.

// Events of checkpoints, forks and restores.
const (
	EventCheckpointed       = "sandbox.checkpointed"
	EventCheckpointDeleted  = "sandbox.checkpoint_deleted"
	EventForked             = "sandbox.forked"
	EventCheckpointRestored = "sandbox.restored"
	// CauseFork: a sandbox made (or removed) by a fork.
	CauseFork = "fork"
)

// checkpointer returns sb's runtime as a Checkpointer, or a 400 that says
// its runtime has none (microVMs, for now).
func (e *Engine) checkpointer(sb *torpor.Sandbox) (torpor.Runtime, torpor.Checkpointer, error) {
	rt, err := e.runtime(sb.Runtime.Kind)
	if err != nil {
		return nil, nil, err
	}
	cp, ok := rt.(torpor.Checkpointer)
	if !ok {
		return nil, nil, torpor.Invalid("runtime", "sandboxes of the %s runtime cannot be checkpointed or forked yet (docs/fork.md)", rt.Kind())
	}
	return rt, cp, nil
}

func findCheckpoint(sb *torpor.Sandbox, name string) int {
	for i, c := range sb.Checkpoints {
		if c.Name == name {
			return i
		}
	}
	return -1
}

// readyCheckpoint returns sb's ready checkpoint name, or not_found.
func readyCheckpoint(sb *torpor.Sandbox, name string) (torpor.CheckpointInfo, error) {
	if i := findCheckpoint(sb, name); i >= 0 && sb.Checkpoints[i].State == torpor.CheckpointReady {
		return sb.Checkpoints[i], nil
	}
	return torpor.CheckpointInfo{}, torpor.Errorf(torpor.ENotFound, "sandbox %s has no checkpoint %q", sb.ID, name)
}

// checkpointable refuses states whose disk cannot be copied now.
func checkpointable(sb *torpor.Sandbox, verb string) error {
	switch sb.State {
	case torpor.StateRunning, torpor.StatePaused, torpor.StateHibernated:
		return nil
	case torpor.StateTerminated:
		return gone(sb)
	case torpor.StateArchived:
		return &torpor.Error{Code: torpor.EConflict, State: sb.State, Reason: "state",
			Message: fmt.Sprintf("sandbox %s is archived: start it first to %s it", sb.ID, verb)}
	}
	return torpor.WrongState(verb, sb.State)
}

// CreateCheckpoint saves checkpoint name of a running, paused or
// hibernated sandbox, which goes on as it was. A name taken is a
// conflict.
func (e *Engine) CreateCheckpoint(ctx context.Context, tenant, id, name string) (torpor.CheckpointInfo, error) {
	var info torpor.CheckpointInfo
	if !torpor.ValidCheckpointName(name) {
		return info, torpor.Invalid("name", "a checkpoint name is 1 to 63 letters, digits, '.', '_' or '-', not starting with '.' or '-'")
	}
	_, err := e.withSandbox(ctx, tenant, id, func(sb *torpor.Sandbox) error {
		_, cp, err := e.checkpointer(sb)
		if err != nil {
			return err
		}
		if err := checkpointable(sb, "checkpoint"); err != nil {
			return err
		}
		if findCheckpoint(sb, name) >= 0 {
			return torpor.Errorf(torpor.EConflict, "sandbox %s has a checkpoint %q already", sb.ID, name)
		}
		if len(sb.Checkpoints) >= torpor.MaxCheckpoints {
			return torpor.Errorf(torpor.EConflict, "sandbox %s has %d checkpoints, the most it may keep: delete one first", sb.ID, len(sb.Checkpoints))
		}
		info, err = e.checkpoint(ctx, cp, sb, name)
		return err
	})
	return info, err
}

// checkpoint makes checkpoint name of sb: stored creating, copied,
// stored ready.
func (e *Engine) checkpoint(ctx context.Context, cp torpor.Checkpointer, sb *torpor.Sandbox, name string) (torpor.CheckpointInfo, error) {
	entry := torpor.CheckpointInfo{Name: name, State: torpor.CheckpointCreating, CreatedAt: e.now(), Kind: torpor.CheckpointDisk}
	sb.Checkpoints = append(sb.Checkpoints, entry)
	e.fail("checkpointing.before-store")
	if err := e.save(ctx, sb); err != nil {
		sb.Checkpoints = sb.Checkpoints[:len(sb.Checkpoints)-1]
		return entry, err
	}
	e.fail("checkpointing.after-store")
	start := time.Now()
	got, err := cp.Checkpoint(ctx, ref(sb), name)
	if err != nil {
		_ = cp.DeleteCheckpoint(context.WithoutCancel(ctx), sb.ID, name)
		sb.Checkpoints = dropCheckpoint(sb.Checkpoints, name)
		if serr := e.save(ctx, sb); serr != nil {
			e.log.Error("recording a failed checkpoint", "sandbox", sb.ID, "err", serr)
		}
		return entry, fmt.Errorf("checkpoint %s: %w", sb.ID, err)
	}
	e.fail("checkpointing.after-copy")
	i := findCheckpoint(sb, name)
	sb.Checkpoints[i].State, sb.Checkpoints[i].SizeBytes, sb.Checkpoints[i].Method = torpor.CheckpointReady, got.SizeBytes, got.Method
	if got.Kind != "" {
		sb.Checkpoints[i].Kind = got.Kind
	}
	if err := e.save(ctx, sb, e.event(sb, EventCheckpointed, "checkpoint", name, "method", got.Method, "bytes", itoa(got.SizeBytes))); err != nil {
		return entry, err
	}
	e.log.Info("sandbox checkpointed", "sandbox", sb.ID, "checkpoint", name, "method", got.Method, "took", time.Since(start))
	return sb.Checkpoints[i], nil
}

func dropCheckpoint(cs []torpor.CheckpointInfo, name string) []torpor.CheckpointInfo {
	out := cs[:0:0]
	for _, c := range cs {
		if c.Name != name {
			out = append(out, c)
		}
	}
	return out
}

// Checkpoints lists a sandbox's checkpoints.
func (e *Engine) Checkpoints(ctx context.Context, tenant, id string) ([]torpor.CheckpointInfo, error) {
	sb, err := e.Get(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	out := []torpor.CheckpointInfo{}
	for _, c := range sb.Checkpoints {
		if c.State == torpor.CheckpointReady {
			out = append(out, c)
		}
	}
	return out, nil
}

// GetCheckpoint returns one of a sandbox's checkpoints.
func (e *Engine) GetCheckpoint(ctx context.Context, tenant, id, name string) (torpor.CheckpointInfo, error) {
	sb, err := e.Get(ctx, tenant, id)
	if err != nil {
		return torpor.CheckpointInfo{}, err
	}
	return readyCheckpoint(sb, name)
}

// DeleteCheckpoint removes a sandbox's checkpoint: the entry first, then
// the copy (a reconcile removes a copy no record names).
func (e *Engine) DeleteCheckpoint(ctx context.Context, tenant, id, name string) error {
	_, err := e.withSandbox(ctx, tenant, id, func(sb *torpor.Sandbox) error {
		if sb.State == torpor.StateTerminated {
			return gone(sb)
		}
		if _, err := readyCheckpoint(sb, name); err != nil {
			return err
		}
		if sb.Forking != nil || sb.RestoringCheckpoint == name {
			return torpor.Errorf(torpor.EConflict, "checkpoint %q of sandbox %s is in use", name, sb.ID)
		}
		_, cp, err := e.checkpointer(sb)
		if err != nil {
			return err
		}
		sb.Checkpoints = dropCheckpoint(sb.Checkpoints, name)
		if err := e.save(ctx, sb, e.event(sb, EventCheckpointDeleted, "checkpoint", name)); err != nil {
			return err
		}
		e.fail("checkpoint-delete.after-store")
		if err := cp.DeleteCheckpoint(ctx, sb.ID, name); err != nil {
			e.log.Warn("removing a checkpoint's copy", "sandbox", sb.ID, "checkpoint", name, "err", err)
		}
		return nil
	})
	return err
}

// dropCheckpoints removes every checkpoint of sb (its end).
func (e *Engine) dropCheckpoints(ctx context.Context, rt torpor.Runtime, sb *torpor.Sandbox) {
	cp, ok := rt.(torpor.Checkpointer)
	if !ok {
		return
	}
	for _, c := range sb.Checkpoints {
		if err := cp.DeleteCheckpoint(context.WithoutCancel(ctx), sb.ID, c.Name); err != nil {
			e.log.Warn("removing a checkpoint of a deleted sandbox", "sandbox", sb.ID, "checkpoint", c.Name, "err", err)
		}
	}
	if sb.Forking != nil && sb.Forking.TempCheckpoint != "" {
		_ = cp.DeleteCheckpoint(context.WithoutCancel(ctx), sb.ID, sb.Forking.TempCheckpoint)
	}
	sb.Checkpoints = nil
}

// Restore brings a sandbox back to its checkpoint name: its disk is
// replaced by the checkpoint's copy. A running sandbox is booted again on
// it; a paused one ends up hibernated (its processes are gone with the
// disk they ran on); a hibernated one stays hibernated.
func (e *Engine) Restore(ctx context.Context, tenant, id, name string) (*torpor.Sandbox, error) {
	if !torpor.ValidCheckpointName(name) {
		return nil, torpor.Invalid("checkpoint", "invalid checkpoint name %q", name)
	}
	return e.withSandbox(ctx, tenant, id, func(sb *torpor.Sandbox) error {
		rt, cp, err := e.checkpointer(sb)
		if err != nil {
			return err
		}
		if err := checkpointable(sb, "restore"); err != nil {
			return err
		}
		if _, err := readyCheckpoint(sb, name); err != nil {
			return err
		}
		if sb.State == torpor.StateRunning {
			// Operations in flight end first, as for a restart.
			end, err := e.drain(ctx, sb, "restore")
			if err != nil {
				return err
			}
			defer end()
		}
		return e.restoreCheckpoint(ctx, rt, cp, sb, name, CauseAPI)
	})
}

func (e *Engine) restoreCheckpoint(ctx context.Context, rt torpor.Runtime, cp torpor.Checkpointer, sb *torpor.Sandbox, name, cause string) error {
	wasRunning := sb.State == torpor.StateRunning || sb.State == torpor.StateRestarting
	sb.RestoringCheckpoint = name
	e.fail("restoring-checkpoint.before-store")
	if err := e.save(ctx, sb); err != nil {
		sb.RestoringCheckpoint = ""
		return err
	}
	e.fail("restoring-checkpoint.after-store")
	if sb.State == torpor.StateRunning || sb.State == torpor.StatePaused {
		// Its processes go: they ran on the disk being replaced.
		e.unwatch(sb.ID)
		if err := e.stopRuntime(ctx, rt, sb); err != nil {
			return err
		}
		if sb.State == torpor.StatePaused {
			sb.Handle, sb.PauseMode = "", ""
			if err := e.setState(ctx, sb, torpor.StateHibernated, e.event(sb, torpor.EventHibernated, "cause", cause, "reason", "restoring checkpoint "+name)); err != nil {
				return err
			}
		}
	}
	if err := cp.RestoreCheckpoint(ctx, ref(sb), name); err != nil {
		return fmt.Errorf("restore %s to checkpoint %s: %w", sb.ID, name, err)
	}
	e.fail("restoring-checkpoint.after-copy")
	sb.RestoringCheckpoint = ""
	if wasRunning {
		// Stored with the restart's first state (coldStart).
		if err := e.save(ctx, sb, e.event(sb, EventCheckpointRestored, "checkpoint", name, "cause", cause)); err != nil {
			return err
		}
		return e.coldStart(ctx, sb, torpor.StateRestarting, torpor.EventRestarted, cause)
	}
	return e.save(ctx, sb, e.event(sb, EventCheckpointRestored, "checkpoint", name, "cause", cause))
}

// Fork makes req.Count new sandboxes from a sandbox's checkpoint, or, with
// none named, from its disk as it is now (a running parent's is copied
// frozen; a paused or hibernated one is not woken). Each boots on its own
// copy; processes are not carried. All or nothing: capacity for every
// fork is reserved first, and a failure part way removes the forks made.
func (e *Engine) Fork(ctx context.Context, tenant, id string, req torpor.ForkRequest) (*torpor.ForkResult, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	unlock := e.locks.Lock(id)
	defer unlock()
	parent, err := e.load(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	if err := e.own(ctx, parent); err != nil {
		return nil, err
	}
	rt, cp, err := e.checkpointer(parent)
	if err != nil {
		return nil, err
	}
	if err := checkpointable(parent, "fork"); err != nil {
		return nil, err
	}
	if parent.Pool != "" || parent.Forking != nil || parent.ForkOp != "" {
		return nil, torpor.Errorf(torpor.EConflict, "sandbox %s cannot be forked now", parent.ID)
	}
	if req.Checkpoint != "" {
		if _, err := readyCheckpoint(parent, req.Checkpoint); err != nil {
			return nil, err
		}
	}
	tmpl, err := e.store.GetTemplate(ctx, parent.Template)
	if err != nil {
		return nil, fmt.Errorf("template %s of sandbox %s: %w", parent.Template, parent.ID, err)
	}
	if err := e.leaseErr(); err != nil {
		return nil, err
	}
	// Every fork's capacity first: one that does not fit refuses them all.
	kids := make([]*torpor.Sandbox, req.Count)
	for i := range kids {
		kids[i] = e.forkRecord(parent, req)
		if req.Policy != nil {
			if err := applyPolicy(kids[i], *req.Policy, kids[i].CreatedAt); err != nil {
				return nil, err
			}
		}
	}
	for i, k := range kids {
		if err := e.reserve(ctx, k, torpor.StateStarting); err != nil {
			for _, done := range kids[:i] {
				e.hold(done, torpor.StateTerminated)
			}
			return nil, err
		}
	}
	op := &torpor.ForkOp{ID: torpor.NewID("", 10)}
	for _, k := range kids {
		op.Children = append(op.Children, k.ID)
		k.ForkOp = op.ID
	}
	name := req.Checkpoint
	if name == "" {
		name = "fork-" + op.ID
		op.TempCheckpoint = name
	}
	parent.Forking = op
	e.fail("forking.before-store")
	if err := e.save(ctx, parent); err != nil {
		parent.Forking = nil
		for _, k := range kids {
			e.hold(k, torpor.StateTerminated)
		}
		return nil, err
	}
	e.fail("forking.after-store")
	unlocks := map[string]func(){}
	made, err := e.forkChildren(ctx, rt, cp, parent, kids, name, *tmpl, unlocks)
	if err != nil {
		e.undoFork(ctx, cp, parent, made, kids, unlocks)
		return nil, err
	}
	e.fail("forking.before-commit")
	parent.Forking = nil
	if err := e.save(ctx, parent, e.event(parent, EventForked, "count", itoa(int64(req.Count)), "checkpoint", req.Checkpoint)); err != nil {
		e.undoFork(ctx, cp, parent, made, kids, unlocks)
		return nil, err
	}
	e.fail("forking.after-commit")
	if op.TempCheckpoint != "" {
		_ = cp.DeleteCheckpoint(context.WithoutCancel(ctx), parent.ID, op.TempCheckpoint)
	}
	res := &torpor.ForkResult{Checkpoint: req.Checkpoint, ProcessesCarried: false,
		Note: "each fork booted afresh on its own copy of the disk: the parent's processes are not carried"}
	for _, k := range kids {
		k.ForkOp = ""
		if err := e.save(ctx, k); err != nil {
			// The fork stands (its parent's record says so); a reconcile
			// clears the mark.
			e.log.Warn("clearing a fork's mark", "sandbox", k.ID, "err", err)
		}
		unlocks[k.ID]()
		res.Sandboxes = append(res.Sandboxes, e.view(k))
	}
	return res, nil
}

// forkRecord returns a new sandbox record of parent's configuration.
func (e *Engine) forkRecord(parent *torpor.Sandbox, req torpor.ForkRequest) *torpor.Sandbox {
	checkpoint := req.Checkpoint
	now := e.now()
	k := &torpor.Sandbox{
		ID:               torpor.NewID("", 20),
		Tenant:           parent.Tenant,
		Template:         parent.Template,
		State:            torpor.StateStarting,
		StateSince:       now,
		CreatedAt:        now,
		LastActivityAt:   now,
		Resources:        parent.Resources,
		Metadata:         maps.Clone(parent.Metadata),
		Env:              maps.Clone(parent.Env),
		Runtime:          parent.Runtime,
		PauseModes:       append([]torpor.PauseMode(nil), parent.PauseModes...),
		Hooks:            parent.Hooks,
		IgnoreImageHooks: parent.IgnoreImageHooks,
		Ports:            parent.Ports,
		TrafficToken:     torpor.NewID("tt_", 32),
		AllowInternet:    parent.AllowInternet,
		Usage:            torpor.UsageState{Kind: torpor.UsageRunning, Since: now, SeenAt: now},
		Node:             e.node,
		NodeEpoch:        e.Epoch(),
		Durability:       torpor.DurabilityNode,
		Timeout:          parent.Timeout,
		Lifecycle:        parent.Lifecycle,
		LifecyclePolicy:  parent.LifecyclePolicy,
		Network:          parent.Network.Clone(),
		Secrets:          append([]torpor.SecretRef(nil), parent.Secrets...),
		KeyID:            parent.KeyID,
		NodeLabels:       parent.NodeLabels,
	}
	c := parent.Clone()
	k.Runtime, k.Lifecycle, k.Hooks, k.Ports = c.Runtime, c.Lifecycle, c.Hooks, c.Ports
	if k.Metadata == nil {
		k.Metadata = map[string]string{}
	}
	maps.Copy(k.Metadata, req.Metadata)
	if len(req.Env) > 0 {
		if k.Env == nil {
			k.Env = map[string]string{}
		}
		maps.Copy(k.Env, req.Env)
	}
	k.Metadata[torpor.MetaForkedFrom] = parent.ID
	delete(k.Metadata, torpor.MetaForkedFromCheckpoint)
	if checkpoint != "" {
		k.Metadata[torpor.MetaForkedFromCheckpoint] = checkpoint
	}
	return k
}

// forkChildren copies the parent's disk (unless a checkpoint is named)
// and makes and boots each fork, holding each fork's lock (released by
// the caller). It returns the forks stored so far.
func (e *Engine) forkChildren(ctx context.Context, rt torpor.Runtime, cp torpor.Checkpointer, parent *torpor.Sandbox, kids []*torpor.Sandbox, name string, tmpl torpor.Template, unlocks map[string]func()) ([]*torpor.Sandbox, error) {
	if parent.Forking.TempCheckpoint != "" {
		if _, err := cp.Checkpoint(ctx, ref(parent), name); err != nil {
			return nil, fmt.Errorf("copy the disk of %s: %w", parent.ID, err)
		}
		e.fail("forking.after-checkpoint")
	}
	var made []*torpor.Sandbox
	for _, k := range kids {
		unlock := e.locks.Lock(k.ID)
		created := e.event(k, torpor.EventCreated, "cause", CauseFork, "forked_from", parent.ID)
		created.Time = k.CreatedAt
		if err := e.store.CreateSandbox(ctx, k, created); err != nil {
			unlock()
			return made, err
		}
		unlocks[k.ID] = unlock
		made = append(made, k)
		e.announce()
		e.noteState(k)
		if err := cp.CloneCheckpoint(ctx, parent.ID, name, k.ID); err != nil {
			return made, fmt.Errorf("copy the disk of fork %s: %w", k.ID, err)
		}
		e.fail("forking.after-clone")
		if err := e.boot(ctx, k, rt, tmpl, torpor.EventStarted, CauseFork); err != nil {
			return made, fmt.Errorf("boot fork %s: %w", k.ID, err)
		}
		if k.State != torpor.StateRunning {
			return made, torpor.Errorf(torpor.EConflict, "fork %s did not start: it is %s", k.ID, k.State)
		}
	}
	return made, nil
}

// undoFork removes the forks a fork made and clears its mark on the
// parent; the caller holds every fork's lock (made) and the parent's.
func (e *Engine) undoFork(ctx context.Context, cp torpor.Checkpointer, parent *torpor.Sandbox, made, kids []*torpor.Sandbox, unlocks map[string]func()) {
	ctx = context.WithoutCancel(ctx)
	stored := map[string]bool{}
	for _, k := range made {
		stored[k.ID] = true
		if err := e.terminate(ctx, k, CauseFork); err != nil {
			e.log.Error("removing a fork cut short", "sandbox", k.ID, "err", err)
		}
		unlocks[k.ID]()
	}
	for _, k := range kids {
		if !stored[k.ID] {
			e.hold(k, torpor.StateTerminated)
		}
	}
	if op := parent.Forking; op != nil && op.TempCheckpoint != "" {
		_ = cp.DeleteCheckpoint(ctx, parent.ID, op.TempCheckpoint)
	}
	parent.Forking = nil
	if err := e.save(ctx, parent); err != nil {
		e.log.Error("clearing a fork cut short", "sandbox", parent.ID, "err", err)
	}
}

// reconcileCheckpoints puts right, after a restart, what a checkpoint,
// fork or restore of sb cut short left (sb's lock held): a creating
// checkpoint goes; a fork not committed has its forks removed; a fork of
// one committed keeps standing; a restore is done again.
func (e *Engine) reconcileCheckpoints(ctx context.Context, rt torpor.Runtime, sb *torpor.Sandbox) error {
	cp, ok := rt.(torpor.Checkpointer)
	if !ok {
		return nil
	}
	changed := false
	for _, c := range sb.Checkpoints {
		if c.State != torpor.CheckpointReady {
			_ = cp.DeleteCheckpoint(ctx, sb.ID, c.Name)
			sb.Checkpoints = dropCheckpoint(sb.Checkpoints, c.Name)
			changed = true
		}
	}
	if sb.ForkOp != "" {
		parentID := sb.Metadata[torpor.MetaForkedFrom]
		if p, err := e.store.GetSandbox(ctx, parentID); err == nil && p.Forking != nil && p.Forking.ID == sb.ForkOp {
			// Its fork never stood.
			sb.ForkOp = ""
			return e.terminate(ctx, sb, CauseFork)
		}
		sb.ForkOp, changed = "", true
	}
	if op := sb.Forking; op != nil {
		for _, kid := range op.Children {
			if kid == sb.ID {
				continue
			}
			unlock := e.locks.Lock(kid)
			k, err := e.store.GetSandbox(ctx, kid)
			if err == nil && k.State != torpor.StateTerminated {
				k.ForkOp = ""
				err = e.terminate(ctx, k, CauseFork)
			}
			unlock()
			if err != nil && !torpor.IsCode(err, torpor.ENotFound) {
				return err
			}
		}
		if op.TempCheckpoint != "" {
			_ = cp.DeleteCheckpoint(ctx, sb.ID, op.TempCheckpoint)
		}
		sb.Forking, changed = nil, true
	}
	if name := sb.RestoringCheckpoint; name != "" && sb.State != torpor.StateTerminated && sb.State != torpor.StateTerminating {
		if _, err := readyCheckpoint(sb, name); err == nil {
			if st, err := rt.Inspect(ctx, ref(sb)); err == nil && st.State != torpor.InstanceMissing {
				if err := e.stopRuntime(ctx, rt, sb); err != nil {
					return err
				}
			}
			if err := cp.RestoreCheckpoint(ctx, ref(sb), name); err != nil {
				return err
			}
		}
		sb.RestoringCheckpoint, changed = "", true
	}
	if changed {
		return e.save(ctx, sb)
	}
	return nil
}

// sweepCheckpoints removes, after a restart, the copies no record names
// as ready (a copy cut short, a delete's copy, a deleted sandbox's).
func (e *Engine) sweepCheckpoints(ctx context.Context) {
	for _, rt := range e.runtimes {
		cp, ok := rt.(torpor.Checkpointer)
		if !ok {
			continue
		}
		held, err := cp.ListCheckpoints(ctx)
		if err != nil {
			e.log.Error("listing checkpoints", "runtime", rt.Kind(), "err", err)
			continue
		}
		for id, names := range held {
			e.sweepCheckpointsOf(ctx, cp, id, names)
		}
	}
}

// sweepCheckpointsOf removes the copies of sandbox id that its record does
// not name, under its lock (a fleet node reconciles again after it
// rejoins, while verbs run).
func (e *Engine) sweepCheckpointsOf(ctx context.Context, cp torpor.Checkpointer, id string, names []string) {
	unlock := e.locks.Lock(id)
	defer unlock()
	keep := map[string]bool{}
	sb, err := e.store.GetSandbox(ctx, id)
	switch {
	case err == nil && sb.State != torpor.StateTerminated:
		for _, c := range sb.Checkpoints {
			keep[c.Name] = true
		}
		if sb.Forking != nil && sb.Forking.TempCheckpoint != "" {
			keep[sb.Forking.TempCheckpoint] = true
		}
	case err != nil && !torpor.IsCode(err, torpor.ENotFound):
		e.log.Error("reading a sandbox with checkpoints", "sandbox", id, "err", err)
		return
	}
	for _, n := range names {
		if !keep[n] {
			e.log.Info("removing leftover checkpoint", "sandbox", id, "checkpoint", n)
			if err := cp.DeleteCheckpoint(ctx, id, n); err != nil {
				e.log.Error("removing leftover checkpoint", "sandbox", id, "checkpoint", n, "err", err)
			}
		}
	}
}
