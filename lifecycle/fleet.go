package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sort"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/keyedmutex"
)

// FleetConfig makes the engine one node of a fleet: several daemons on
// one store, each owning its sandboxes (docs/fleet.md).
type FleetConfig struct {
	Nodes torpor.NodeStore
	// Self says who this node is: Name, Address, ProxyAddress, Labels and
	// Host (the engine fills in Runtimes and Capacity, and Host when empty:
	// what its runtimes that export snapshots say of the host).
	Self torpor.Node
	// DownAfter is how long a node may miss heartbeats before the others
	// declare it down (DefaultDownAfter when 0).
	DownAfter time.Duration
	// Objects keeps hibernated disks (and snapshot-paused VMs) so that any
	// node (of the same Host) can start them; nil: they stay on their node
	// (durability node).
	Objects torpor.ObjectStore
	// UploadAfter is how long a sandbox stays hibernated (paused by
	// snapshot) before its disk (snapshot) is uploaded (0: at once).
	UploadAfter time.Duration
	// StartOn asks node n to start sandbox id of tenant (a drain moves
	// its running sandboxes so); nil: drained sandboxes stay hibernated.
	StartOn func(ctx context.Context, n torpor.Node, tenant, id string) error
}

// Route says where the requests for one sandbox go: to this node (Local)
// or to the node that owns it.
type Route struct {
	Local bool
	// Node is the owner (or the node to send it to) when not Local.
	Node torpor.Node
}

// Router says which node serves a sandbox's requests and where a create
// goes, for the APIs that forward them (package api, package e2b); the
// Engine is one.
type Router interface {
	Route(ctx context.Context, tenant, id string) (Route, error)
	PlaceCreate(ctx context.Context, req torpor.CreateRequest) (Route, error)
}

var _ Router = (*Engine)(nil)

// DefaultDownAfter is FleetConfig.DownAfter's default.
const DefaultDownAfter = 10 * time.Second

// The fleet-wide locks (NodeStore.Exclusive) of work one node at a time
// does.
const (
	lockNodes = "torpor.nodes"
)

// fleet is the engine's state as a node.
type fleet struct {
	cfg   FleetConfig
	epoch atomic.Int64
	// leaseUntil is when this node must stop acting on its sandboxes
	// unless a heartbeat lands first (Unix nanoseconds of the monotonic
	// clock's reading: see lease). Time spent stopped (SIGSTOP) counts.
	leaseUntil atomic.Int64
	// fenced is set while the node, found declared down, destroys its
	// copies and joins again: nothing it holds may be served.
	fenced atomic.Bool
	// healthySince is when this node's heartbeats began to land without
	// a miss (monotonic, as leaseUntil; -1: the last one failed). It
	// declares other nodes down only after a whole down timeout of its
	// own heartbeats: when the store was away for everyone, every node's
	// last heartbeat is old, and none may take the others for dead.
	healthySince atomic.Int64

	mu sync.Mutex
	// nodes is the fleet as last listed, by name; placed adds what this
	// node sent to each since then, so that a burst of creates spreads.
	nodes  map[string]torpor.Node
	placed map[string]torpor.Resources
	// placedVRAM is the VRAM of the GPU creates this node sent each node
	// since the last listing, as placed is of their resources.
	placedVRAM map[string]int64
	// gpus is this node's GPU host as it said at its join (Count 0: none).
	gpus  torpor.NodeGPUs
	state torpor.NodeState
	// draining is set while the drain loop runs.
	draining bool
	// uploadFail backs off a sandbox's failing uploads: when to try next
	// and the last wait.
	uploadFail map[string]backoff

	uploadWake chan struct{}
	// uploads orders the uploads of one sandbox (the uploader's and a
	// drain's), so that one does not remove what the other recorded.
	uploads keyedmutex.Mutex
	// lastSeq is the newest event this node has told its followers of,
	// for the events other nodes write (see followOthers).
	lastSeq int64

	// owners remembers, for ownerTTL, which up node owns a sandbox that
	// another node's request was routed to, so that a burst of requests
	// through this node reads the store once, not at each request.
	ownersMu sync.Mutex
	owners   map[string]ownerHint
}

// ownerHint is a remembered owner: the sandbox's tenant, its node and
// when it was read (monoNow).
type ownerHint struct {
	tenant, node string
	at           int64
}

// ownerTTL is how long a remembered owner is trusted. A sandbox leaves an
// up node only in a drain; a request that reaches its old owner in that
// window answers 503 with a Retry-After of a second (OwnerMoved), and the
// retry finds the hint gone. maxOwnerHints bounds the memory it takes.
const (
	ownerTTL      = time.Second
	maxOwnerHints = 4096
)

// knownOwner returns the remembered owner of sandbox id when it is still
// fresh, was read for the same tenant (or the caller names none), and
// the last listing has its node up.
func (e *Engine) knownOwner(tenant, id string) (torpor.Node, bool) {
	f := e.fleet
	f.ownersMu.Lock()
	h, ok := f.owners[id]
	f.ownersMu.Unlock()
	if !ok || monoNow()-h.at > int64(ownerTTL) || (tenant != "" && tenant != h.tenant) {
		return torpor.Node{}, false
	}
	n, ok := e.nodeInfo(h.node)
	return n, ok && n.State == torpor.NodeUp
}

// rememberOwner notes that node owns sandbox id of tenant.
func (e *Engine) rememberOwner(tenant, id, node string) {
	f := e.fleet
	f.ownersMu.Lock()
	defer f.ownersMu.Unlock()
	if f.owners == nil || len(f.owners) >= maxOwnerHints {
		f.owners = make(map[string]ownerHint)
	}
	f.owners[id] = ownerHint{tenant: tenant, node: node, at: monoNow()}
}

// forgetOwners drops what is remembered of the owners of ids.
func (e *Engine) forgetOwners(ids ...string) {
	f := e.fleet
	f.ownersMu.Lock()
	defer f.ownersMu.Unlock()
	for _, id := range ids {
		delete(f.owners, id)
	}
}

type backoff struct {
	next time.Time
	wait time.Duration
}

// started is the process's start, the origin of the lease's clock.
var started = time.Now()

// monoNow reads the monotonic clock (nanoseconds since started), which
// runs on while the process is stopped.
func monoNow() int64 { return int64(time.Since(started)) }

// downAfter is the fleet's down timeout.
func (f *fleet) downAfter() time.Duration {
	if f.cfg.DownAfter > 0 {
		return f.cfg.DownAfter
	}
	return DefaultDownAfter
}

// Self is the name of this engine's node ("" outside a fleet).
func (e *Engine) Self() string { return e.node }

// Epoch is this node's epoch (0 outside a fleet).
func (e *Engine) Epoch() int64 {
	if e.fleet == nil {
		return 0
	}
	return e.fleet.epoch.Load()
}

// leaseErr says why this node may not act on its sandboxes now: its last
// heartbeat is too old (the others may soon declare it down) or it was
// declared down and is joining again.
func (e *Engine) leaseErr() error {
	f := e.fleet
	if f == nil {
		return nil
	}
	if f.fenced.Load() {
		return torpor.Fenced(e.node)
	}
	if monoNow() > f.leaseUntil.Load() {
		return &torpor.Error{Code: torpor.EUnavailable, RetryAfter: time.Second,
			Message: "node " + e.node + " has not reached the store for a while; its sandboxes wait until it does"}
	}
	return nil
}

// joinFleet registers the node, takes the sandboxes of a store that had
// no nodes yet (one daemon's state before it was a node), and takes its
// first lease.
func (e *Engine) joinFleet(ctx context.Context) error {
	f := e.fleet
	before, err := e.join(ctx)
	if err != nil {
		return err
	}
	if len(before) == 0 {
		if err := e.adoptUnowned(ctx); err != nil {
			return err
		}
	}
	// Follow other nodes' events from the log's end as it is now.
	for range 50 {
		evs, err := e.store.ListEvents(ctx, torpor.EventFilter{After: f.lastSeq, Limit: 1000})
		if err != nil {
			return err
		}
		if len(evs) > 0 {
			f.lastSeq = evs[len(evs)-1].Seq
		}
		if len(evs) < 1000 {
			break
		}
	}
	return nil
}

// join registers the node and takes a lease. A node that joins with a
// new epoch (it was declared down) settles what it held before, as any
// node settles a down node's sandboxes: it may have come back before
// anyone did. It returns the nodes there were before.
func (e *Engine) join(ctx context.Context) ([]torpor.Node, error) {
	f := e.fleet
	before, err := f.cfg.Nodes.ListNodes(ctx)
	if err != nil {
		return nil, fmt.Errorf("fleet: list nodes: %w", err)
	}
	if err := e.learnGPUs(ctx); err != nil {
		return nil, err
	}
	self := e.selfNode()
	sent := monoNow()
	epoch, err := f.cfg.Nodes.JoinNode(ctx, self)
	if err != nil {
		return nil, fmt.Errorf("fleet: join as node %s: %w", e.node, err)
	}
	f.epoch.Store(epoch)
	f.leaseUntil.Store(sent + int64(f.downAfter()*3/4))
	f.healthySince.Store(sent)
	e.log.Info("joined the fleet", "node", e.node, "epoch", epoch)
	// What it held at an older epoch (it was declared down, maybe while
	// it joined, or a join cut short before this) is settled here; a
	// restart at the same epoch finds nothing to settle.
	last := torpor.Node{Name: e.node, Epoch: epoch, HeartbeatAt: e.now()}
	for _, n := range before {
		if n.Name == e.node {
			last.HeartbeatAt = n.HeartbeatAt
		}
	}
	if err := e.settleDownNode(ctx, last); err != nil {
		return nil, err
	}
	return before, e.refreshNodes(ctx)
}

// adoptUnowned gives this node the sandboxes no node owns whose state is
// not in the object store: those of the single daemon the store belonged
// to before it had nodes.
func (e *Engine) adoptUnowned(ctx context.Context) error {
	sbs, err := e.store.ListSandboxes(ctx, torpor.SandboxFilter{})
	if err != nil {
		return err
	}
	n := 0
	for _, sb := range sbs {
		if sb.Node != "" || sb.Durability == torpor.DurabilityRemote {
			continue
		}
		sb.Node, sb.NodeEpoch = e.node, e.Epoch()
		if sb.Durability == "" {
			sb.Durability = torpor.DurabilityNode
		}
		if err := e.store.UpdateSandbox(ctx, sb); err != nil {
			return fmt.Errorf("fleet: take sandbox %s: %w", sb.ID, err)
		}
		n++
	}
	if n > 0 {
		e.log.Info("took the sandboxes of the store's single daemon", "node", e.node, "sandboxes", n)
	}
	return nil
}

// selfNode is what this node says of itself.
func (e *Engine) selfNode() torpor.Node {
	n := e.fleet.cfg.Self
	n.Name = e.node
	n.Labels = maps.Clone(n.Labels)
	n.Runtimes = nil
	for _, info := range e.Runtimes() {
		n.Runtimes = append(n.Runtimes, info.Kind)
	}
	n.Capacity = torpor.Resources{VCPUs: e.ledger.cap.VCPUs, MemoryMiB: e.ledger.cap.MemoryMiB}
	n.Used = e.used()
	n.Host = e.snapshotHost()
	f := e.fleet
	f.mu.Lock()
	n.GPUs = f.gpus
	f.mu.Unlock()
	n.GPUs.UsedVRAMMiB = e.heldVRAM()
	return n
}

// learnGPUs asks the GPU lease manager what GPUs this node has, for the
// node to say at its join (placement sends a GPU create only to a node
// with GPUs free: pickHost).
func (e *Engine) learnGPUs(ctx context.Context) error {
	if e.gpu == nil {
		return nil
	}
	c, err := e.gpu.Capacity(ctx)
	if err != nil {
		return fmt.Errorf("fleet: describe the GPU host: %w", err)
	}
	f := e.fleet
	f.mu.Lock()
	f.gpus = torpor.NodeGPUs{Count: c.Count, Model: c.Model, VRAMMiB: c.TotalMiB}
	f.mu.Unlock()
	return nil
}

// heldVRAM is the VRAM this node's GPU leases hold (see NodeGPUs).
func (e *Engine) heldVRAM() int64 {
	if e.gpu == nil {
		return 0
	}
	return e.gpu.HeldVRAMMiB()
}

// gpuNeed is what a sandbox asks of a node's GPUs: none (zero), or gpus
// GPUs and a VRAM slice.
type gpuNeed struct {
	gpus    int
	vramMiB int64
}

// needOf is what a sandbox with accel a needs of a node's GPUs.
func needOf(a *torpor.Accel) gpuNeed {
	if a == nil {
		return gpuNeed{}
	}
	return gpuNeed{gpus: max(a.GPUs, 1), vramMiB: a.VRAMMiB}
}

// needOfRequest is needOf for a create's accel, not validated yet (the
// create validates it: a bad one asks for nothing here).
func needOfRequest(a *torpor.AccelRequest) gpuNeed {
	if a == nil || a.GPUs < 0 || a.VRAMMiB <= 0 {
		return gpuNeed{}
	}
	return gpuNeed{gpus: max(a.GPUs, 1), vramMiB: a.VRAMMiB}
}

// gpuFits reports whether this node's GPUs have room for need now.
func (e *Engine) gpuFits(need gpuNeed) bool {
	if need.gpus == 0 {
		return true
	}
	f := e.fleet
	f.mu.Lock()
	g := f.gpus
	f.mu.Unlock()
	g.UsedVRAMMiB = e.heldVRAM()
	return g.Fits(need.gpus, need.vramMiB, 0)
}

// used is what this node's sandboxes hold.
func (e *Engine) used() torpor.Resources {
	v, m := e.ledger.usage()
	return torpor.Resources{VCPUs: v, MemoryMiB: int64(m + 0.5)}
}

// runFleet heartbeats, follows the fleet, declares silent nodes down
// and settles what they held, until ctx ends.
func (e *Engine) runFleet(ctx context.Context) {
	f := e.fleet
	every := f.downAfter() / 5
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		e.runWatch(ctx, every)
	}()
	ticking(ctx, every, func() {
		// A call that does not come back (a half-open connection) must
		// not hold the next heartbeat up: the lease runs out meanwhile.
		hctx, cancel := context.WithTimeout(ctx, 2*every)
		e.heartbeat(hctx)
		cancel()
	})
}

// ticking calls fn every d, the first time d from now, until ctx ends.
func ticking(ctx context.Context, d time.Duration, fn func()) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		fn()
	}
}

// runWatch declares silent nodes down and settles down nodes' sandboxes,
// apart from the heartbeats so that a long settlement never costs this
// node its lease.
func (e *Engine) runWatch(ctx context.Context, every time.Duration) {
	f := e.fleet
	ticking(ctx, every, func() {
		if since := f.healthySince.Load(); since < 0 || monoNow()-since < int64(f.downAfter()) || e.leaseErr() != nil {
			return
		}
		if _, err := f.cfg.Nodes.Exclusive(ctx, lockNodes, e.watchNodes); err != nil && ctx.Err() == nil {
			e.log.Warn("fleet: watching the nodes", "err", err)
		}
	})
}

// heartbeat tells the store this node is alive and renews its lease; a
// node found declared down is fenced.
func (e *Engine) heartbeat(ctx context.Context) {
	f := e.fleet
	if f.fenced.Load() {
		e.rejoin(ctx)
		return
	}
	sent := monoNow()
	st, err := f.cfg.Nodes.Heartbeat(ctx, e.node, f.epoch.Load(), e.used(), e.heldVRAM())
	switch {
	case err == nil:
		f.leaseUntil.Store(sent + int64(f.downAfter()*3/4))
		f.healthySince.CompareAndSwap(-1, sent)
	case torpor.IsCode(err, torpor.EUnavailable) && isFenced(err):
		e.onFenced(ctx)
		return
	default:
		f.healthySince.Store(-1)
		if ctx.Err() == nil {
			e.log.Warn("fleet: heartbeat failed", "node", e.node, "err", err)
		}
		return
	}
	if err := e.refreshNodes(ctx); err != nil && ctx.Err() == nil {
		e.log.Warn("fleet: listing the nodes", "err", err)
	}
	e.followOthers(ctx)
	e.setSelfState(ctx, st)
}

// setSelfState records this node's state, and starts the drain loop when
// it turns draining.
func (e *Engine) setSelfState(ctx context.Context, st torpor.NodeState) {
	f := e.fleet
	f.mu.Lock()
	f.state = st
	startDrain := st == torpor.NodeDraining && !f.draining
	if startDrain {
		f.draining = true
	}
	f.mu.Unlock()
	if startDrain {
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			e.runDrain(e.bg)
		}()
	}
}

// draining reports whether this node is draining.
func (e *Engine) draining() bool {
	f := e.fleet
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.state == torpor.NodeDraining
}

// admitCreate refuses a create this node must not take: it is draining,
// or lacks the node labels asked for (a create placed here by another
// node has them).
func (e *Engine) admitCreate(req torpor.CreateRequest) error {
	f := e.fleet
	if f == nil {
		return nil
	}
	f.mu.Lock()
	draining := f.state == torpor.NodeDraining
	f.mu.Unlock()
	if draining {
		return &torpor.Error{Code: torpor.EConflict, Reason: "capacity", RetryAfter: 2 * time.Second,
			Message: "node " + e.node + " is draining: it takes no new sandboxes"}
	}
	if !hasLabels(f.cfg.Self.Labels, req.NodeLabels) {
		return torpor.Invalid("node_labels", "node %s does not have the labels %v", e.node, req.NodeLabels)
	}
	if need := needOfRequest(req.Accel); !e.gpuFits(need) {
		return gpuFull(fmt.Sprintf("node %s has no %d GPU(s) with %d MiB of VRAM free", e.node, need.gpus, need.vramMiB))
	}
	return nil
}

// gpuFull is the capacity conflict of a GPU create no node has room for.
func gpuFull(msg string) error {
	return &torpor.Error{Code: torpor.EConflict, Reason: "capacity", RetryAfter: 5 * time.Second,
		Message: msg + "; retry later, or pause or hibernate GPU sandboxes (a spilled lease frees its slice)"}
}

func isFenced(err error) bool {
	var te *torpor.Error
	return errors.As(err, &te) && te.Reason == torpor.ReasonFenced
}

// followOthers wakes this node's followers of the event log (event
// streams, webhook loops) when other nodes stored events, which this
// node's own writes do not announce.
func (e *Engine) followOthers(ctx context.Context) {
	f := e.fleet
	evs, err := e.store.ListEvents(ctx, torpor.EventFilter{After: f.lastSeq, Limit: 500})
	if err != nil || len(evs) == 0 {
		return
	}
	f.lastSeq = evs[len(evs)-1].Seq
	ids := make([]string, 0, len(evs))
	for _, ev := range evs {
		ids = append(ids, ev.SandboxID)
	}
	e.forgetOwners(ids...) // what changed may have moved
	e.announce()
}

// refreshNodes reads the fleet's nodes.
func (e *Engine) refreshNodes(ctx context.Context) error {
	f := e.fleet
	nodes, err := f.cfg.Nodes.ListNodes(ctx)
	if err != nil {
		return err
	}
	m := make(map[string]torpor.Node, len(nodes))
	for _, n := range nodes {
		m[n.Name] = n
	}
	f.mu.Lock()
	f.nodes = m
	f.placed = map[string]torpor.Resources{}
	f.placedVRAM = map[string]int64{}
	f.mu.Unlock()
	return nil
}

// node returns what the last listing said of node name.
func (e *Engine) nodeInfo(name string) (torpor.Node, bool) {
	f := e.fleet
	f.mu.Lock()
	defer f.mu.Unlock()
	n, ok := f.nodes[name]
	return n, ok
}

// onFenced handles this node's discovery that it was declared down: the
// sandboxes it held now belong to others or are lost, so every local
// copy is destroyed (never served again), and the node joins afresh.
func (e *Engine) onFenced(ctx context.Context) {
	f := e.fleet
	if !f.fenced.CompareAndSwap(false, true) {
		return
	}
	e.log.Warn("this node was declared down by the fleet: destroying its local sandboxes and joining again", "node", e.node, "epoch", f.epoch.Load())
	for _, id := range e.trackedIDs() {
		unlock := e.locks.Lock(id)
		e.unwatch(id)
		e.sched.remove(id)
		e.ledger.record(id, torpor.StateTerminated, torpor.Resources{})
		e.quotas.set(id, "", torpor.QuotaUsage{})
		e.statesMu.Lock()
		delete(e.states, id)
		e.statesMu.Unlock()
		unlock()
	}
	e.pools.mu.Lock()
	for _, pl := range e.pools.byName {
		pl.ready = nil
	}
	e.pools.mu.Unlock()
	for _, rt := range e.runtimes {
		ids, err := rt.List(ctx)
		if err != nil {
			e.log.Error("fleet: listing local instances to destroy", "err", err)
			continue
		}
		for _, id := range ids {
			if err := rt.Destroy(ctx, torpor.InstanceRef{SandboxID: id}); err != nil {
				e.log.Error("fleet: destroying a local copy", "sandbox", id, "err", err)
			}
		}
	}
	e.rejoin(ctx)
}

// rejoin joins again after a fence, then takes on what the store says
// this node owns (nothing, unless it was given sandboxes since).
func (e *Engine) rejoin(ctx context.Context) {
	f := e.fleet
	if _, err := e.join(ctx); err != nil {
		e.log.Warn("fleet: joining again", "err", err)
		return
	}
	if err := e.reconcile(ctx); err != nil {
		e.log.Error("fleet: reconcile after joining again", "err", err)
	}
	sbs, err := e.store.ListSandboxes(ctx, torpor.SandboxFilter{Node: e.node})
	if err == nil {
		for _, sb := range sbs {
			if e.mine(sb) {
				e.track(sb)
			}
		}
	}
	f.fenced.Store(false)
	e.pools.kick()
}

// watchNodes runs under the fleet's nodes lock: it declares down the
// nodes that stopped heartbeating and settles what every down node still
// holds.
func (e *Engine) watchNodes(ctx context.Context) error {
	f := e.fleet
	downs, err := f.cfg.Nodes.DeclareDown(ctx, f.downAfter())
	if err != nil {
		return err
	}
	for _, n := range downs {
		e.log.Warn("fleet: node declared down", "node", n.Name, "last_heartbeat", n.HeartbeatAt)
	}
	if len(downs) > 0 {
		if err := e.refreshNodes(ctx); err != nil {
			return err
		}
	}
	f.mu.Lock()
	var down []torpor.Node
	for _, n := range f.nodes {
		if n.State == torpor.NodeDown && n.Name != e.node {
			down = append(down, n)
		}
	}
	f.mu.Unlock()
	for _, n := range down {
		if err := e.settleDownNode(ctx, n); err != nil {
			return err
		}
	}
	return nil
}

// settleDownNode decides the fate of every sandbox node n held before its
// epoch n.Epoch (a down node's: all of them): one
// whose state is in the object store is released for any node to start;
// a warm pool's member is removed; any other is lost (failed with
// FailureLost), its usage closed at the node's last heartbeat.
func (e *Engine) settleDownNode(ctx context.Context, n torpor.Node) error {
	sbs, err := e.store.ListSandboxes(ctx, torpor.SandboxFilter{Node: n.Name})
	if err != nil {
		return err
	}
	for _, sb := range sbs {
		if sb.NodeEpoch >= n.Epoch {
			continue // taken at its current epoch: it is its own
		}
		if n.Name != e.node && e.leaseErr() != nil {
			return e.leaseErr() // the next round, under a fresh lease
		}
		var evs []torpor.Event
		var rows []torpor.UsageRecord
		at := n.HeartbeatAt
		if at.Before(sb.Usage.Since) {
			at = sb.Usage.Since
		}
		if now := e.now(); at.After(now) {
			at = now
		}
		switch {
		case releasable(sb):
			sb.Node = ""
			evs = append(evs, e.event(sb, torpor.EventReleased, "node", n.Name, "cause", "node_down"))
		case sb.State == torpor.StateFailed && sb.Failure != nil && sb.Failure.Code == torpor.FailureLost:
			continue
		default:
			rows = e.closeUsage(sb, at)
			sb.Usage.Kind = torpor.UsageNone
			msg := fmt.Sprintf("node %s went down (last heartbeat %s) while the sandbox was %s; its state was only on that node",
				n.Name, n.HeartbeatAt.UTC().Format(time.RFC3339), sb.State)
			if sb.Tenant == torpor.PoolTenant {
				sb.Node = ""
				sb.State, sb.StateSince = torpor.StateTerminated, at
				t := at
				sb.TerminatedAt = &t
				ev := e.event(sb, torpor.EventTerminated, "cause", "node_down")
				ev.Time = at
				evs = append(evs, ev)
				break
			}
			// No node holds it any more: the one that comes back destroys
			// what it had of it, and any node can delete it.
			sb.Node = ""
			sb.State, sb.StateSince, sb.PauseMode, sb.Handle = torpor.StateFailed, at, "", ""
			sb.Snapshot = nil
			sb.Failure = &torpor.Failure{Code: torpor.FailureLost, Message: msg}
			ev := e.event(sb, torpor.EventFailed, "code", torpor.FailureLost, "message", msg, "node", n.Name)
			ev.Time = at
			evs = append(evs, ev)
		}
		if err := e.store.UpdateSandboxUsage(ctx, sb, rows, evs...); err != nil {
			if torpor.IsCode(err, torpor.EConflict) {
				continue // it changed under us: the next round sees it
			}
			return fmt.Errorf("fleet: settle sandbox %s of down node %s: %w", sb.ID, n.Name, err)
		}
		e.log.Warn("fleet: sandbox of a down node", "sandbox", sb.ID, "node", n.Name, "now", sb.State)
		e.announce()
	}
	return nil
}

// mine reports whether this node owns sb at its current epoch (outside a
// fleet: always).
func (e *Engine) mine(sb *torpor.Sandbox) bool {
	return e.fleet == nil || (sb.Node == e.node && sb.NodeEpoch == e.Epoch())
}

// own makes sure this node may act on sb, which the caller loaded under
// its lock: it owns it, or takes it when no live node holds it and its
// state allows (in the object store, or nothing left to keep). A sandbox
// another live node owns is Moved; one whose dead owner's fate is not yet
// settled is unavailable for a moment.
func (e *Engine) own(ctx context.Context, sb *torpor.Sandbox) error {
	if e.fleet == nil {
		return nil
	}
	if err := e.leaseErr(); err != nil {
		return err
	}
	if sb.Node == e.node {
		if sb.NodeEpoch != e.Epoch() {
			// It held it before it was declared down: the fleet settles
			// it (released or lost) before anyone acts on it.
			return &torpor.Error{Code: torpor.EUnavailable, RetryAfter: 2 * time.Second,
				Message: "sandbox " + sb.ID + " is being settled after its node was declared down; try again in a moment"}
		}
		return nil
	}
	if sb.State == torpor.StateTerminated {
		return nil // nothing to act on: the verbs say gone
	}
	if sb.Node != "" {
		n, ok := e.nodeInfo(sb.Node)
		if !ok || n.State != torpor.NodeDown {
			return torpor.Moved(sb.ID, sb.Node)
		}
		claimable := releasable(sb) ||
			(sb.State == torpor.StateFailed && sb.Failure != nil && sb.Failure.Code == torpor.FailureLost)
		if !claimable {
			return &torpor.Error{Code: torpor.EUnavailable, RetryAfter: 2 * time.Second,
				Message: "node " + sb.Node + " is down; its sandbox " + sb.ID + " is being settled, try again in a moment"}
		}
	}
	if e.draining() && movable(sb) {
		return &torpor.Error{Code: torpor.EUnavailable, RetryAfter: time.Second,
			Message: "node " + e.node + " is draining; send the request to another node"}
	}
	if movable(sb) && !hasLabels(e.fleet.cfg.Self.Labels, sb.NodeLabels) {
		return &torpor.Error{Code: torpor.EUnavailable, RetryAfter: time.Second,
			Message: fmt.Sprintf("node %s does not have the labels %v that sandbox %s asks for; send the request to another node", e.node, sb.NodeLabels, sb.ID)}
	}
	if h := remoteHost(sb); h != "" && h != e.snapshotHost() {
		return &torpor.Error{Code: torpor.EUnavailable, RetryAfter: time.Second,
			Message: fmt.Sprintf("sandbox %s is a VM snapshot made on a host of %q, and node %s is not one; send the request to a node that is", sb.ID, h, e.node)}
	}
	prev, prevEpoch := sb.Node, sb.NodeEpoch
	sb.Node, sb.NodeEpoch = e.node, e.Epoch()
	ev := e.event(sb, torpor.EventClaimed, "node", e.node)
	if prev != "" {
		ev.Attrs["from"] = prev
	}
	if err := e.store.UpdateSandbox(ctx, sb, ev); err != nil {
		sb.Node, sb.NodeEpoch = prev, prevEpoch
		if torpor.IsCode(err, torpor.EConflict) {
			// Another node took it first: it serves the request.
			if cur, gerr := e.store.GetSandbox(ctx, sb.ID); gerr == nil && cur.Node != "" && cur.Node != e.node {
				return torpor.Moved(sb.ID, cur.Node)
			}
		}
		return err
	}
	e.log.Info("fleet: took a sandbox no live node held", "sandbox", sb.ID, "from", prev)
	e.track(sb)
	e.announce()
	return nil
}

// Route tells where the requests for sandbox id of tenant ("": any) go:
// Local for a sandbox this node owns, one unknown to the store or of
// another tenant (the handler answers not_found), a terminated one, and
// one no live node owns that this node can take (it takes it); the owner
// otherwise, or a node with room for one this node cannot take.
func (e *Engine) Route(ctx context.Context, tenant, id string) (Route, error) {
	if e.fleet == nil {
		return Route{Local: true}, nil
	}
	if err := e.leaseErr(); err != nil {
		return Route{}, err
	}
	e.statesMu.Lock()
	_, mine := e.states[id]
	e.statesMu.Unlock()
	if mine {
		return Route{Local: true}, nil
	}
	if n, ok := e.knownOwner(tenant, id); ok {
		return Route{Node: n}, nil
	}
	sb, err := e.store.GetSandbox(ctx, id)
	if err != nil {
		if torpor.IsCode(err, torpor.ENotFound) {
			return Route{Local: true}, nil
		}
		return Route{}, err
	}
	if (tenant != "" && sb.Tenant != tenant) || (sb.Node == e.node && sb.NodeEpoch == e.Epoch()) || sb.State == torpor.StateTerminated {
		return Route{Local: true}, nil
	}
	if sb.Node != "" {
		n, ok := e.nodeInfo(sb.Node)
		if !ok {
			return Route{}, torpor.Errorf(torpor.EUnavailable, "sandbox %s is on node %s, which this node does not know yet", id, sb.Node)
		}
		if n.State != torpor.NodeDown {
			if n.State == torpor.NodeUp {
				e.rememberOwner(sb.Tenant, id, n.Name)
			}
			return Route{Node: n}, nil
		}
	}
	if sb.Node == "" && !movable(sb) {
		// Lost with its node: nothing to take; the verbs that change it
		// (delete) take it then.
		return Route{Local: true}, nil
	}
	// No live node holds it: take it here when it fits and this node is
	// not draining, else send it to a node where it does.
	// A node without the labels its create asked for does not take it.
	// A VM snapshot resumes only on a node of the host that made it.
	if movable(sb) {
		labelled := hasLabels(e.fleet.cfg.Self.Labels, sb.NodeLabels)
		host := remoteHost(sb)
		compatible := host == "" || host == e.snapshotHost()
		need := needOf(sb.Accel)
		gpus := e.gpuFits(need)
		if e.draining() || !e.fits(sb.Resources) || !labelled || !compatible || !gpus {
			if n, ok := e.pickHost(sb.Runtime.Kind, sb.NodeLabels, host, sb.Resources, need, true); ok {
				return Route{Node: n}, nil
			}
		}
		if !labelled {
			return Route{}, &torpor.Error{Code: torpor.EUnavailable, RetryAfter: 5 * time.Second,
				Message: fmt.Sprintf("sandbox %s asks for a node with the labels %v; no up node with room has them", id, sb.NodeLabels)}
		}
		if !compatible {
			return Route{}, &torpor.Error{Code: torpor.EUnavailable, RetryAfter: 5 * time.Second,
				Message: fmt.Sprintf("sandbox %s is a VM snapshot made on a host of %q; no up node with room is one", id, host)}
		}
		if !gpus {
			return Route{}, &torpor.Error{Code: torpor.EUnavailable, RetryAfter: 5 * time.Second,
				Message: fmt.Sprintf("sandbox %s asks for %d GPU(s) with %d MiB of VRAM; no up node with room has them free", id, need.gpus, need.vramMiB)}
		}
	}
	if tenant == "" {
		// Not yet known who asks (the proxy routes before it checks the
		// sandbox's token): the verb that acts on it takes it.
		return Route{Local: true}, nil
	}
	unlock := e.locks.Lock(id)
	defer unlock()
	cur, err := e.store.GetSandbox(ctx, id)
	if err != nil {
		return Route{}, err
	}
	if err := e.own(ctx, cur); err != nil {
		var te *torpor.Error
		if errors.As(err, &te) && te.Reason == torpor.ReasonMoved {
			// Another node took it first (own changed cur): it serves.
			if won, gerr := e.store.GetSandbox(ctx, id); gerr == nil && won.Node != e.node {
				if n, ok := e.nodeInfo(won.Node); ok {
					return Route{Node: n}, nil
				}
			}
		}
		return Route{}, err
	}
	return Route{Local: true}, nil
}

// fits reports whether this node has room for a running sandbox of r.
func (e *Engine) fits(r torpor.Resources) bool {
	v, m := e.ledger.usage()
	c := e.ledger.cap
	return (c.VCPUs == 0 || v+r.VCPUs <= c.VCPUs+1e-9) && (c.MemoryMiB == 0 || m+float64(r.MemoryMiB) <= float64(c.MemoryMiB)+1e-9)
}

// localSlack is the head start this node has when a create it received
// is placed: it keeps the create unless another node has this much more
// of its memory free (a fraction), which spreads a burst of creates
// without sending every one away.
const localSlack = 0.1

// pick chooses the up node (this one included, unless others) that runs
// kind ("" : the default), has every label, room for r, GPUs with room
// for need (when it asks for any), and the largest free fraction of its
// memory, counting what this node sent it since the last listing (this
// node's own use is its live one, with localSlack).
func (e *Engine) pick(kind string, labels map[string]string, r torpor.Resources, need gpuNeed, others bool) (torpor.Node, bool) {
	return e.pickHost(kind, labels, "", r, need, others)
}

// pickHost is pick among the nodes whose Host is host (any: "").
func (e *Engine) pickHost(kind string, labels map[string]string, host string, r torpor.Resources, need gpuNeed, others bool) (torpor.Node, bool) {
	draining := e.draining()
	f := e.fleet
	f.mu.Lock()
	defer f.mu.Unlock()
	var best torpor.Node
	bestFree := -1.0
	names := slices.Sorted(maps.Keys(f.nodes))
	for _, name := range names {
		n := f.nodes[name]
		if name == e.node && (others || draining) {
			continue
		}
		if n.State != torpor.NodeUp && name != e.node {
			continue
		}
		if kind != "" && !slices.Contains(n.Runtimes, kind) {
			continue
		}
		if !hasLabels(n.Labels, labels) {
			continue
		}
		if host != "" && n.Host != host {
			continue
		}
		used := n.Used
		if name == e.node {
			used = e.used()
		}
		p := f.placed[name]
		freeCPU := n.Capacity.VCPUs - used.VCPUs - p.VCPUs
		freeMem := float64(n.Capacity.MemoryMiB - used.MemoryMiB - p.MemoryMiB)
		if (n.Capacity.VCPUs > 0 && freeCPU+1e-9 < r.VCPUs) || (n.Capacity.MemoryMiB > 0 && freeMem+1e-9 < float64(r.MemoryMiB)) {
			continue
		}
		if need.gpus > 0 {
			g := n.GPUs
			if name == e.node {
				g = f.gpus
				g.UsedVRAMMiB = e.heldVRAM()
			}
			if !g.Fits(need.gpus, need.vramMiB, f.placedVRAM[name]) {
				continue
			}
		}
		free := 1.0
		if n.Capacity.MemoryMiB > 0 {
			free = freeMem / float64(n.Capacity.MemoryMiB)
		}
		if name == e.node {
			free += localSlack
		}
		if free > bestFree {
			best, bestFree = n, free
		}
	}
	if bestFree < 0 {
		return torpor.Node{}, false
	}
	if best.Name == e.node {
		return best, true
	}
	p := f.placed[best.Name]
	p.VCPUs += r.VCPUs
	p.MemoryMiB += r.MemoryMiB
	f.placed[best.Name] = p
	f.placedVRAM[best.Name] += need.vramMiB
	return best, true
}

// anyGPUNode reports whether an up node (this one included) runs kind,
// has the labels and at least need's GPUs, free or not.
func (e *Engine) anyGPUNode(kind string, labels map[string]string, need gpuNeed) bool {
	f := e.fleet
	f.mu.Lock()
	defer f.mu.Unlock()
	for name, n := range f.nodes {
		g := n.GPUs
		if name == e.node {
			g = f.gpus
		} else if n.State != torpor.NodeUp {
			continue
		}
		if (kind == "" || slices.Contains(n.Runtimes, kind)) && hasLabels(n.Labels, labels) && g.Count >= need.gpus {
			return true
		}
	}
	return false
}

func hasLabels(have, want map[string]string) bool {
	for k, v := range want {
		if got, ok := have[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// PlaceCreate picks the node a create goes to: this one when it runs the
// runtime asked for, has the node labels, is not draining and has room;
// else the up node with the most free memory that does. No such node is
// a capacity conflict (or, for labels no node has, invalid).
func (e *Engine) PlaceCreate(ctx context.Context, req torpor.CreateRequest) (Route, error) {
	if e.fleet == nil {
		return Route{Local: true}, nil
	}
	if err := e.leaseErr(); err != nil {
		return Route{}, err
	}
	res, err := req.Validate(e.limits)
	if err != nil {
		return Route{}, err // the local create says it again, in full
	}
	kind := req.Runtime.Kind
	if kind == "" && req.Isolation == "" {
		kind = e.defKind
	}
	draining := e.draining()
	// This node is a candidate when it can make the create at all (the
	// runtime kind named or the isolation asked for).
	_, rerr := e.runtimeFor(req.Isolation, req.Runtime.Kind)
	need := needOfRequest(req.Accel)
	if n, ok := e.pick(kind, req.NodeLabels, res, need, rerr != nil); ok {
		if n.Name == e.node {
			return Route{Local: true}, nil
		}
		return Route{Node: n}, nil
	}
	if len(req.NodeLabels) > 0 {
		if _, ok := e.pick(kind, req.NodeLabels, torpor.Resources{}, gpuNeed{}, false); !ok {
			return Route{}, torpor.Invalid("node_labels", "no up node has the labels %v", req.NodeLabels)
		}
	}
	if need.gpus > 0 {
		// A GPU create never lands on a node without GPUs free: none has
		// as many GPUs (invalid), or those that do have no room now.
		if !e.anyGPUNode(kind, req.NodeLabels, need) {
			return Route{}, torpor.Invalid("accel", "no up node has %d GPU(s)", need.gpus)
		}
		return Route{}, gpuFull(fmt.Sprintf("no up node with %d GPU(s) has %d MiB of VRAM free and room for the sandbox", need.gpus, need.vramMiB))
	}
	if draining {
		return Route{}, &torpor.Error{Code: torpor.EConflict, Reason: "capacity", RetryAfter: 2 * time.Second,
			Message: "node " + e.node + " is draining and no other node has room"}
	}
	return Route{Local: true}, nil // the local create refuses with the node's own figures
}

// Nodes lists the fleet's nodes by name, this one's use (and its GPU
// leases' VRAM) as of now (outside a fleet: none).
func (e *Engine) Nodes(ctx context.Context) ([]torpor.Node, error) {
	if e.fleet == nil {
		return nil, nil
	}
	nodes, err := e.fleet.cfg.Nodes.ListNodes(ctx)
	if err != nil {
		return nil, err
	}
	for i := range nodes {
		if nodes[i].Name == e.node {
			nodes[i].Used = e.used()
			nodes[i].GPUs.UsedVRAMMiB = e.heldVRAM()
		}
	}
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].Name < nodes[j].Name })
	return nodes, nil
}

// DrainNode asks node name to move its sandboxes away and take no new
// ones (UndrainNode ends that).
func (e *Engine) DrainNode(ctx context.Context, name string) (torpor.Node, error) {
	return e.setNodeState(ctx, name, torpor.NodeDraining)
}

// UndrainNode lets a draining node take sandboxes again.
func (e *Engine) UndrainNode(ctx context.Context, name string) (torpor.Node, error) {
	return e.setNodeState(ctx, name, torpor.NodeUp)
}

func (e *Engine) setNodeState(ctx context.Context, name string, s torpor.NodeState) (torpor.Node, error) {
	if e.fleet == nil {
		// A server alone has no fleet nodes to drain: the name is unknown.
		return torpor.Node{}, torpor.Errorf(torpor.ENotFound, "no node named %q: this server is not a node of a fleet", name)
	}
	if err := e.fleet.cfg.Nodes.SetNodeState(ctx, name, s); err != nil {
		return torpor.Node{}, err
	}
	if name == e.node {
		e.setSelfState(ctx, s)
	}
	if err := e.refreshNodes(ctx); err != nil {
		return torpor.Node{}, err
	}
	nodes, err := e.Nodes(ctx)
	if err != nil {
		return torpor.Node{}, err
	}
	for _, n := range nodes {
		if n.Name == name {
			return n, nil
		}
	}
	return torpor.Node{}, torpor.Errorf(torpor.ENotFound, "no node named %q", name)
}

// runDrain moves this draining node's sandboxes away until it is drained
// or undrained: a running, paused or hibernated sandbox is hibernated, its
// disk uploaded and the sandbox released; one that was running is started
// on another node. A warm pool's members are removed. Without an object
// store nothing can move: the drain waits for the sandboxes to end.
func (e *Engine) runDrain(ctx context.Context) {
	f := e.fleet
	defer func() {
		f.mu.Lock()
		f.draining = false
		f.mu.Unlock()
	}()
	e.log.Info("fleet: draining", "node", e.node)
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		f.mu.Lock()
		st := f.state
		f.mu.Unlock()
		if st != torpor.NodeDraining || ctx.Err() != nil {
			return
		}
		sbs, err := e.store.ListSandboxes(ctx, torpor.SandboxFilter{Node: e.node})
		if err != nil {
			e.log.Warn("fleet: drain: listing sandboxes", "err", err)
		}
		for _, sb := range sbs {
			if ctx.Err() != nil {
				return
			}
			e.drainOne(ctx, sb)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// drainOne moves one sandbox off this draining node, as runDrain says.
func (e *Engine) drainOne(ctx context.Context, sb *torpor.Sandbox) {
	f := e.fleet
	if sb.Tenant == torpor.PoolTenant {
		e.removeMember(ctx, sb.ID)
		return
	}
	if f.cfg.Objects == nil {
		return
	}
	if sb.State == torpor.StatePaused && e.snapshotArchiver(sb) != nil {
		if _, ok := e.pickHost(sb.Runtime.Kind, sb.NodeLabels, e.snapshotHost(), torpor.Resources{}, gpuNeed{}, true); ok {
			// Its snapshot moves, memory and all, for a node of this host
			// to resume it where it stopped.
			if err := e.upload(ctx, sb.ID); err != nil {
				e.log.Warn("fleet: drain: upload", "sandbox", sb.ID, "err", err)
				return
			}
			if _, err := e.release(ctx, sb.ID); err != nil {
				e.log.Warn("fleet: drain: release", "sandbox", sb.ID, "err", err)
			}
			return
		}
	}
	wasRunning := false
	switch sb.State {
	case torpor.StateRunning, torpor.StatePaused:
		wasRunning = sb.State == torpor.StateRunning
		if _, err := e.withSandbox(ctx, sb.Tenant, sb.ID, func(sb *torpor.Sandbox) error { return e.hibernate(ctx, sb, CauseDrain) }); err != nil {
			e.log.Warn("fleet: drain: hibernate", "sandbox", sb.ID, "err", err)
			return
		}
	case torpor.StateHibernated:
	default:
		return
	}
	if err := e.upload(ctx, sb.ID); err != nil {
		e.log.Warn("fleet: drain: upload", "sandbox", sb.ID, "err", err)
		return
	}
	released, err := e.release(ctx, sb.ID)
	if err != nil || !released {
		if err != nil {
			e.log.Warn("fleet: drain: release", "sandbox", sb.ID, "err", err)
		}
		return
	}
	if !wasRunning || f.cfg.StartOn == nil {
		return
	}
	cur, err := e.store.GetSandbox(ctx, sb.ID)
	if err != nil {
		return
	}
	n, ok := e.pick(cur.Runtime.Kind, cur.NodeLabels, cur.Resources, needOf(cur.Accel), true)
	if !ok {
		e.log.Warn("fleet: drain: no node has room to start a moved sandbox; it stays hibernated", "sandbox", sb.ID)
		return
	}
	if err := f.cfg.StartOn(ctx, n, sb.Tenant, sb.ID); err != nil {
		e.log.Warn("fleet: drain: start elsewhere", "sandbox", sb.ID, "node", n.Name, "err", err)
	}
}

// release lets go of a hibernated (or snapshot-paused) sandbox whose state
// is in the object store, for any node (of its host) to start.
func (e *Engine) release(ctx context.Context, id string) (bool, error) {
	unlock := e.locks.Lock(id)
	defer unlock()
	sb, err := e.store.GetSandbox(ctx, id)
	if err != nil {
		return false, err
	}
	if sb.Node != e.node || !releasable(sb) {
		return false, nil
	}
	// The local disk goes below: the copy must be there to be read.
	if _, err := e.readManifest(ctx, sb.Remote.Manifest); err != nil {
		return false, err
	}
	sb.Node = ""
	if err := e.store.UpdateSandbox(ctx, sb, e.event(sb, torpor.EventReleased, "node", e.node, "cause", CauseDrain)); err != nil {
		return false, err
	}
	e.sched.remove(id)
	e.hold(sb, torpor.StateTerminated)
	e.statesMu.Lock()
	delete(e.states, id)
	e.statesMu.Unlock()
	for _, rt := range e.runtimes {
		if rt.Kind() == sb.Runtime.Kind {
			if err := rt.Destroy(ctx, ref(sb)); err != nil {
				e.log.Warn("fleet: removing the local disk of a released sandbox", "sandbox", id, "err", err)
			}
		}
	}
	e.announce()
	return true, nil
}

// CauseDrain is the cause of what a drain does.
const CauseDrain = "drain"

// itoa is strconv.FormatInt for the events' attributes.
func itoa(n int64) string { return strconv.FormatInt(n, 10) }
