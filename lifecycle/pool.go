package lifecycle

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sort"
	"sync"
	"time"

	"github.com/torpor-dev/torpor"
)

// Warm pools (docs/pools.md) keep sandboxes of a template booted and
// frozen, so that a create that asks for nothing a default boot of the
// template does not give claims one and only thaws it.
//
// A ready member is an ordinary sandbox record owned by torpor.PoolTenant,
// which no key can act as: no tenant lists, gets, follows or is billed
// for it, and the proxy does not reach it. Its id is fresh and random and
// shown to no one until a claim makes it the claimant's, which is why the
// claimant's id is also the hostname the member booted with. A claim
// writes the claimant's tenant, metadata, env, traffic token, policy and
// hooks on the record in one store write, with the events of a cold
// create; a member is claimed once, and a claimed sandbox is the
// claimant's until it is deleted, so nothing of one claimant ever reaches
// the next. The refill runs in the background, one boot at a time.

// CausePool is the cause on the events of a pool member's own
// transitions (its boot, its freeze, its removal).
const CausePool = "pool"

// poolRetry is how long a refill that failed (the node full, a boot that
// failed) waits before it tries again.
const poolRetry = 5 * time.Second

// poolMaxRetry bounds the retry's backoff.
const poolMaxRetry = 5 * time.Minute

// bootSpec is what a boot of a sandbox depends on beyond its template:
// a create claims a member only when its spec is the member's.
type bootSpec struct {
	kind       string
	resources  torpor.Resources
	setup      []string
	entrypoint []string
	internet   bool
}

func specOf(sb *torpor.Sandbox) bootSpec {
	return bootSpec{kind: sb.Runtime.Kind, resources: sb.Resources, setup: sb.Runtime.Setup,
		entrypoint: sb.Runtime.Entrypoint, internet: sb.AllowInternet}
}

func (a bootSpec) equal(b bootSpec) bool {
	return a.kind == b.kind && a.resources == b.resources && a.internet == b.internet &&
		slices.Equal(a.setup, b.setup) && slices.Equal(a.entrypoint, b.entrypoint)
}

// member is a ready pool member as the pools know it.
type member struct {
	id   string
	spec bootSpec
	// booted orders the members; stamp is when the template the member
	// booted from was stored, which a template stored again since makes
	// stale.
	booted time.Time
	stamp  time.Time
}

// stampKey is the metadata key under which a member keeps its stamp over
// a restart; the claim replaces the member's metadata with the
// claimant's.
const stampKey = "torpor.pool/template-stored"

func memberOf(sb *torpor.Sandbox) member {
	stamp, _ := time.Parse(time.RFC3339Nano, sb.Metadata[stampKey])
	return member{id: sb.ID, spec: specOf(sb), booted: sb.CreatedAt, stamp: stamp}
}

// current reports whether m is what a default create of its template,
// stored at stored, boots now.
func (m member) current(spec bootSpec, stored time.Time) bool {
	return m.spec.equal(spec) && m.stamp.Equal(stored)
}

// pool is one template's warm pool.
type pool struct {
	size     int
	internet bool
	ready    []member // oldest first
	hits     int64
	misses   int64
	lastErr  string
}

// pools holds every template's warm pool. Its lock is never held across a
// store or runtime call.
type pools struct {
	mu     sync.Mutex
	byName map[string]*pool
	// setMu orders SetPool's store writes with what they set.
	setMu sync.Mutex
	// wake is signalled when the refill has something to do.
	wake chan struct{}
}

func newPools() *pools {
	return &pools{byName: map[string]*pool{}, wake: make(chan struct{}, 1)}
}

func (p *pools) kick() {
	select {
	case p.wake <- struct{}{}:
	default:
	}
}

// get returns template's pool, made when missing; p.mu must be held.
func (p *pools) getLocked(template string) *pool {
	pl := p.byName[template]
	if pl == nil {
		pl = &pool{}
		p.byName[template] = pl
	}
	return pl
}

// take removes and returns the oldest ready member of template's pool
// whose spec is want. matched says whether the pool was there for the
// request at all: a pool of size 0, or one whose members were booted to
// another spec, is no match and no miss; an empty pool that is there is a
// miss.
func (p *pools) take(template string, want bootSpec, stored time.Time) (m member, ok, matched bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pl := p.byName[template]
	if pl == nil || pl.size == 0 {
		return member{}, false, false
	}
	for i, c := range pl.ready {
		if c.current(want, stored) {
			pl.ready = slices.Delete(pl.ready, i, i+1)
			return c, true, true
		}
	}
	if len(pl.ready) > 0 {
		// Members there are, of another spec: the request is not the
		// pool's (its resources, setup, entrypoint or network differ),
		// or the template was stored again since they booted, which the
		// refill must hear of to replace them.
		for _, c := range pl.ready {
			if !c.stamp.Equal(stored) {
				p.kick()
				break
			}
		}
		return member{}, false, false
	}
	pl.misses++
	return member{}, false, true
}

// put makes m ready in template's pool again (a claim that went no
// further); newest members go last, so the oldest is claimed first.
func (p *pools) put(template string, m member) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pl := p.getLocked(template)
	pl.ready = append(pl.ready, m)
	sort.Slice(pl.ready, func(i, j int) bool { return pl.ready[i].booted.Before(pl.ready[j].booted) })
}

// configs returns the config of every pool.
func (p *pools) configs() []torpor.PoolConfig {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []torpor.PoolConfig
	for name, pl := range p.byName {
		out = append(out, torpor.PoolConfig{Template: name, Size: pl.size, AllowInternet: pl.internet})
	}
	return out
}

// status is pl's status; the pools' lock must be held.
func (pl *pool) status(template string) torpor.PoolStatus {
	return torpor.PoolStatus{PoolConfig: torpor.PoolConfig{Template: template, Size: pl.size, AllowInternet: pl.internet},
		Ready: len(pl.ready), Hits: pl.hits, Misses: pl.misses, LastError: pl.lastErr}
}

// Pools returns every warm pool that has a size or members, by template.
func (e *Engine) Pools() []torpor.PoolStatus {
	e.pools.mu.Lock()
	defer e.pools.mu.Unlock()
	out := []torpor.PoolStatus{}
	for _, name := range slices.Sorted(maps.Keys(e.pools.byName)) {
		pl := e.pools.byName[name]
		if pl.size == 0 && len(pl.ready) == 0 && pl.hits == 0 && pl.misses == 0 {
			continue
		}
		out = append(out, pl.status(name))
	}
	return out
}

// SetPool sets template's pool size (0 turns the pool off and removes its
// members) and, when internet is not nil, whether its members reach the
// internet, and stores the pool, so that a restart keeps it. The refill
// and the removal run in the background.
func (e *Engine) SetPool(ctx context.Context, template string, size int, internet *bool) (torpor.PoolStatus, error) {
	if err := torpor.ValidatePoolSize("size", size); err != nil {
		return torpor.PoolStatus{}, err
	}
	if _, err := e.store.GetTemplate(ctx, template); err != nil {
		if torpor.IsCode(err, torpor.ENotFound) {
			nf := torpor.Errorf(torpor.ENotFound, "no template named %q", template)
			nf.Param = "template"
			return torpor.PoolStatus{}, nf
		}
		return torpor.PoolStatus{}, err
	}
	// One SetPool at a time: what is stored is what the pools hold.
	e.pools.setMu.Lock()
	defer e.pools.setMu.Unlock()
	e.pools.mu.Lock()
	c := torpor.PoolConfig{Template: template, Size: size, AllowInternet: e.pools.getLocked(template).internet}
	e.pools.mu.Unlock()
	if internet != nil {
		c.AllowInternet = *internet
	}
	if size > 0 {
		// A pool that could never fill is refused now rather than
		// retried for ever: its template's defaults must make a valid
		// create on this server, with the network it asks for.
		if err := e.checkPoolBoot(ctx, c); err != nil {
			return torpor.PoolStatus{}, err
		}
	}
	if err := e.store.SetPool(ctx, c); err != nil {
		return torpor.PoolStatus{}, err
	}
	e.pools.mu.Lock()
	pl := e.pools.getLocked(template)
	var stale []member
	if pl.internet != c.AllowInternet {
		// Members booted with the other network are no longer the
		// pool's: they go now, so that ready counts only members a
		// create can claim.
		stale, pl.ready = pl.ready, nil
	}
	pl.size, pl.internet = c.Size, c.AllowInternet
	st := pl.status(template)
	e.pools.mu.Unlock()
	for _, m := range stale {
		e.removeLater(m.id)
	}
	e.pools.kick()
	return st, nil
}

// startPools sets the pools (the configured ones under those the store
// kept from SetPool), takes the members the reconcile left frozen as
// ready, removes the others, and starts the refill.
func (e *Engine) startPools(ctx context.Context, configured []torpor.PoolConfig) error {
	stored, err := e.store.PoolConfigs(ctx)
	if err != nil {
		return err
	}
	configs := append(slices.Clone(configured), stored...) // later ones win
	sbs, err := e.store.ListSandboxes(ctx, torpor.SandboxFilter{Tenant: torpor.PoolTenant, Node: e.node})
	if err != nil {
		return err
	}
	e.pools.mu.Lock()
	for _, c := range configs {
		pl := e.pools.getLocked(c.Template)
		pl.size, pl.internet = c.Size, c.AllowInternet
	}
	var broken []string
	for _, sb := range sbs {
		if sb.State == torpor.StateTerminated || !e.mine(sb) {
			continue
		}
		if sb.Pool == "" || sb.State != torpor.StatePaused || sb.PauseMode != torpor.PauseFreeze {
			broken = append(broken, sb.ID)
			continue
		}
		pl := e.pools.getLocked(sb.Pool)
		pl.ready = append(pl.ready, memberOf(sb))
	}
	e.pools.mu.Unlock()
	for _, id := range broken {
		e.removeMember(ctx, id)
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		e.runRefill(e.bg)
	}()
	e.pools.kick()
	return nil
}

// runRefill keeps every pool at its size until ctx ends: it boots the
// members missing, one at a time, and removes those over the size. A
// failed round is tried again after poolRetry.
func (e *Engine) runRefill(ctx context.Context) {
	retry := make(chan struct{}, 1)
	var backoff time.Duration
	for {
		// After a failed round only its retry starts the next one: a
		// member removed (or lost) right after its boot kicks the refill,
		// which would otherwise boot again at once, forever.
		wake := e.pools.wake
		if backoff > 0 {
			wake = nil
		}
		select {
		case <-ctx.Done():
			return
		case <-wake:
		case <-retry:
		}
		if e.refill(ctx) {
			backoff = 0
			continue
		}
		if ctx.Err() != nil {
			return
		}
		backoff = min(max(2*backoff, poolRetry), poolMaxRetry)
		e.clock.AfterFunc(backoff, func() {
			select {
			case retry <- struct{}{}:
			default:
			}
		})
	}
}

// defaultSpec is the boot spec of a create that asks for nothing but the
// pool's template (and its internet), and when the template was (last)
// stored.
func (e *Engine) defaultSpec(ctx context.Context, c torpor.PoolConfig) (bootSpec, time.Time, error) {
	tmpl, err := e.store.GetTemplate(ctx, c.Template)
	if err != nil {
		return bootSpec{}, time.Time{}, err
	}
	req := tmpl.Defaults.Apply(torpor.CreateRequest{Template: c.Template, IgnoreImageHooks: true, AllowInternet: c.AllowInternet})
	res, err := req.Validate(e.limits)
	if err != nil {
		return bootSpec{}, time.Time{}, err
	}
	rt, err := e.runtimeFor(req.Isolation, req.Runtime.Kind)
	if err != nil {
		return bootSpec{}, time.Time{}, err
	}
	return bootSpec{kind: rt.Kind(), resources: res, setup: req.Runtime.Setup, entrypoint: req.Runtime.Entrypoint,
		internet: req.AllowInternet}, tmpl.CreatedAt, nil
}

// checkPoolBoot reports why a default create of c's template could not
// boot on this server, as a create would say it.
func (e *Engine) checkPoolBoot(ctx context.Context, c torpor.PoolConfig) error {
	spec, _, err := e.defaultSpec(ctx, c)
	if err != nil {
		return err
	}
	rt, err := e.runtime(spec.kind)
	if err != nil {
		return err
	}
	if a, ok := rt.(torpor.Addresser); c.AllowInternet && (!ok || !a.Networked()) {
		return torpor.Invalid("allow_internet", "sandboxes of the %s runtime have no network to the internet on this server", rt.Kind())
	}
	return nil
}

// dropStale removes from template's pool the ready members that a
// default create of it would no longer boot (the template was stored
// again after they booted, or its defaults changed) and returns them.
func (p *pools) dropStale(template string, spec bootSpec, stored time.Time) []member {
	p.mu.Lock()
	defer p.mu.Unlock()
	pl := p.getLocked(template)
	var stale []member
	pl.ready = slices.DeleteFunc(pl.ready, func(m member) bool {
		if m.current(spec, stored) {
			return false
		}
		stale = append(stale, m)
		return true
	})
	return stale
}

// refill brings every pool to its size once; false when something failed
// and a retry is due.
func (e *Engine) refill(ctx context.Context) bool {
	ok := true
	for _, c := range e.pools.configs() {
		name, size := c.Template, c.Size
		if spec, stored, err := e.defaultSpec(ctx, c); err == nil {
			for _, m := range e.pools.dropStale(name, spec, stored) {
				e.removeMember(ctx, m.id)
			}
		} else if size > 0 {
			e.setPoolErr(name, err)
			ok = false
			continue
		}
		for ctx.Err() == nil {
			e.pools.mu.Lock()
			pl := e.pools.getLocked(name)
			n := len(pl.ready)
			var extra member
			if n > size {
				// The newest goes first: the oldest stay to be claimed.
				extra = pl.ready[n-1]
				pl.ready = pl.ready[:n-1]
			}
			e.pools.mu.Unlock()
			if n > size {
				e.removeMember(ctx, extra.id)
				continue
			}
			if n == size {
				break
			}
			m, err := e.bootMember(ctx, c)
			if err != nil && ctx.Err() != nil {
				return false
			}
			e.setPoolErr(name, err)
			if err != nil {
				ok = false
				break
			}
			e.pools.put(name, m)
		}
	}
	return ok
}

// setPoolErr records the outcome of template's last refill, and logs a
// failure when it is not the one the refill before logged (a retry every
// poolRetry of a template that is missing says so once).
func (e *Engine) setPoolErr(template string, err error) {
	msg := ""
	if err != nil {
		msg = err.Error()
	}
	e.pools.mu.Lock()
	pl := e.pools.getLocked(template)
	changed := pl.lastErr != msg
	pl.lastErr = msg
	e.pools.mu.Unlock()
	if err != nil && changed {
		e.log.Warn("refilling a warm pool", "template", template, "err", err)
	}
}

// bootMember boots one member of template's pool and freezes it.
func (e *Engine) bootMember(ctx context.Context, c torpor.PoolConfig) (member, error) {
	template := c.Template
	tmpl, err := e.store.GetTemplate(ctx, template)
	if err != nil {
		return member{}, err
	}
	// The template's own hooks run at the claim, as the claimant's.
	sb, err := e.create(ctx, torpor.PoolTenant, torpor.CreateRequest{
		Template: template, IgnoreImageHooks: true, AllowInternet: c.AllowInternet,
		Metadata: map[string]string{stampKey: tmpl.CreatedAt.UTC().Format(time.RFC3339Nano)},
	}, template)
	if err != nil {
		return member{}, err
	}
	if sb.State != torpor.StateRunning {
		msg := "the boot failed"
		if sb.Failure != nil {
			msg = sb.Failure.Message
		}
		e.removeMember(ctx, sb.ID)
		return member{}, errors.New(msg)
	}
	unlock := e.locks.Lock(sb.ID)
	defer unlock()
	cur, err := e.store.GetSandbox(ctx, sb.ID)
	if err == nil {
		err = e.pause(ctx, cur, torpor.PauseFreeze, CausePool)
	}
	if err == nil && (cur.State != torpor.StatePaused || cur.PauseMode != torpor.PauseFreeze) {
		err = errors.New("the pool member did not freeze")
	}
	if err != nil {
		e.removeLater(sb.ID)
		return member{}, err
	}
	return memberOf(cur), nil
}

// memberLost takes a member whose instance died out of template's pool,
// removes it in the background and has the refill replace it.
func (e *Engine) memberLost(template, id string) {
	e.pools.mu.Lock()
	pl := e.pools.getLocked(template)
	pl.ready = slices.DeleteFunc(pl.ready, func(m member) bool { return m.id == id })
	e.pools.mu.Unlock()
	e.removeLater(id)
}

// removeLater removes a member in the background (the caller may hold its
// lock) and has the refill replace it.
func (e *Engine) removeLater(id string) {
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		e.removeMember(e.bg, id)
		e.pools.kick()
	}()
}

// removeMember deletes a pool member that is still the pool's.
func (e *Engine) removeMember(ctx context.Context, id string) {
	unlock := e.locks.Lock(id)
	defer unlock()
	sb, err := e.store.GetSandbox(ctx, id)
	if err != nil || sb.Tenant != torpor.PoolTenant {
		return
	}
	if err := e.terminate(ctx, sb, CausePool); err != nil {
		e.log.Warn("removing a warm pool member", "sandbox", id, "err", err)
	}
}

// claim gives want, a create's sandbox ready to boot, a ready member of
// its template's pool when one has want's boot spec: the member becomes
// want's, running, and is returned. ok false (and no error) is a create
// that boots cold: no pool matched it, the pool had no member ready, or
// the members tried could not be claimed.
func (e *Engine) claim(ctx context.Context, want *torpor.Sandbox, tmpl torpor.Template) (sb *torpor.Sandbox, ok bool, err error) {
	if want.Accel != nil || len(want.Secrets) > 0 || len(want.VolumeMounts) > 0 || !want.Network.Empty() {
		// A member booted without the claimant's GPU lease, secrets or
		// volumes.
		return nil, false, nil
	}
	for {
		m, found, _ := e.pools.take(want.Template, specOf(want), tmpl.CreatedAt)
		if !found {
			return nil, false, nil
		}
		sb, claimed, err := e.claimMember(ctx, m, want)
		// The refill replaces what went, once it is known to be gone (a
		// refused claim puts its member back).
		e.pools.kick()
		if err != nil {
			return nil, false, err
		}
		if claimed {
			e.pools.mu.Lock()
			e.pools.getLocked(want.Template).hits++
			e.pools.mu.Unlock()
			return sb, true, nil
		}
	}
}

// claimMember makes member m want's. claimed false with no error: m was
// no longer a ready member (it died, or broke), and is removed; the next
// one may be tried. An error (the tenant's quota, the node's capacity, the
// store) leaves m ready.
func (e *Engine) claimMember(ctx context.Context, m member, want *torpor.Sandbox) (*torpor.Sandbox, bool, error) {
	start := time.Now()
	unlock := e.locks.Lock(m.id)
	defer unlock()
	sb, err := e.store.GetSandbox(ctx, m.id)
	if err != nil || sb.Tenant != torpor.PoolTenant || sb.Pool != want.Template ||
		sb.State != torpor.StatePaused || sb.PauseMode != torpor.PauseFreeze {
		e.removeLater(m.id)
		return nil, false, nil
	}
	rt, err := e.runtime(sb.Runtime.Kind)
	if err != nil {
		return nil, false, nil
	}
	old := sb.Clone()
	// The member's charge leaves the pool; the claimant's tenant's quota
	// and the node's capacity admit it running, as a cold create would be.
	e.quotas.set(sb.ID, torpor.PoolTenant, torpor.QuotaUsage{})
	sb.Tenant = want.Tenant
	if err := e.reserve(ctx, sb, torpor.StateRunning); err != nil {
		e.hold(old, torpor.StatePaused)
		e.pools.put(want.Template, m)
		return nil, false, err
	}
	if err := e.thawInstance(ctx, rt, sb); err != nil {
		e.hold(old, torpor.StatePaused)
		e.log.Warn("thawing a warm pool member", "sandbox", sb.ID, "err", err)
		e.removeLater(m.id)
		return nil, false, nil
	}
	// A crash here leaves a running instance whose record is still the
	// pool's, frozen: a restart's reconcile removes it, and no tenant
	// ever heard of it.
	e.fail("claim.after-thaw")
	now := e.now()
	// The pool's time is the pool's (its rows carry PoolTenant): the
	// claimant's meters start at the claim.
	sb.Tenant = torpor.PoolTenant
	rows := e.closeUsage(sb, now)
	takeOver(sb, want, now)
	created := e.event(sb, torpor.EventCreated, "cause", CauseAPI, "pool", "true")
	started := e.event(sb, torpor.EventStarted, "boot", "1", "cause", CauseAPI, "pool", "true")
	created.Time, started.Time = now, now
	if err := e.write(ctx, sb, rows, created, started); err != nil {
		if ferr := e.freezeInstance(ctx, rt, old); ferr != nil {
			e.removeLater(m.id)
		} else {
			e.pools.put(want.Template, m)
		}
		e.hold(old, torpor.StatePaused)
		return nil, false, err
	}
	// A crash here leaves the claimant's running sandbox, stored, whose
	// on-start hooks never ran (as a crash after a cold boot's last write
	// does).
	e.fail("claim.after-store")
	e.observe("create", CausePool, start)
	e.runHooks(ctx, sb, torpor.HookOnStart)
	return e.view(sb), true, nil
}

// takeOver writes what is want's on sb, a thawed member, at now: its
// owner, what it is told, its policy, and a fresh start of everything
// counted.
func takeOver(sb, want *torpor.Sandbox, now time.Time) {
	sb.Tenant = want.Tenant
	sb.KeyID = want.KeyID
	sb.NodeLabels = want.NodeLabels
	sb.Metadata = want.Metadata
	sb.Wakeups = want.Wakeups
	sb.Env = want.Env
	sb.Hooks, sb.IgnoreImageHooks, sb.HookFailure = want.Hooks, want.IgnoreImageHooks, nil
	sb.Ports = want.Ports
	sb.TrafficToken = want.TrafficToken
	sb.Timeout, sb.Lifecycle, sb.LifecyclePolicy = want.Timeout, want.Lifecycle, want.LifecyclePolicy
	sb.EndAt, sb.EndAfterSeconds, sb.OnEnd = want.EndAt, want.EndAfterSeconds, want.OnEnd
	sb.PauseModes = want.PauseModes
	sb.Pool, sb.FromPool = "", true
	sb.State, sb.StateSince, sb.PauseMode = torpor.StateRunning, now, ""
	sb.CreatedAt, sb.LastActivityAt = now, now
	renewEnd(sb, now)
	sb.Meters = torpor.Meters{}
	sb.Usage = torpor.UsageState{Kind: torpor.UsageRunning, Since: now, SeenAt: now}
}

// claimEnv is the environment a command started in sb runs with: env over
// the sandbox's own. A sandbox booted for its create has its env in every
// process already; one claimed from a pool booted with its template's, so
// the claimant's env is given to each command it runs.
func claimEnv(sb *torpor.Sandbox, env map[string]string) map[string]string {
	if !sb.FromPool || len(sb.Env) == 0 {
		return env
	}
	out := maps.Clone(sb.Env)
	maps.Copy(out, env)
	return out
}
