// Package lifecycle is the engine that moves sandboxes through their states:
// it persists every transition before and after it acts on the runtime,
// watches running instances, and reconciles after a restart. It knows no
// HTTP and no SQL.
package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/keyedmutex"
)

// Config is what an Engine is built from.
type Config struct {
	Store torpor.Store
	// Runtimes by kind; DefaultRuntime names the one used when a request
	// names none (the first one when empty).
	Runtimes       []torpor.Runtime
	DefaultRuntime string
	Clock          torpor.Clock
	Logger         *slog.Logger
	Limits         torpor.Limits
	// Capacity bounds what running and paused sandboxes hold together.
	Capacity Capacity
	// MaxPaused hibernates a sandbox paused this long, on the platform's
	// terms (spec 003); 0 turns the rule off.
	MaxPaused time.Duration
	// DefaultPolicy fills the machine-policy fields a create request leaves
	// out.
	DefaultPolicy torpor.LifecyclePolicy
	// CPUActivity, when above 0, counts a running sandbox whose processes
	// used at least this many CPUs on average (0.1: a tenth of one core)
	// since the idle engine last looked as active, so an agent busy
	// computing is not paused under its work. Needs a runtime that reports
	// CPU use (torpor.CPUReporter).
	CPUActivity float64
	// Observer is told of transitions, hook runs and scheduler lag (for
	// metrics); nil tells no one.
	Observer Observer
	// Pricing prices the usage ledger's rows (torpor.DefaultPricing when
	// zero).
	Pricing torpor.Pricing
	// SettleEvery is how often open usage intervals are written to the
	// ledger (DefaultSettleEvery when 0); it must divide a day.
	SettleEvery time.Duration
	// SeenEvery is how often the engine records that the instances it
	// watches are alive (DefaultSeenEvery when 0).
	SeenEvery time.Duration
	// GPU is the node's GPU lease manager and GPUAttach how a booted GPU
	// sandbox's lease is placed on the host; nil: no GPU sandboxes.
	GPU       GPULeases
	GPUAttach GPUAttacher
	// DrainTimeout bounds how long a pause or hibernation of a running
	// sandbox waits, on the engine's clock, for the operations in flight
	// on it (exec, run_code, files, ...) to end before it goes on and
	// stops them with the sandbox (DefaultDrainTimeout when 0).
	DrainTimeout time.Duration
	// DataDiskFull reports whether the file system of the server's data
	// dir (the store, the sandboxes' disk images) has no space left. An
	// operation that can write into a sandbox (exec, code, processes, file
	// writes) records nothing in the store, so it asks this first: with
	// the data disk full it is refused (torpor.DiskFull), as a write the
	// sandbox's sparse image could not keep would be lost. nil: never.
	DataDiskFull func() bool
	// Deadlines bound the runtime calls of transitions; zero fields take
	// DefaultDeadlines'.
	Deadlines Deadlines
	// WarmPools are the warm pools (docs/pools.md) the engine starts
	// with; those the store kept from SetPool win.
	WarmPools []torpor.PoolConfig
	// Fleet makes the engine a node of a fleet (fleet.go); nil: the only
	// daemon on its store.
	Fleet *FleetConfig
	// Archives is where archived sandboxes' disks go (docs/archive.md):
	// the fleet's object store when it has one, else a directory under
	// the data dir. nil: an archive that falls due fails (unavailable).
	Archives torpor.ObjectStore
	// Failpoint, when set, is called at every step of each transition,
	// with the names Failpoints lists ("pausing.before-runtime",
	// "paused.after-store", ...). Crash tests use it to kill the daemon
	// mid-transition; production leaves it nil.
	Failpoint func(name string)
}

// Engine runs the lifecycle of every sandbox.
type Engine struct {
	store    torpor.Store
	runtimes map[string]torpor.Runtime
	defKind  string
	clock    torpor.Clock
	log      *slog.Logger
	limits   torpor.Limits
	fail     func(string)

	locks     keyedmutex.Mutex
	sched     *scheduler
	ledger    *ledger
	quotas    *quotas
	maxPaused time.Duration
	defPolicy torpor.LifecyclePolicy
	archives  torpor.ObjectStore

	drainTimeout time.Duration
	// dataDiskFull is Config.DataDiskFull (nil: the disk never fills).
	dataDiskFull func() bool
	deadlines    Deadlines
	// runs holds, by sandbox id, a channel closed when that sandbox stops
	// running (see runSignal).
	runMu sync.Mutex
	runs  map[string]chan struct{}

	// act is the sandboxes' activity the store does not hold yet, which
	// the idle sweep consults before it acts.
	act *activity

	// procs remembers the background processes started in each sandbox
	// (by sandbox id, then process id), with the boot they belong to.
	procMu sync.Mutex
	procs  map[string]map[int]torpor.ProcessInfo

	evMu sync.Mutex
	evCh chan struct{}

	obs      Observer
	statesMu sync.Mutex
	states   map[string]torpor.State

	gpu         GPULeases
	gpuAttacher GPUAttacher

	pricing     torpor.Pricing
	settleEvery time.Duration
	seenEvery   time.Duration

	bg       context.Context
	stopBG   context.CancelFunc
	wg       sync.WaitGroup
	watchMu  sync.Mutex
	watchers map[string]*watcher

	// pools are the warm pools (pool.go) and warmPools the configs they
	// start with.
	pools     *pools
	warmPools []torpor.PoolConfig

	// node is this engine's fleet node name ("" outside a fleet), and
	// fleet its state as a node (nil outside a fleet).
	node  string
	fleet *fleet

	// abandoned holds the ids of creates a full data disk cut short after
	// their record was stored (see finishCutShort).
	abandoned sync.Map

	// volumeDevices: the volume host hands volumes' images to the
	// runtimes in volumeAttachers (VMs), set by wireVolumeDevices.
	volumeDevices   bool
	volumeAttachers []torpor.VolumeAttacher
}

// New returns an engine. Call Recover before serving requests.
func New(cfg Config) (*Engine, error) {
	if cfg.Store == nil || len(cfg.Runtimes) == 0 {
		return nil, errors.New("lifecycle: a store and at least one runtime are required")
	}
	e := &Engine{
		store:     cfg.Store,
		runtimes:  map[string]torpor.Runtime{},
		defKind:   cfg.DefaultRuntime,
		clock:     cfg.Clock,
		log:       cfg.Logger,
		limits:    cfg.Limits,
		fail:      cfg.Failpoint,
		watchers:  map[string]*watcher{},
		ledger:    newLedger(cfg.Capacity),
		quotas:    newQuotas(),
		maxPaused: cfg.MaxPaused,
		defPolicy: cfg.DefaultPolicy,
		archives:  cfg.Archives,
		act:       newActivity(cfg.CPUActivity),

		drainTimeout: cfg.DrainTimeout,
		dataDiskFull: cfg.DataDiskFull,
		deadlines:    cfg.Deadlines.orDefault(),
		runs:         map[string]chan struct{}{},

		evCh:        make(chan struct{}),
		obs:         cfg.Observer,
		states:      map[string]torpor.State{},
		pricing:     cfg.Pricing,
		gpu:         cfg.GPU,
		gpuAttacher: cfg.GPUAttach,
		settleEvery: cfg.SettleEvery,
		seenEvery:   cfg.SeenEvery,
		pools:       newPools(),
		warmPools:   cfg.WarmPools,
	}
	if e.pricing == (torpor.Pricing{}) {
		e.pricing = torpor.DefaultPricing
	}
	if err := e.pricing.Validate(); err != nil {
		return nil, err
	}
	if e.settleEvery == 0 {
		e.settleEvery = DefaultSettleEvery
	}
	if e.settleEvery < time.Second || (24*time.Hour)%e.settleEvery != 0 {
		return nil, fmt.Errorf("lifecycle: the settlement period %s must be at least a second and divide a day", e.settleEvery)
	}
	if e.seenEvery <= 0 {
		e.seenEvery = DefaultSeenEvery
	}
	if e.drainTimeout <= 0 {
		e.drainTimeout = DefaultDrainTimeout
	}
	for _, c := range e.warmPools {
		if err := c.Validate(); err != nil {
			return nil, err
		}
	}
	if e.gpu != nil && e.gpuAttacher == nil {
		return nil, errors.New("lifecycle: a GPU lease manager needs a GPUAttach")
	}
	for _, rt := range cfg.Runtimes {
		e.runtimes[rt.Kind()] = rt
	}
	if e.defKind == "" {
		e.defKind = cfg.Runtimes[0].Kind()
	}
	if _, ok := e.runtimes[e.defKind]; !ok {
		return nil, fmt.Errorf("lifecycle: default runtime %q is not configured", e.defKind)
	}
	e.wireVolumeDevices()
	if e.clock == nil {
		e.clock = torpor.SystemClock{}
	}
	if e.log == nil {
		e.log = slog.New(slog.DiscardHandler)
	}
	if e.limits == (torpor.Limits{}) {
		e.limits = torpor.DefaultLimits
	}
	if e.fail == nil {
		e.fail = func(string) {}
	}
	if e.obs == nil {
		e.obs = nopObserver{}
	}
	if cfg.Fleet != nil {
		if cfg.Fleet.Nodes == nil || cfg.Fleet.Self.Name == "" {
			return nil, errors.New("lifecycle: a fleet node needs a node store and a name")
		}
		e.node = cfg.Fleet.Self.Name
		e.fleet = &fleet{cfg: *cfg.Fleet, nodes: map[string]torpor.Node{}, placed: map[string]torpor.Resources{},
			placedVRAM: map[string]int64{}, state: torpor.NodeUp, uploadFail: map[string]backoff{}, uploadWake: make(chan struct{}, 1)}
	}
	e.bg, e.stopBG = context.WithCancel(context.Background())
	e.sched = newScheduler(e.clock, e.sweep)
	if e.gpu != nil {
		e.gpu.Attach(gpuSink{e})
	}
	return e, nil
}

// Recover reconciles every stored sandbox with its runtime and starts
// watching the running ones. Call it once, before serving requests.
func (e *Engine) Recover(ctx context.Context) error {
	if e.fleet != nil {
		if err := e.joinFleet(ctx); err != nil {
			return err
		}
		// Heartbeats from here on: the reconcile below may take longer
		// than the lease the join gave (VMs booting again).
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			e.runFleet(e.bg)
		}()
	}
	if err := e.gpuAdopt(ctx); err != nil {
		return err
	}
	e.sweepVolumes(ctx)
	if err := e.reconcile(ctx); err != nil {
		return err
	}
	sbs, err := e.store.ListSandboxes(ctx, torpor.SandboxFilter{Node: e.node})
	if err != nil {
		return err
	}
	for _, sb := range sbs {
		if e.mine(sb) {
			e.interruptWakeups(ctx, sb)
			e.track(sb)
		}
	}
	e.sched.run(e.bg, &e.wg)
	e.runTrafficFlusher(e.bg)
	e.runMetering(e.bg)
	e.runGPUTicks(e.bg)
	if e.fleet != nil {
		if e.fleet.cfg.Objects != nil {
			e.wg.Add(1)
			go func() {
				defer e.wg.Done()
				e.runUploads(e.bg)
			}()
		}
	}
	return e.startPools(ctx, e.warmPools)
}

// Close stops the engine's background work. Sandboxes keep running; a new
// engine adopts them.
func (e *Engine) Close() {
	e.stopBG()
	e.wg.Wait()
}

// Runtime returns the runtime of a kind ("" for the default).
func (e *Engine) runtime(kind string) (torpor.Runtime, error) {
	if kind == "" {
		kind = e.defKind
	}
	rt, ok := e.runtimes[kind]
	if !ok {
		return nil, torpor.Invalid("runtime.kind", "unknown runtime %q", kind)
	}
	return rt, nil
}

// runtimeFor picks the runtime of a create request: the one named by kind,
// else the default one when it gives the isolation asked for, else the
// first that does.
func (e *Engine) runtimeFor(isolation, kind string) (torpor.Runtime, error) {
	if kind != "" || isolation == "" {
		rt, err := e.runtime(kind)
		if err != nil {
			return nil, err
		}
		if isolation != "" && isolationOf(rt) != isolation {
			return nil, torpor.Invalid("isolation", "runtime %s gives %s isolation, not %s", rt.Kind(), isolationOf(rt), isolation)
		}
		return rt, nil
	}
	if rt := e.runtimes[e.defKind]; isolationOf(rt) == isolation {
		return rt, nil
	}
	for _, info := range e.Runtimes() {
		if info.Isolation == isolation {
			return e.runtimes[info.Kind], nil
		}
	}
	return nil, torpor.Invalid("isolation", "this server has no %s runtime (GET /v1/runtimes lists what it has)", isolation)
}

func isolationOf(rt torpor.Runtime) string {
	if d, ok := rt.(torpor.Describer); ok {
		return d.Describe().Isolation
	}
	return torpor.IsolationContainer
}

// Runtimes describes the runtimes this node can run, sorted by kind.
func (e *Engine) Runtimes() []torpor.RuntimeInfo {
	out := make([]torpor.RuntimeInfo, 0, len(e.runtimes))
	for kind, rt := range e.runtimes {
		info := torpor.RuntimeInfo{Kind: kind, Isolation: torpor.IsolationContainer}
		if d, ok := rt.(torpor.Describer); ok {
			info = d.Describe()
			info.Kind = kind
		}
		info.PauseModes = rt.PauseModes()
		info.Default = kind == e.defKind
		out = append(out, info)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Kind < out[j].Kind })
	return out
}

func (e *Engine) now() time.Time { return e.clock.Now().UTC() }

// Create makes a sandbox for tenant and boots it, or claims a ready
// member of its template's warm pool when the request matches the pool
// (see claim). A boot that fails leaves the sandbox failed with the
// reason; it is returned, not an error.
func (e *Engine) Create(ctx context.Context, tenant string, req torpor.CreateRequest) (*torpor.Sandbox, error) {
	return e.create(ctx, tenant, req, "")
}

// create is Create; a pool names the template whose warm pool the
// sandbox is a member of (its tenant is torpor.PoolTenant), which claims
// nothing.
func (e *Engine) create(ctx context.Context, tenant string, req torpor.CreateRequest, pool string) (*torpor.Sandbox, error) {
	res, err := req.Validate(e.limits)
	if err != nil {
		return nil, err
	}
	tmpl, err := e.store.GetTemplate(ctx, req.Template)
	if err != nil {
		if torpor.IsCode(err, torpor.ENotFound) {
			return nil, torpor.Invalid("template", "no template named %q", req.Template)
		}
		return nil, err
	}
	// The template's defaults (env, setup, entrypoint, resources,
	// isolation) under what the request says, checked again as a whole.
	req = tmpl.Defaults.Apply(req)
	if res, err = req.Validate(e.limits); err != nil {
		return nil, err
	}
	rt, err := e.runtimeFor(req.Isolation, req.Runtime.Kind)
	if err != nil {
		return nil, err
	}
	if a, ok := rt.(torpor.Addresser); req.AllowInternet && (!ok || !a.Networked()) {
		return nil, torpor.Invalid("allow_internet", "sandboxes of the %s runtime have no network to the internet on this server", rt.Kind())
	}
	if err := checkEgress(rt, req.Network); err != nil {
		return nil, err
	}
	now := e.now()
	rc := req.Runtime
	rc.Kind = rt.Kind()
	sb := &torpor.Sandbox{
		ID:               torpor.NewID("", 20),
		Tenant:           tenant,
		Template:         tmpl.Name,
		State:            torpor.StateStarting,
		StateSince:       now,
		CreatedAt:        now,
		LastActivityAt:   now,
		Resources:        res,
		Metadata:         req.Metadata,
		Env:              req.Env,
		Runtime:          rc,
		PauseModes:       rt.PauseModes(),
		Hooks:            req.Hooks,
		IgnoreImageHooks: req.IgnoreImageHooks,
		Ports:            req.Ports,
		TrafficToken:     torpor.NewID("tt_", 32),
		AllowInternet:    req.AllowInternet,
		Usage:            torpor.UsageState{Kind: torpor.UsageRunning, Since: now, SeenAt: now},
		Node:             e.node,
		NodeEpoch:        e.Epoch(),
		Durability:       torpor.DurabilityNode,
	}
	if sb.Metadata == nil {
		sb.Metadata = map[string]string{}
	}
	sb.Timeout, sb.LifecyclePolicy = torpor.Off(), e.defPolicy
	if err := applyPolicy(sb, req.PolicyRequest, now); err != nil {
		return nil, err
	}
	if sb.Wakeups, err = torpor.NewWakeups("wakeups", req.Wakeups, now); err != nil {
		return nil, err
	}
	if err := checkPauseMode(rt, sb); err != nil {
		return nil, err
	}
	if sb.Accel, err = e.gpuAccel(req); err != nil {
		return nil, err
	}
	if err := e.checkSecrets(ctx, tenant, rt, req.Secrets); err != nil {
		return nil, err
	}
	sb.Secrets = req.Secrets
	unlockVolumes := func() {}
	if len(req.VolumeMounts) > 0 {
		// Held until the sandbox is stored, so that a volume it mounts is
		// not deleted in between; not through its boot.
		var once sync.Once
		unlock := e.volumeLocks(tenant, req.VolumeMounts)
		unlockVolumes = func() { once.Do(unlock) }
		defer unlockVolumes()
		if err := e.checkVolumeMounts(ctx, tenant, rt, req.VolumeMounts); err != nil {
			return nil, err
		}
		sb.VolumeMounts = torpor.CloneVolumeMounts(req.VolumeMounts)
	}
	sb.KeyID = req.Caller.KeyID
	sb.NodeLabels = req.NodeLabels
	sb.Network = req.Network.Clone()
	if err := e.leaseErr(); err != nil {
		return nil, err
	}
	if err := e.admitCreate(req); err != nil {
		return nil, err
	}
	cause := CauseAPI
	if pool != "" {
		sb.Pool, cause = pool, CausePool
	} else if claimed, ok, err := e.claim(ctx, sb, *tmpl); err != nil || ok {
		return claimed, err
	}
	unlock := e.locks.Lock(sb.ID)
	defer unlock()
	if err := e.reserve(ctx, sb, torpor.StateStarting); err != nil {
		return nil, err
	}
	created := e.event(sb, torpor.EventCreated, "cause", cause)
	created.Time = now
	e.fail("create.before-store")
	stored := time.Now()
	if err := e.store.CreateSandbox(ctx, sb, created); err != nil {
		e.hold(sb, torpor.StateTerminated)
		return nil, err
	}
	storeTook := time.Since(stored)
	unlockVolumes()
	e.announce()
	e.noteState(sb)
	e.fail("create.before-runtime")
	start := time.Now()
	if err := e.boot(ctx, sb, rt, *tmpl, torpor.EventStarted, cause); err != nil {
		e.abandonCreate(sb.ID, err)
		return nil, err
	}
	e.observe("create", cause, start)
	// For the create benchmark's breakdown (BENCHMARKS.md): the boot
	// holds the runtime's boot and the store write of running.
	e.log.Debug("lifecycle: create steps", "sandbox", sb.ID, "store_ms", storeTook.Seconds()*1000, "boot_ms", time.Since(start).Seconds()*1000)
	return e.view(sb), nil
}

// applyPolicy merges a request's policy fields into sb and checks the
// result.
func applyPolicy(sb *torpor.Sandbox, r torpor.PolicyRequest, now time.Time) error {
	if err := r.Validate(); err != nil {
		return err
	}
	r.Apply(sb, now)
	if r.Lifecycle != nil && r.Lifecycle.OnTimeout != "" && !sb.Timeout.On() {
		return torpor.Invalid("lifecycle.on_timeout", "needs a timeout: set timeout (idle seconds) too")
	}
	return nil
}

// checkPauseMode refuses an idle pause mode sb's runtime cannot do.
func checkPauseMode(rt torpor.Runtime, sb *torpor.Sandbox) error {
	if m := idlePauseMode(sb); m != "" && !supports(rt, m) {
		return torpor.Invalid("lifecycle.pause_mode", "the %s runtime cannot pause by %s; it can: %v", rt.Kind(), m, rt.PauseModes())
	}
	return nil
}

// view returns a copy of sb for a caller, with its schedule filled in and
// its open usage interval counted into its meters.
func (e *Engine) view(sb *torpor.Sandbox) *torpor.Sandbox {
	c := sb.Clone()
	now := e.now()
	if sb.State == torpor.StateRunning {
		// Activity not yet flushed shows, and moves the schedule.
		c.LastActivityAt = e.act.latest(sb.ID, sb.LastActivityAt)
	}
	c.Schedule = schedule(c, e.maxPaused, now)
	if sb.State == torpor.StateRunning && e.unstoredState(sb.ID) == torpor.StatePausing {
		// A pause by freeze under way stores no pausing state
		// (recordsPausing); it shows all the same.
		c.State = torpor.StatePausing
	}
	if r, ok := e.openUsage(sb, now); ok {
		c.Meters.Add(r)
	}
	e.gpuView(c)
	if a, ok := e.runtimes[sb.Runtime.Kind].(torpor.Addresser); ok && sb.State != torpor.StateTerminated {
		if addr, ok := a.Address(context.Background(), ref(sb)); ok {
			c.Address = addr.String()
		}
	}
	return c
}

// save stores sb with events and the usage rows its change closes (see
// meter), then brings the capacity ledger and the scheduler up to date
// with it. Every change of a sandbox goes through it.
func (e *Engine) save(ctx context.Context, sb *torpor.Sandbox, events ...torpor.Event) error {
	usage, meters := sb.Usage, sb.Meters
	rows := e.meter(sb, e.now())
	if err := e.write(ctx, sb, rows, events...); err != nil {
		// Nothing was stored: the interval stays open where it was.
		sb.Usage, sb.Meters = usage, meters
		return err
	}
	return nil
}

// write stores sb with usage rows and events as they are.
func (e *Engine) write(ctx context.Context, sb *torpor.Sandbox, rows []torpor.UsageRecord, events ...torpor.Event) error {
	if e.fleet != nil && sb.Node != e.node {
		// Only its owner changes a sandbox (the fleet's own moves of
		// ownership write through the store themselves).
		return torpor.Moved(sb.ID, sb.Node)
	}
	start := time.Now()
	err := e.store.UpdateSandboxUsage(context.WithoutCancel(ctx), sb, rows, events...)
	e.obs.StoreWrite(time.Since(start))
	if err != nil {
		if torpor.IsDiskFull(err) {
			e.log.Warn("the data disk is full: a change of a sandbox was not stored", "sandbox", sb.ID, "state", sb.State)
		}
		return err
	}
	if len(rows) > 0 {
		e.obs.UsageRows(len(rows))
	}
	e.track(sb)
	if len(events) > 0 {
		e.announce()
	}
	return nil
}

// EventsChanged returns a channel that is closed when new events are
// stored or a sandbox changes state, for streams that follow the event
// log and for what keeps a sandbox's record until it changes.
func (e *Engine) EventsChanged() <-chan struct{} {
	e.evMu.Lock()
	defer e.evMu.Unlock()
	return e.evCh
}

// announce wakes every follower of the event log.
func (e *Engine) announce() {
	e.evMu.Lock()
	defer e.evMu.Unlock()
	close(e.evCh)
	e.evCh = make(chan struct{})
}

// track records what sb holds and when the idle engine acts on it next.
func (e *Engine) track(sb *torpor.Sandbox) {
	e.noteState(sb)
	e.hold(sb, sb.State)
	if evs := plan(sb, e.maxPaused); len(evs) > 0 {
		e.sched.set(sb.ID, evs[0].At)
	} else {
		e.sched.remove(sb.ID)
	}
}

// boot boots sb's instance fresh and records running, or failed with the
// reason when the runtime says the boot itself failed. sb must be in the
// in-between state that led here (starting or restarting).
func (e *Engine) boot(ctx context.Context, sb *torpor.Sandbox, rt torpor.Runtime, tmpl torpor.Template, evType, cause string) error {
	e.unwatch(sb.ID)
	e.gpuRelease(ctx, sb) // the lease of the boot before, if any
	// The secrets' values as they are now, for this boot only: never
	// kept in sb (secrets.go).
	env, err := e.secretEnv(ctx, sb, sb.Env)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !torpor.IsCode(err, torpor.EConflict) && !torpor.IsCode(err, torpor.EInvalid) {
			return err
		}
		return e.recordFailure(ctx, sb, secretFailure(err))
	}
	vols, err := e.volumeBinds(ctx, sb)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if !torpor.IsCode(err, torpor.EConflict) {
			return err
		}
		return e.recordFailure(ctx, sb, &torpor.Failure{Code: FailureVolume, Message: "volumes: " + err.Error()})
	}
	handle, err := e.bootRuntime(ctx, rt, torpor.BootSpec{
		Volumes:    vols,
		SandboxID:  sb.ID,
		Template:   tmpl,
		Resources:  sb.Resources,
		Env:        env,
		Hostname:   sb.ID,
		Setup:      sb.Runtime.Setup,
		Entrypoint: sb.Runtime.Entrypoint,
		// The runtime's network lets the sandbox out only with it.
		AllowInternet: sb.AllowInternet,
		Network:       sb.Network.Clone(),
	})
	e.fail(string(sb.State) + ".after-runtime")
	sb.Boots++
	if err != nil {
		if ctx.Err() != nil {
			// The caller went away: the boot will be finished by the next
			// reconcile rather than recorded as a failure it was not.
			return ctx.Err()
		}
		return e.recordFailure(ctx, sb, bootFailure(err))
	}
	sb.Handle = handle
	sb.Failure = nil
	sb.PauseMode = ""
	if err := e.writeSecretFiles(ctx, rt, sb); err != nil {
		_ = e.stopRuntime(ctx, rt, sb)
		return e.recordFailure(ctx, sb, secretFailure(err))
	}
	// The idle clock starts when the sandbox runs: a slow boot (a VM
	// under emulation, a long setup) is not idle time.
	sb.LastActivityAt = e.now()
	if evType != torpor.EventRestarted {
		renewEnd(sb, sb.LastActivityAt)
	}
	if err := e.gpuAttach(ctx, sb); err != nil {
		_ = e.stopRuntime(ctx, rt, sb)
		return e.recordFailure(ctx, sb, &torpor.Failure{Code: FailureGPU, Message: err.Error()})
	}
	kv := []string{"boot", fmt.Sprint(sb.Boots), "cause", cause}
	if sb.Archive != nil {
		kv = append(kv, "restored_from", "archive")
	}
	if err := e.setState(ctx, sb, torpor.StateRunning, e.event(sb, evType, kv...)); err != nil {
		return err
	}
	e.fail(landed(evType))
	e.watch(sb.ID, sb.Handle, rt)
	e.runHooks(ctx, sb, torpor.HookOnStart)
	return nil
}

func bootFailure(err error) *torpor.Failure {
	var te *torpor.Error
	if errors.As(err, &te) && te.Reason == torpor.FailureSetup {
		return &torpor.Failure{Code: torpor.FailureSetup, Message: te.Message}
	}
	if torpor.IsDiskFull(err) {
		// Said so, without the host's paths.
		return &torpor.Failure{Code: torpor.FailureRuntime, Message: "boot failed: " + torpor.DiskFullMessage}
	}
	return &torpor.Failure{Code: torpor.FailureRuntime, Message: "boot failed: " + err.Error()}
}

func (e *Engine) recordFailure(ctx context.Context, sb *torpor.Sandbox, f *torpor.Failure) error {
	e.gpuRelease(ctx, sb)
	sb.Failure = f
	sb.PauseMode = ""
	ev := e.event(sb, torpor.EventFailed, "code", f.Code, "message", f.Message)
	e.log.Warn("sandbox failed", "sandbox", sb.ID, "code", f.Code, "message", f.Message)
	e.obs.Transition("fail", f.Code, 0)
	return e.setState(ctx, sb, torpor.StateFailed, ev)
}

// setState moves sb to state and stores it with events.
func (e *Engine) setState(ctx context.Context, sb *torpor.Sandbox, s torpor.State, events ...torpor.Event) error {
	changed := sb.State != s
	if changed {
		sb.State = s
		sb.StateSince = e.now()
		// The events of a transition carry the instant it happened, which
		// is also where a usage interval it closes ends.
		for i := range events {
			events[i].Time = sb.StateSince
		}
	}
	if err := e.save(ctx, sb, events...); err != nil {
		return err
	}
	if changed && s != torpor.StateRunning && s != torpor.StatePausing {
		// Pausing is not yet stopped: the freeze may fail and the sandbox
		// run on. Once paused (or on its way out) it stops running.
		e.stoppedRunning(sb.ID)
	}
	if changed && len(events) == 0 {
		// A transition without an event of its own (pausing, resuming,
		// starting) still tells the followers (the proxy keeps what it
		// knows of a running sandbox until then).
		e.announce()
	}
	return nil
}

func (e *Engine) event(sb *torpor.Sandbox, typ string, kv ...string) torpor.Event {
	ev := torpor.Event{Type: typ, SandboxID: sb.ID, Tenant: sb.Tenant, Time: e.now()}
	if len(kv) > 0 {
		ev.Attrs = map[string]string{}
		for i := 0; i+1 < len(kv); i += 2 {
			ev.Attrs[kv[i]] = kv[i+1]
		}
	}
	return ev
}

// Get returns one of tenant's sandboxes.
func (e *Engine) Get(ctx context.Context, tenant, id string) (*torpor.Sandbox, error) {
	sb, err := e.load(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	return e.view(sb), nil
}

// load reads a sandbox and hides other tenants' ones behind not_found.
func (e *Engine) load(ctx context.Context, tenant, id string) (*torpor.Sandbox, error) {
	notFound := torpor.Errorf(torpor.ENotFound, "no sandbox %q", id)
	notFound.Param = "id"
	if !torpor.ValidID(id) {
		return nil, notFound
	}
	sb, err := e.store.GetSandbox(ctx, id)
	if err != nil {
		if torpor.IsCode(err, torpor.ENotFound) {
			return nil, notFound
		}
		return nil, err
	}
	if sb.Tenant != tenant {
		return nil, notFound
	}
	return sb, nil
}

// AllTenants, given as the tenant of List or Events, reads every tenant's
// sandboxes or events but the warm pools' (torpor.PoolTenant), which no
// caller sees. Only an admin may ask for it (the API checks).
const AllTenants = "*"

// List returns tenant's sandboxes that match f (tenant AllTenants: every
// tenant's but the pools').
func (e *Engine) List(ctx context.Context, tenant string, f torpor.SandboxFilter) ([]*torpor.Sandbox, error) {
	for _, s := range f.States {
		if !s.Valid() {
			return nil, torpor.Invalid("state", "unknown state %q", s)
		}
	}
	if err := torpor.ValidateMetadata("metadata", f.Metadata); err != nil {
		return nil, err
	}
	if tenant == "" {
		return nil, nil
	}
	f.Tenant, f.ExceptTenant = tenantFilter(tenant)
	sbs, err := e.store.ListSandboxes(ctx, f)
	for i, sb := range sbs {
		sbs[i] = e.view(sb)
	}
	return sbs, err
}

// Events returns tenant's events after a cursor (tenant AllTenants: every
// tenant's but the pools').
func (e *Engine) Events(ctx context.Context, tenant string, f torpor.EventFilter) ([]torpor.Event, error) {
	if f.SandboxID != "" && tenant == AllTenants {
		// A sandbox's events are read as its tenant, so that a pool
		// member's stay hidden.
		return nil, torpor.Invalid("tenant", "a sandbox's events are read as its tenant, not every tenant")
	}
	if f.SandboxID != "" {
		if _, err := e.load(ctx, tenant, f.SandboxID); err != nil {
			return nil, err
		}
	}
	if f.After < 0 {
		return nil, torpor.Invalid("since", "cursor must not be negative")
	}
	if tenant == "" {
		return nil, nil
	}
	f.Tenant, f.ExceptTenant = tenantFilter(tenant)
	return e.store.ListEvents(ctx, f)
}

// tenantFilter is the store's tenant condition for a reader's tenant:
// that tenant's rows, or for AllTenants every tenant's but the pools'.
// The store reads an empty tenant as every tenant, so List and Events
// answer an empty one (no caller has it) with nothing before they get
// here.
func tenantFilter(tenant string) (only, except string) {
	if tenant == AllTenants {
		return "", torpor.PoolTenant
	}
	return tenant, ""
}

// Update changes a sandbox's metadata.
func (e *Engine) Update(ctx context.Context, tenant, id string, req torpor.UpdateRequest) (*torpor.Sandbox, error) {
	unlock := e.locks.Lock(id)
	defer unlock()
	sb, err := e.load(ctx, tenant, id)
	if err != nil {
		return nil, err
	}
	if sb.State == torpor.StateTerminated {
		return nil, gone(sb)
	}
	md := map[string]string{}
	for k, v := range sb.Metadata {
		md[k] = v
	}
	for k, v := range req.Metadata {
		if v == nil || *v == "" {
			delete(md, k)
		} else {
			md[k] = *v
		}
	}
	if err := torpor.ValidateMetadata("metadata", md); err != nil {
		return nil, err
	}
	sb.Metadata = md
	if err := applyPolicy(sb, req.PolicyRequest, e.now()); err != nil {
		return nil, err
	}
	if rt, err := e.runtime(sb.Runtime.Kind); err == nil {
		if err := checkPauseMode(rt, sb); err != nil {
			return nil, err
		}
	}
	if req.Hooks != nil {
		if err := torpor.ValidateHooks(*req.Hooks); err != nil {
			return nil, err
		}
		sb.Hooks = *req.Hooks
	}
	if req.Ports != nil {
		if err := torpor.ValidatePorts(*req.Ports); err != nil {
			return nil, err
		}
		sb.Ports = *req.Ports
	}
	if req.Wakeups != nil {
		if sb.Wakeups, err = torpor.NewWakeups("wakeups", *req.Wakeups, e.now()); err != nil {
			return nil, err
		}
	}
	if req.Network != nil {
		if err := e.updateEgress(ctx, sb, req.Network); err != nil {
			return nil, err
		}
	}
	if err := e.save(ctx, sb, e.event(sb, "sandbox.updated")); err != nil {
		return nil, err
	}
	return e.view(sb), nil
}

func gone(sb *torpor.Sandbox) error {
	return &torpor.Error{Code: torpor.EGone, State: sb.State, Message: fmt.Sprintf("sandbox %s is terminated", sb.ID)}
}

// NextDeadline returns when the idle engine next looks at a sandbox.
func (e *Engine) NextDeadline(id string) (time.Time, bool) { return e.sched.next(id) }
