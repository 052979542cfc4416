package gpu

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"
)

// TickReport says what one Tick did.
type TickReport struct {
	// Dead lists leases whose worker was found gone.
	Dead []string
	// Killed lists leases the watchdog killed.
	Killed []string
	// AutoPaused lists leases the idle sweep paused; Refused those whose
	// pause was refused (a job raced it, say): the next tick tries again.
	AutoPaused []string
	Refused    map[string]error
	// Err: the watchdog was blind (usage unreadable) or a save failed.
	Err error
}

// Tick is the daemon's reaper timer's call: it records each lease's sign
// of life, runs the watchdog and the idle sweep, and cuts long open
// intervals into saved usage rows.
func (m *Manager) Tick(ctx context.Context) TickReport {
	var r TickReport
	r.Dead = m.heartbeat(ctx)
	var werr error
	r.Killed, werr = m.Watchdog(ctx)
	r.AutoPaused, r.Refused = m.SweepIdle(ctx)
	r.Err = errors.Join(werr, m.cutRows(ctx))
	return r
}

// live lists the leases that hold processes and have no transition in
// flight.
func (m *Manager) live(resident bool) []*lease {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []*lease
	for _, l := range m.leases {
		if l.op != nil {
			continue
		}
		if l.phase == PhaseResident || (!resident && l.phase == PhaseSuspended) {
			out = append(out, l)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].spec.ID < out[j].spec.ID })
	return out
}

// heartbeat looks for each lease's worker: alive, it is the lease's last
// sign of life; gone, the lease is dead from its last sign of life on.
func (m *Manager) heartbeat(ctx context.Context) []string {
	var dead []string
	for _, l := range m.live(false) {
		m.mu.Lock()
		spec := l.spec
		m.mu.Unlock()
		pids, err := m.host.Processes(ctx, spec.Group)
		if err != nil {
			m.log.Warn("gpu: list lease processes", "lease", spec.ID, "err", err)
			continue
		}
		now := m.clock.Now()
		m.mu.Lock()
		if l.op != nil || (l.phase != PhaseResident && l.phase != PhaseSuspended) {
			m.mu.Unlock()
			continue
		}
		if contains(pids, spec.WorkerPID) {
			l.lastSeen = now
			m.mu.Unlock()
			continue
		}
		end := l.lastSeen
		if end.Before(l.seg.Start) {
			end = l.seg.Start
		}
		l.closeSeg(end)
		l.phase, l.frozen, l.job, l.deadReason = PhaseDead, false, false, DeadWorkerExited
		m.mu.Unlock()
		dead = append(dead, spec.ID)
		m.event(Event{LeaseID: spec.ID, Kind: EventDead, Reason: DeadWorkerExited, At: now})
		if len(pids) > 0 {
			_ = m.kill(ctx, spec, true)
		}
		_ = m.save(ctx, l)
	}
	return dead
}

// Watchdog kills, on a hard-cap host, each resident lease whose VRAM is
// over its limit, and flags the key that created it. For ResumeGrace
// after a resume commit only the lease's non-worker processes count: the
// worker's own slice, our re-reserve included, is excluded, so a lease is
// never flagged for an overshoot the re-reserve produced, while a
// runaway child still is. Frozen leases are checked and killed too. An
// unreadable probe makes the watchdog blind: an error, and an event the
// first time.
func (m *Manager) Watchdog(ctx context.Context) ([]string, error) {
	if !m.host.HardCap() {
		return nil, nil
	}
	u, err := m.host.Usage(ctx)
	m.mu.Lock()
	wasBlind := m.blind
	m.blind = err != nil
	m.mu.Unlock()
	if err != nil {
		if !wasBlind {
			m.log.Error("gpu: the VRAM watchdog is blind: usage is unreadable", "err", err)
			m.event(Event{Kind: EventWatchdogBlind, Reason: err.Error(), At: m.clock.Now()})
		}
		return nil, fmt.Errorf("gpu: watchdog blind: %w", err)
	}
	var killed []string
	for _, l := range m.live(true) {
		m.mu.Lock()
		spec, resumedAt := l.spec, l.resumedAt
		m.mu.Unlock()
		pids, err := m.host.Processes(ctx, spec.Group)
		if err != nil {
			continue
		}
		now := m.clock.Now()
		workerMiB, others := u.Split(pids, spec.WorkerPID)
		inGrace := !resumedAt.IsZero() && now.Before(resumedAt.Add(m.cfg.ResumeGrace))
		used := others
		if !inGrace {
			used += workerMiB
		}
		limit := limitOf(spec)
		if used <= limit {
			continue
		}
		m.mu.Lock()
		if l.phase != PhaseResident || l.op != nil || !l.resumedAt.Equal(resumedAt) {
			m.mu.Unlock()
			continue
		}
		stopped := l.frozen
		l.closeSeg(now)
		l.phase, l.frozen, l.freezeOnly, l.job, l.deadReason = PhaseDead, false, false, false, DeadWatchdog
		m.mu.Unlock()
		killed = append(killed, spec.ID)
		kerr := m.kill(ctx, spec, stopped)
		reason := fmt.Sprintf("GPU lease VRAM %d MiB over its limit of %d MiB", used, limit)
		if inGrace {
			reason += " (non-worker processes only, inside the resume grace)"
		}
		m.log.Warn("gpu: watchdog kill", "lease", spec.ID, "used_mib", used, "limit_mib", limit, "grace", inGrace, "kill_err", kerr)
		if m.flagger != nil {
			f := Flag{Tenant: spec.Tenant, KeyID: spec.KeyID, LeaseID: spec.ID, UsedMiB: used, LimitMiB: limit,
				Reason: reason, At: now, NonWorkerOnly: inGrace}
			if err := m.flagger.FlagKey(ctx, f); err != nil {
				m.log.Error("gpu: flag key", "key", spec.KeyID, "err", err)
			}
		}
		m.event(Event{LeaseID: spec.ID, Kind: EventWatchdogKill, Reason: reason, At: now})
		_ = m.save(ctx, l)
	}
	return killed, nil
}

// SweepIdle pauses every resident, unfrozen lease with no job and no
// transition in flight whose last activity (create, job end, resume or
// thaw) is at least its idle timeout old, through the same pause path as
// POST /pause (the sink's PauseIdle), so locks, freeze-only rules and
// billing are the manual verb's. A pause refused because a job raced it
// is reported and retried next tick. Off when Config.IdleAutoPause is false
// (TORPOR_GPU_IDLE_AUTOPAUSE=0) or a lease's timeout is 0.
func (m *Manager) SweepIdle(ctx context.Context) (paused []string, refused map[string]error) {
	if !m.cfg.IdleAutoPause {
		return nil, nil
	}
	now := m.clock.Now()
	var ids []string
	m.mu.Lock()
	for id, l := range m.leases {
		timeout := time.Duration(l.spec.Accel.IdleTimeoutS) * time.Second
		if l.phase == PhaseResident && !l.frozen && !l.job && l.op == nil && timeout > 0 &&
			now.Sub(l.lastActivity) >= timeout {
			ids = append(ids, id)
		}
	}
	pause := m.pauseFn
	m.mu.Unlock()
	sort.Strings(ids)
	for _, id := range ids {
		if err := pause(WithAutoPause(ctx), id); err != nil {
			if refused == nil {
				refused = map[string]error{}
			}
			refused[id] = err
			continue
		}
		paused = append(paused, id)
	}
	return paused, refused
}

// cutRows settles open intervals longer than RowInterval into rows and
// saves leases not saved for that long, so the durable trail (and the
// last sign of life) is never more than RowInterval behind.
func (m *Manager) cutRows(ctx context.Context) error {
	now := m.clock.Now()
	var due []*lease
	m.mu.Lock()
	for _, l := range m.leases {
		if l.seg.Kind != segNone && now.Sub(l.seg.Start) >= m.cfg.RowInterval {
			l.switchSeg(now, l.seg.Kind, l.seg.FreezeOnly)
		}
		liveLease := l.phase == PhaseResident || l.phase == PhaseSuspended
		if len(l.pending) > 0 || (liveLease && now.Sub(l.savedAt) >= m.cfg.RowInterval) {
			due = append(due, l)
		}
	}
	m.mu.Unlock()
	var errs []error
	for _, l := range due {
		errs = append(errs, m.save(ctx, l))
	}
	return errors.Join(errs...)
}
