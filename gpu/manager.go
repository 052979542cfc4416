package gpu

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"
	"time"

	"github.com/torpor-dev/torpor"
)

// EventKind names something the manager did on its own.
type EventKind string

const (
	EventAutoPaused    EventKind = "gpu.auto_paused"
	EventWatchdogKill  EventKind = "gpu.watchdog_kill"
	EventDead          EventKind = "gpu.dead"
	EventWatchdogBlind EventKind = "gpu.watchdog_blind"
)

// Event tells the daemon what the manager did on its own, so that it can
// update the sandbox (a killed lease's sandbox fails) and tell the user.
type Event struct {
	LeaseID string
	Kind    EventKind
	Reason  string
	At      time.Time
}

// Sink is what the manager reports to: its idle sweep pauses leases
// through it, and it is told what the manager did on its own. The
// lifecycle engine is a node's sink: it pauses a lease's whole sandbox,
// not the lease alone, and fails the sandbox of a lease that died. It is
// given the manager and attaches itself (Attach): the dependency runs one
// way, from the engine to the manager, and the daemon wires neither to
// the other.
type Sink interface {
	// PauseIdle pauses lease id for the idle sweep through the path of a
	// manual pause, which ends in Manager.Pause with the context it was
	// given (the sweep's, marked by WithAutoPause).
	PauseIdle(ctx context.Context, id string) error
	// LeaseEvent is told what the manager did on its own. It is called on
	// the manager's own paths (Tick, Resume, Adopt) and must not block.
	LeaseEvent(Event)
}

// Options are what NewManager needs. Host and Clock are required.
type Options struct {
	Host  Host
	Clock torpor.Clock
	// Worker controls the leases' workers' reservations; nil: no
	// reservation control (the worker holds what it holds).
	Worker Worker
	Config Config
	// Store persists records and rows; nil keeps nothing.
	Store   Store
	Flagger Flagger
	// Pause is what the idle sweep calls to pause a lease (see
	// Sink.PauseIdle); nil: Manager.Pause. OnEvent is told the events;
	// nil: no one. A sink made after the manager replaces both (Attach).
	Pause   func(ctx context.Context, id string) error
	OnEvent func(Event)
	Log     *slog.Logger
}

// Manager holds the GPU leases of one host.
type Manager struct {
	host    Host
	worker  Worker
	clock   torpor.Clock
	cfg     Config
	store   Store
	flagger Flagger
	log     *slog.Logger

	mu      sync.Mutex
	leases  map[string]*lease
	blind   bool
	pauseFn func(ctx context.Context, id string) error // under mu: see Attach
	onEvent func(Event)
}

// NewManager returns a manager with no leases.
func NewManager(o Options) (*Manager, error) {
	if o.Host == nil || o.Clock == nil {
		return nil, errors.New("gpu: a manager needs a host and a clock")
	}
	m := &Manager{
		host: o.Host, worker: o.Worker, clock: o.Clock, cfg: o.Config,
		store: o.Store, flagger: o.Flagger, onEvent: o.OnEvent, log: o.Log,
		leases: map[string]*lease{},
	}
	if m.worker == nil {
		m.worker = noWorker{}
	}
	if m.cfg == (Config{}) {
		m.cfg = DefaultConfig()
	}
	if m.log == nil {
		m.log = slog.New(slog.DiscardHandler)
	}
	m.pauseFn = o.Pause
	if m.pauseFn == nil {
		m.pauseFn = func(ctx context.Context, id string) error {
			_, err := m.Pause(ctx, id)
			return err
		}
	}
	return m, nil
}

// Attach makes s the manager's sink, in place of Options.Pause and
// Options.OnEvent. Call it before the manager is used: events before it
// go to OnEvent.
func (m *Manager) Attach(s Sink) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.pauseFn, m.onEvent = s.PauseIdle, s.LeaseEvent
}

type noWorker struct{}

func (noWorker) Reserve(context.Context, Target, int64) error { return nil }

// Errors of the lease verbs.
func notFound(id string) error {
	return torpor.Errorf(torpor.ENotFound, "no GPU lease %q", id)
}

func gone(id, while string) error {
	msg := fmt.Sprintf("GPU lease %q was destroyed", id)
	if while != "" {
		msg += " while it was " + while
	}
	return &torpor.Error{Code: torpor.EGone, Reason: "destroyed", Message: msg}
}

func deadErr(l *lease) error {
	return &torpor.Error{Code: torpor.EConflict, Reason: "dead",
		Message: fmt.Sprintf("GPU lease %q is dead (%s): its processes are gone", l.spec.ID, l.deadReason)}
}

func busyErr(id, verb string) error {
	return &torpor.Error{Code: torpor.EConflict, Reason: "busy",
		Message: fmt.Sprintf("cannot %s GPU lease %q: it already has a job in flight", verb, id)}
}

// Create registers a lease whose worker is running and reserves its full
// slice. The caller has validated the accel request (AccelRequest).
func (m *Manager) Create(ctx context.Context, spec Spec) (Status, error) {
	if err := validateSpec(spec); err != nil {
		return Status{}, err
	}
	if spec.Accel.GPUs == 0 {
		spec.Accel.GPUs = 1
	}
	m.mu.Lock()
	if _, ok := m.leases[spec.ID]; ok {
		m.mu.Unlock()
		return Status{}, &torpor.Error{Code: torpor.EConflict, Reason: "exists", Message: fmt.Sprintf("GPU lease %q exists", spec.ID)}
	}
	m.mu.Unlock()
	// A reserve without a cap: the full slice target.
	if err := m.worker.Reserve(ctx, targetOf(spec), spec.Accel.VRAMMiB); err != nil {
		return Status{}, reserveError(spec.ID, err)
	}
	now := m.clock.Now()
	l := &lease{spec: spec, phase: PhaseResident, lastActivity: now, lastSeen: now,
		seg: Segment{Kind: segIdle, Start: now}}
	l.meters.SuspendMode = spec.Accel.SuspendMode
	l.meters.IdleTimeoutS = spec.Accel.IdleTimeoutS
	m.mu.Lock()
	if _, ok := m.leases[spec.ID]; ok {
		m.mu.Unlock()
		return Status{}, &torpor.Error{Code: torpor.EConflict, Reason: "exists", Message: fmt.Sprintf("GPU lease %q exists", spec.ID)}
	}
	m.leases[spec.ID] = l
	st := l.status(now, m.cfg.ResumeGrace)
	m.mu.Unlock()
	return st, m.save(ctx, l)
}

func reserveError(id string, err error) error {
	if errors.Is(err, ErrOutOfMemory) {
		return &torpor.Error{Code: torpor.EConflict, Reason: "capacity", RetryAfter: 2 * time.Second,
			Message: fmt.Sprintf("GPU lease %q: the card cannot take its VRAM slice now: %v", id, err)}
	}
	return fmt.Errorf("gpu: lease %s: reserve: %w", id, err)
}

// Status returns the lease's status with its meters up to now.
func (m *Manager) Status(id string) (Status, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	l := m.leases[id]
	if l == nil {
		return Status{}, notFound(id)
	}
	return l.status(m.clock.Now(), m.cfg.ResumeGrace), nil
}

// List returns every lease's status, by id.
func (m *Manager) List() []Status {
	m.mu.Lock()
	defer m.mu.Unlock()
	now := m.clock.Now()
	out := make([]Status, 0, len(m.leases))
	for _, l := range m.leases {
		out = append(out, l.status(now, m.cfg.ResumeGrace))
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// Record returns what to persist of the lease (the manager saves it
// through Store on every change; this is for a daemon that wants it now).
func (m *Manager) Record(id string) (Record, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	l := m.leases[id]
	if l == nil {
		return Record{}, notFound(id)
	}
	return l.record(), nil
}

// Counters returns the lease's settlement counters up to now, for the
// front of a node fleet (Settlement).
func (m *Manager) Counters(id string) (Counters, error) {
	st, err := m.Status(id)
	if err != nil {
		return Counters{}, err
	}
	return st.Meters.Counters(), nil
}

// acquire returns the lease id with m.mu held once no transition is in
// flight on it: a caller that finds one waits for its commit and then
// looks again. A destroyed lease is gone.
func (m *Manager) acquire(ctx context.Context, id string) (*lease, error) {
	for {
		l := m.leases[id]
		switch {
		case l == nil:
			return nil, notFound(id)
		case l.phase == PhaseDestroyed:
			return nil, gone(id, "")
		case l.op == nil:
			return l, nil
		}
		done := l.op.done
		m.mu.Unlock()
		select {
		case <-done:
			m.mu.Lock()
		case <-ctx.Done():
			m.mu.Lock()
			return nil, ctx.Err()
		}
	}
}

// Destroy kills the lease's processes, frozen or not, and settles its
// meters. It does not wait for a transition in flight: that transition's
// commit finds the lease destroyed and fails. Destroying a destroyed
// lease succeeds.
func (m *Manager) Destroy(ctx context.Context, id string) (Status, error) {
	m.mu.Lock()
	l := m.leases[id]
	if l == nil {
		m.mu.Unlock()
		return Status{}, notFound(id)
	}
	now := m.clock.Now()
	if l.phase == PhaseDestroyed {
		st := l.status(now, m.cfg.ResumeGrace)
		m.mu.Unlock()
		return st, nil
	}
	wasDead := l.phase == PhaseDead
	stopped := l.frozen || l.op != nil
	l.closeSeg(now)
	l.phase, l.job = PhaseDestroyed, false
	spec := l.spec
	st := l.status(now, m.cfg.ResumeGrace)
	m.mu.Unlock()

	var err error
	if !wasDead {
		err = m.kill(ctx, spec, stopped)
	}
	return st, errors.Join(err, m.save(ctx, l))
}

// kill ends the lease's processes. A frozen lease is thawed first, so a
// stopped process gets SIGCONT before its SIGTERM and the graceful path
// still lands (the host's Kill continues stopped processes as well).
func (m *Manager) kill(ctx context.Context, spec Spec, stopped bool) error {
	if stopped {
		if err := m.host.Thaw(ctx, spec.Group); err != nil {
			m.log.Warn("gpu: thaw before kill", "lease", spec.ID, "err", err)
		}
	}
	if err := m.host.Kill(ctx, spec.Group, m.cfg.KillGrace); err != nil {
		return fmt.Errorf("gpu: lease %s: kill: %w", spec.ID, err)
	}
	return nil
}

// Purge forgets a lease without settling it: an open interval is dropped,
// not billed, and its processes are left alone. Use Destroy to end a
// lease; Purge is for records the daemon removes.
func (m *Manager) Purge(id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	l := m.leases[id]
	if l == nil {
		return notFound(id)
	}
	l.seg = Segment{Kind: segNone, Start: m.clock.Now()}
	l.pending = nil
	// A transition in flight finds the lease gone at its commit.
	l.phase = PhaseDestroyed
	delete(m.leases, id)
	return nil
}

// Adopt re-seeds a lease from its persisted record after a daemon
// restart. A lease whose worker is alive continues where the record left
// it (a transition the crash interrupted is rolled back to resident). A
// lease whose processes are gone restores dead: its open interval — a
// freeze-only interval included — settles at the last sign of life and
// closes, so it neither accrues on the dead record nor lands later as one
// inflated row.
func (m *Manager) Adopt(ctx context.Context, rec Record) (Status, error) {
	if err := validateSpec(rec.Spec); err != nil {
		return Status{}, err
	}
	m.mu.Lock()
	if _, ok := m.leases[rec.Spec.ID]; ok {
		m.mu.Unlock()
		return Status{}, &torpor.Error{Code: torpor.EConflict, Reason: "exists", Message: fmt.Sprintf("GPU lease %q exists", rec.Spec.ID)}
	}
	m.mu.Unlock()
	l := &lease{
		spec: rec.Spec, phase: rec.Phase, frozen: rec.Frozen, freezeOnly: rec.FreezeOnly,
		freezeReason: rec.FreezeReason, resumedAt: rec.ResumedAt,
		lastActivity: rec.LastActivity, lastSeen: rec.LastSeen,
		deadReason: rec.DeadReason, reserveErr: rec.ReserveError,
		meters: rec.Meters, seg: rec.Seg,
	}
	if rec.CapMiB != nil {
		c := *rec.CapMiB
		l.capMiB = &c
	}
	live := l.phase == PhaseResident || l.phase == PhaseSuspended
	if live {
		pids, err := m.host.Processes(ctx, rec.Spec.Group)
		if err != nil {
			return Status{}, fmt.Errorf("gpu: adopt %s: %w", rec.Spec.ID, err)
		}
		if !contains(pids, rec.Spec.WorkerPID) {
			// Restores dead: settle at the last sign of life.
			end := rec.LastSeen
			if end.Before(l.seg.Start) {
				end = l.seg.Start
			}
			l.closeSeg(end)
			l.phase, l.frozen, l.freezeOnly, l.deadReason = PhaseDead, false, false, DeadRestoredDead
			live = false
			m.event(Event{LeaseID: rec.Spec.ID, Kind: EventDead, Reason: DeadRestoredDead, At: m.clock.Now()})
			// Whatever is left of the group goes.
			if len(pids) > 0 {
				_ = m.kill(ctx, rec.Spec, true)
			}
		}
	}
	if live && rec.Op != "" {
		if err := m.rollBack(ctx, l); err != nil {
			return Status{}, err
		}
	}
	m.mu.Lock()
	if _, ok := m.leases[rec.Spec.ID]; ok {
		m.mu.Unlock()
		return Status{}, &torpor.Error{Code: torpor.EConflict, Reason: "exists", Message: fmt.Sprintf("GPU lease %q exists", rec.Spec.ID)}
	}
	m.leases[rec.Spec.ID] = l
	st := l.status(m.clock.Now(), m.cfg.ResumeGrace)
	m.mu.Unlock()
	return st, m.save(ctx, l)
}

// rollBack brings a lease whose transition a crash interrupted back to
// resident and running: thaw, restore the worker if it was checkpointed,
// reserve its target.
func (m *Manager) rollBack(ctx context.Context, l *lease) error {
	spec := l.spec
	if err := m.host.Thaw(ctx, spec.Group); err != nil {
		return fmt.Errorf("gpu: adopt %s: thaw: %w", spec.ID, err)
	}
	if spec.Accel.SuspendMode == SuspendTransparent {
		// The crash may have come between the checkpoint and the record.
		err := m.host.Restore(ctx, spec.WorkerPID)
		if err != nil && !errors.Is(err, ErrNotCheckpointed) {
			return fmt.Errorf("gpu: adopt %s: restore: %w", spec.ID, err)
		}
	}
	if err := m.worker.Reserve(ctx, targetOf(spec), l.target()); err != nil {
		l.reserveErr = err.Error()
	}
	now := m.clock.Now()
	if l.phase == PhaseSuspended {
		l.switchSeg(now, segIdle, false)
	} else if l.frozen {
		l.switchSeg(now, segIdle, false)
	}
	l.phase, l.frozen, l.freezeOnly, l.freezeReason = PhaseResident, false, false, ""
	l.lastActivity = now
	return nil
}

// event tells the sink e. It is called without m.mu held.
func (m *Manager) event(e Event) {
	m.mu.Lock()
	onEvent := m.onEvent
	m.mu.Unlock()
	if onEvent != nil {
		onEvent(e)
	}
}

// save writes the lease's record and its pending rows. Rows that could
// not be written stay pending for the next save.
func (m *Manager) save(ctx context.Context, l *lease) error {
	l.saveMu.Lock()
	defer l.saveMu.Unlock()
	m.mu.Lock()
	rec := l.record()
	rows := append([]UsageRow(nil), l.pending...)
	if m.store == nil {
		l.pending = nil
		m.mu.Unlock()
		return nil
	}
	m.mu.Unlock()
	if err := m.store.SaveLease(ctx, rec, rows); err != nil {
		return fmt.Errorf("gpu: save lease %s: %w", rec.Spec.ID, err)
	}
	m.mu.Lock()
	if len(l.pending) >= len(rows) {
		l.pending = l.pending[len(rows):]
	}
	l.savedAt = m.clock.Now()
	m.mu.Unlock()
	return nil
}
