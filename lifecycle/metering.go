package lifecycle

import (
	"context"
	"time"

	"github.com/torpor-dev/torpor"
)

// Metering defaults (docs/billing.md).
const (
	// DefaultSettleEvery is how often open usage intervals are written to
	// the ledger; rows never cross a multiple of it (UTC), so usage per
	// hour or per day is exact.
	DefaultSettleEvery = time.Hour
	// DefaultSeenEvery is how often the engine records that the instances
	// it watches are alive.
	DefaultSeenEvery = 15 * time.Second
)

// meter brings sb's usage up to date for a save at now: when the kind it
// is metered as changes (at the moment its new state began), the open
// interval is closed into ledger rows, which are counted into sb.Meters
// and returned to be stored with the record; otherwise nothing is
// written. A resident sandbox that is saved is alive: SeenAt moves too.
func (e *Engine) meter(sb *torpor.Sandbox, now time.Time) []torpor.UsageRecord {
	u := &sb.Usage
	kind := torpor.UsageKindOf(sb.State, sb.PauseMode, u.Kind)
	if sb.State == torpor.StateFailed && sb.Failure != nil && sb.Failure.Code == torpor.FailureLost {
		kind = torpor.UsageNone // lost with its node: it holds nothing
	}
	if kind.Resident() {
		u.SeenAt = now
	}
	if kind == u.Kind {
		return nil
	}
	at := now
	if sb.StateSince.After(u.Since) && sb.StateSince.Before(now) {
		at = sb.StateSince
	}
	rows := e.closeUsage(sb, at)
	u.Kind = kind
	if kind != torpor.UsageSnapshotPaused {
		// The snapshot is charged for up to here, so the transitions that
		// end it (a restore, a stop, a delete) leave it for the meter to
		// drop: the sandbox holds it no more.
		sb.Snapshot = nil
	}
	return rows
}

// closeUsage writes the open interval of sb up to at as ledger rows, split
// at every multiple of the settlement period, counts them into the meters
// and moves the frontier to at.
func (e *Engine) closeUsage(sb *torpor.Sandbox, at time.Time) []torpor.UsageRecord {
	u := &sb.Usage
	if !at.After(u.Since) {
		return nil
	}
	var rows []torpor.UsageRecord
	if u.Kind != torpor.UsageNone && !u.Since.IsZero() {
		for from := u.Since; from.Before(at); {
			to := from.Truncate(e.settleEvery).Add(e.settleEvery)
			if to.After(at) {
				to = at
			}
			r := e.pricing.Charge(sb, u.Kind, from, to)
			sb.Meters.Add(r)
			rows = append(rows, r)
			from = to
		}
	}
	u.Since = at
	return rows
}

// openUsage returns sb's open interval up to now as a provisional row
// (Open), or false when nothing is open.
func (e *Engine) openUsage(sb *torpor.Sandbox, now time.Time) (torpor.UsageRecord, bool) {
	u := sb.Usage
	if u.Kind == torpor.UsageNone || u.Since.IsZero() || !now.After(u.Since) {
		return torpor.UsageRecord{}, false
	}
	r := e.pricing.Charge(sb, u.Kind, u.Since, now)
	r.Open = true
	return r, true
}

// settle writes every open interval up to the last settlement boundary,
// each in the same transaction as its sandbox's new frontier.
func (e *Engine) settle(ctx context.Context) {
	boundary := e.now().Truncate(e.settleEvery)
	for _, id := range e.trackedIDs() {
		if ctx.Err() != nil {
			return
		}
		func() {
			unlock := e.locks.Lock(id)
			defer unlock()
			sb, err := e.store.GetSandbox(ctx, id)
			if err != nil || sb.Usage.Kind == torpor.UsageNone || !boundary.After(sb.Usage.Since) {
				return
			}
			rows := e.closeUsage(sb, boundary)
			if err := e.write(ctx, sb, rows); err != nil {
				e.log.Error("settling usage", "sandbox", id, "err", err)
			}
		}()
	}
}

// markSeen records that the instances the engine watches and that hold
// memory are alive now.
func (e *Engine) markSeen(ctx context.Context) {
	e.watchMu.Lock()
	ids := make([]string, 0, len(e.watchers))
	for id := range e.watchers {
		ids = append(ids, id)
	}
	e.watchMu.Unlock()
	e.statesMu.Lock()
	live := ids[:0]
	for _, id := range ids {
		if st := e.states[id]; st == torpor.StateRunning || st == torpor.StatePaused || st.Transitional() {
			live = append(live, id)
		}
	}
	e.statesMu.Unlock()
	if err := e.store.MarkSeen(ctx, e.now(), live...); err != nil {
		e.log.Error("recording signs of life", "err", err)
	}
}

// closeLost ends the open interval of a sandbox whose instance is found
// dead after a restart at its last recorded sign of life: from there on it
// held only its disk.
func (e *Engine) closeLost(ctx context.Context, sb *torpor.Sandbox) error {
	if !sb.Usage.Kind.Resident() {
		return nil
	}
	at := sb.Usage.SeenAt
	if at.Before(sb.Usage.Since) {
		at = sb.Usage.Since
	}
	if now := e.now(); at.After(now) {
		at = now
	}
	rows := e.closeUsage(sb, at)
	sb.Usage.Kind = torpor.UsageHibernated
	e.log.Info("closing usage at the last sign of life", "sandbox", sb.ID, "at", at)
	ev := e.event(sb, torpor.EventLost, "state", string(sb.State))
	ev.Time = at
	return e.write(ctx, sb, rows, ev)
}

// trackedIDs returns the ids of every sandbox that is not terminated.
func (e *Engine) trackedIDs() []string {
	e.statesMu.Lock()
	defer e.statesMu.Unlock()
	ids := make([]string, 0, len(e.states))
	for id := range e.states {
		ids = append(ids, id)
	}
	return ids
}

// runMetering settles the ledger at every settlement boundary and records
// signs of life every seenEvery, on the engine's clock, until ctx ends.
func (e *Engine) runMetering(ctx context.Context) {
	tick := func(d time.Duration) (<-chan struct{}, torpor.Timer) {
		ch := make(chan struct{})
		return ch, e.clock.AfterFunc(d, func() { close(ch) })
	}
	untilBoundary := func() time.Duration {
		now := e.now()
		return now.Truncate(e.settleEvery).Add(e.settleEvery).Sub(now)
	}
	// The first ticks are armed before the loop starts, so that they
	// count from the engine's start, not from whenever the goroutine
	// first runs.
	settleC, settleT := tick(untilBoundary())
	seenC, seenT := tick(e.seenEvery)
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		defer func() { settleT.Stop(); seenT.Stop() }()
		for {
			select {
			case <-ctx.Done():
				return
			case <-settleC:
				e.settle(ctx)
				settleC, settleT = tick(untilBoundary())
			case <-seenC:
				e.markSeen(ctx)
				seenC, seenT = tick(e.seenEvery)
			}
		}
	}()
}

// Pricing returns the prices the ledger is charged at.
func (e *Engine) Pricing() torpor.Pricing { return e.pricing }

// Usage returns the ledger rows of f (tenant's only, unless tenant is
// empty), followed by the open intervals of the matching sandboxes up to
// now as provisional rows, each clipped to the window of f.
func (e *Engine) Usage(ctx context.Context, tenant string, f torpor.UsageFilter) ([]torpor.UsageRecord, error) {
	if tenant != "" {
		f.Tenant = tenant
	}
	rows, err := e.store.ListUsage(ctx, f)
	if err != nil {
		return nil, err
	}
	var sbs []*torpor.Sandbox
	if f.SandboxID != "" {
		sb, err := e.store.GetSandbox(ctx, f.SandboxID)
		if err == nil && (f.Tenant == "" || sb.Tenant == f.Tenant) {
			sbs = append(sbs, sb)
		}
	} else if sbs, err = e.store.ListSandboxes(ctx, torpor.SandboxFilter{Tenant: f.Tenant}); err != nil {
		return nil, err
	}
	now := e.now()
	for _, sb := range sbs {
		if r, ok := e.openUsage(sb, now); ok {
			rows = append(rows, r)
		}
	}
	out := rows[:0]
	for _, r := range rows {
		if c, ok := r.Clip(f.From, f.To); ok {
			out = append(out, c)
		}
	}
	return out, nil
}
