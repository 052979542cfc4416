package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/torpor-dev/torpor"
)

// Scheduled wake-ups (docs/schedule.md). A sandbox's wake-ups ride the idle
// engine's scheduler: plan folds the next one into the sandbox's one
// deadline, and the sweep that finds it due wakes the sandbox (wakeUp),
// starts the wake-up's command, and leaves the sandbox to its idle policy,
// which puts it to sleep again once the command is done.

// CauseWakeup: one of the sandbox's scheduled wake-ups came.
const CauseWakeup = "wake_up"

// Events of wake-ups. Each carries the wake-up's id as "wakeup".
const (
	// EventWakeup: a wake-up came; the sandbox is awake (woke_from says
	// from what), and its command, if any, starts. due_at, late and
	// missed say when it was for (torpor.WakeupResult).
	EventWakeup = "sandbox.wakeup"
	// EventWakeupDone: a wake-up's run ended: status, exit_code,
	// timed_out, the tail of its output, or the error that stopped it.
	EventWakeupDone = "sandbox.wakeup_done"
	// EventWakeupWaiting: a due wake-up could not wake its sandbox (the
	// node is full, the tenant at its quota); it tries again at retry_at.
	EventWakeupWaiting = "sandbox.wakeup_waiting"
	// EventWakeupSkipped: a recurring wake-up came while its last run
	// still ran; that time is skipped.
	EventWakeupSkipped = "sandbox.wakeup_skipped"
)

// wakeupRetry is how long a wake-up that could not wake its sandbox waits
// before it tries again.
const wakeupRetry = 15 * time.Second

// eventOutputTail bounds the output an EventWakeupDone carries (the
// sandbox's last result keeps torpor.WakeupOutputTail).
const eventOutputTail = 1024

// plan is what the idle engine will do to sb if nothing else happens, in
// time order (see sleepPlan), with its wake-ups among it; a wake-up due
// at the same time as an idle action comes first.
func plan(sb *torpor.Sandbox, maxPaused time.Duration) []torpor.ScheduledEvent {
	evs := sleepPlan(sb, maxPaused)
	wk := wakeupPlan(sb)
	if len(wk) == 0 {
		return evs
	}
	all := append(wk, evs...)
	sort.SliceStable(all, func(i, j int) bool { return all[i].At.Before(all[j].At) })
	return all
}

// wakeupPlan returns the wake-ups of sb the engine will act on. A sandbox
// in a transition has none until it lands (the transition's write plans
// it again), a terminated one or a warm pool's member none at all.
func wakeupPlan(sb *torpor.Sandbox) []torpor.ScheduledEvent {
	if sb.Pool != "" {
		return nil
	}
	switch sb.State {
	case torpor.StateRunning, torpor.StatePaused, torpor.StateHibernated, torpor.StateArchived, torpor.StateFailed:
	default:
		return nil
	}
	var evs []torpor.ScheduledEvent
	for i := range sb.Wakeups {
		if at, ok := sb.Wakeups[i].DueAt(); ok {
			evs = append(evs, torpor.ScheduledEvent{Action: torpor.ActionWake, At: at, Cause: CauseWakeup, Wakeup: sb.Wakeups[i].ID})
		}
	}
	sort.SliceStable(evs, func(i, j int) bool { return evs[i].At.Before(evs[j].At) })
	return evs
}

func findWakeup(sb *torpor.Sandbox, id string) *torpor.Wakeup {
	for i := range sb.Wakeups {
		if sb.Wakeups[i].ID == id {
			return &sb.Wakeups[i]
		}
	}
	return nil
}

// wakeUp acts on sb's wake-up id, which is due: it wakes a paused or
// hibernated sandbox (cause wake_up), takes the run (torpor.Wakeup.Take:
// the times missed meanwhile fold into it) and stores it before the
// command starts, so that a run is never made twice, even by a daemon
// that dies while it runs. The caller holds sb's lock.
func (e *Engine) wakeUp(ctx context.Context, sb *torpor.Sandbox, id string) error {
	w := findWakeup(sb, id)
	if w == nil {
		e.track(sb)
		return nil
	}
	now := e.now()
	if w.LastResult != nil && w.LastResult.Status == torpor.WakeupRunning {
		// Its last run still runs (a restart marks one it cut short
		// interrupted): this time is skipped.
		res := *w.LastResult
		runs := w.Runs
		w.Take(now)
		w.Runs, w.LastResult = runs, &res
		return e.save(ctx, sb, e.event(sb, EventWakeupSkipped, "wakeup", id, "reason", "its last run still runs"))
	}
	var from torpor.State
	switch sb.State {
	case torpor.StateRunning:
	case torpor.StatePaused, torpor.StateHibernated, torpor.StateArchived:
		from = sb.State
		err := e.start(ctx, sb, CauseWakeup)
		if err == nil && sb.State != torpor.StateRunning {
			err = fmt.Errorf("the sandbox did not come back: it is %s", sb.State)
		}
		if err != nil {
			return e.wakeupWaits(ctx, sb, id, from, err)
		}
		if w = findWakeup(sb, id); w == nil {
			return nil
		}
	case torpor.StateFailed:
		return e.wakeupFails(ctx, sb, w, "", fmt.Sprintf("the sandbox is failed (%s): start it to let its wake-ups run", failureCode(sb)))
	default:
		// In a transition: its end plans the sandbox again.
		e.sched.set(sb.ID, now.Add(wakeupRetry))
		return nil
	}
	res := w.Take(e.now())
	res.WokeFrom = from
	evs := []torpor.Event{e.event(sb, EventWakeup, "wakeup", id, "cause", CauseWakeup, "due_at", res.DueAt.Format(time.RFC3339),
		"late", strconv.FormatBool(res.Late), "missed", strconv.Itoa(res.Missed), "woke_from", string(from))}
	if len(w.Cmd) == 0 {
		at := res.StartedAt
		res.Status, res.FinishedAt = torpor.WakeupDone, &at
		evs = append(evs, e.event(sb, EventWakeupDone, "wakeup", id, "status", res.Status))
	}
	w.LastResult = &res
	if err := e.save(ctx, sb, evs...); err != nil {
		return err
	}
	if len(w.Cmd) > 0 {
		req := torpor.ExecRequest{Cmd: append([]string(nil), w.Cmd...), Timeout: time.Duration(w.TimeoutSeconds) * time.Second}
		if req.Timeout == 0 {
			// A run that never ends would skip every later one.
			req.Timeout = MaxExecTimeout
		}
		tenant, sbID, run := sb.Tenant, sb.ID, w.Runs
		e.wg.Add(1)
		go func() {
			defer e.wg.Done()
			e.runWakeup(tenant, sbID, id, run, req)
		}()
	}
	return nil
}

func failureCode(sb *torpor.Sandbox) string {
	if sb.Failure != nil {
		return sb.Failure.Code
	}
	return "no failure recorded"
}

// wakeupWaits records that wake-up id could not wake sb, which is from
// again (or failed): a sandbox that failed on the way gets the run as an
// error; else the wake-up waits, tries again after wakeupRetry, and says
// so the first time (and when the reason changes).
func (e *Engine) wakeupWaits(ctx context.Context, sb *torpor.Sandbox, id string, from torpor.State, cause error) error {
	w := findWakeup(sb, id)
	if w == nil {
		return nil
	}
	if sb.State == torpor.StateFailed || sb.State == torpor.StateTerminated {
		return e.wakeupFails(ctx, sb, w, from, "waking the sandbox failed: "+describeErr(cause))
	}
	reason := "error"
	var te *torpor.Error
	if errors.As(cause, &te) && te.Reason != "" {
		reason = te.Reason
	}
	retry := e.now().Add(wakeupRetry)
	w.RetryAt = &retry
	var evs []torpor.Event
	if w.Waiting != reason {
		w.Waiting = reason
		evs = append(evs, e.event(sb, EventWakeupWaiting, "wakeup", id, "reason", reason, "error", describeErr(cause),
			"retry_at", retry.Format(time.RFC3339)))
	}
	e.log.Info("a wake-up waits: its sandbox could not be woken", "sandbox", sb.ID, "wakeup", id, "err", cause)
	return e.save(ctx, sb, evs...)
}

// wakeupFails takes a run of w that could not happen, with why.
func (e *Engine) wakeupFails(ctx context.Context, sb *torpor.Sandbox, w *torpor.Wakeup, from torpor.State, why string) error {
	res := w.Take(e.now())
	at := res.StartedAt
	res.WokeFrom, res.Status, res.Error, res.FinishedAt = from, torpor.WakeupError, why, &at
	w.LastResult = &res
	return e.save(ctx, sb, e.event(sb, EventWakeupDone, "wakeup", w.ID, "status", res.Status, "error", why,
		"late", strconv.FormatBool(res.Late), "missed", strconv.Itoa(res.Missed)))
}

// describeErr is an error's message for a person, without the wrapping
// the engine adds.
func describeErr(err error) string {
	var te *torpor.Error
	if errors.As(err, &te) {
		return te.Message
	}
	return err.Error()
}

// runWakeup runs wake-up id's command in sandbox sbID as an exec (which
// counts as activity, so the idle engine leaves the sandbox awake while
// it runs, and puts it to sleep by its policy after), then records how it
// ended on the wake-up's result, if that is still of its run (the run-th).
func (e *Engine) runWakeup(tenant, sbID, id string, run int64, req torpor.ExecRequest) {
	out := &tailBuffer{max: torpor.WakeupOutputTail}
	req.Stdout, req.Stderr = out, out
	res, err := e.Exec(e.bg, tenant, sbID, req)
	if e.bg.Err() != nil {
		// The engine closes: the next one marks the run interrupted.
		return
	}
	unlock := e.locks.Lock(sbID)
	defer unlock()
	sb, gerr := e.store.GetSandbox(e.bg, sbID)
	if gerr != nil {
		e.log.Warn("recording a wake-up's result", "sandbox", sbID, "wakeup", id, "err", gerr)
		return
	}
	w := findWakeup(sb, id)
	if sb.State == torpor.StateTerminated || w == nil || w.LastResult == nil || w.Runs != run || w.LastResult.Status != torpor.WakeupRunning {
		return // removed or replaced meanwhile
	}
	r := w.LastResult
	now := e.now()
	r.FinishedAt, r.Output = &now, out.String()
	kv := []string{"wakeup", id}
	if err != nil {
		r.Status, r.Error = torpor.WakeupError, "the command could not run: "+describeErr(err)
		kv = append(kv, "status", r.Status, "error", r.Error)
	} else {
		code := res.ExitCode
		r.Status, r.ExitCode, r.TimedOut = torpor.WakeupDone, &code, res.TimedOut
		kv = append(kv, "status", r.Status, "exit_code", strconv.Itoa(code), "timed_out", strconv.FormatBool(res.TimedOut))
	}
	kv = append(kv, "late", strconv.FormatBool(r.Late), "output", lastBytes(r.Output, eventOutputTail))
	if err := e.save(e.bg, sb, e.event(sb, EventWakeupDone, kv...)); err != nil {
		e.log.Warn("recording a wake-up's result", "sandbox", sbID, "wakeup", id, "err", err)
	}
}

// interruptWakeups marks the runs of sb's wake-ups that a daemon stopped
// in the middle of as interrupted; they are not run again. Recover calls
// it before any wake-up can start.
func (e *Engine) interruptWakeups(ctx context.Context, sb *torpor.Sandbox) {
	var evs []torpor.Event
	for i := range sb.Wakeups {
		r := sb.Wakeups[i].LastResult
		if r == nil || r.Status != torpor.WakeupRunning {
			continue
		}
		r.Status, r.Error = torpor.WakeupInterrupted, "the daemon stopped while the command ran; it is not run again"
		evs = append(evs, e.event(sb, EventWakeupDone, "wakeup", sb.Wakeups[i].ID, "status", r.Status, "error", r.Error))
	}
	if len(evs) == 0 {
		return
	}
	unlock := e.locks.Lock(sb.ID)
	defer unlock()
	if err := e.save(ctx, sb, evs...); err != nil {
		e.log.Warn("marking interrupted wake-ups", "sandbox", sb.ID, "err", err)
	}
}

// SetWakeups replaces a sandbox's wake-ups with specs ([] or nil removes
// them all), checked at the engine's clock.
func (e *Engine) SetWakeups(ctx context.Context, tenant, id string, specs []torpor.WakeupSpec) (*torpor.Sandbox, error) {
	return e.changeWakeups(ctx, tenant, id, func(sb *torpor.Sandbox) error {
		ws, err := torpor.NewWakeups("wakeups", specs, e.now())
		if err != nil {
			return err
		}
		sb.Wakeups = ws
		return nil
	})
}

// AddWakeup adds one wake-up to a sandbox's and returns the sandbox.
func (e *Engine) AddWakeup(ctx context.Context, tenant, id string, spec torpor.WakeupSpec) (*torpor.Sandbox, error) {
	return e.changeWakeups(ctx, tenant, id, func(sb *torpor.Sandbox) error {
		if len(sb.Wakeups) >= torpor.MaxWakeups {
			return torpor.Invalid("wakeups", "the sandbox has %d wake-ups, the most it may have; remove one first", len(sb.Wakeups))
		}
		ws, err := torpor.NewWakeups("wakeup", []torpor.WakeupSpec{spec}, e.now())
		if err != nil {
			return torpor.Invalid(paramOf(err, "wakeup"), "%s", describeErr(err))
		}
		sb.Wakeups = append(sb.Wakeups, ws...)
		return nil
	})
}

// paramOf names the field of an invalid_argument about the one wake-up
// NewWakeups was given as param[0] by the body's own names.
func paramOf(err error, param string) string {
	var te *torpor.Error
	if !errors.As(err, &te) {
		return param
	}
	if rest, ok := strings.CutPrefix(te.Param, param+"[0]."); ok {
		return rest
	}
	return param
}

// RemoveWakeup removes one of a sandbox's wake-ups by its id.
func (e *Engine) RemoveWakeup(ctx context.Context, tenant, id, wakeup string) (*torpor.Sandbox, error) {
	return e.changeWakeups(ctx, tenant, id, func(sb *torpor.Sandbox) error {
		for i := range sb.Wakeups {
			if sb.Wakeups[i].ID == wakeup {
				sb.Wakeups = append(sb.Wakeups[:i:i], sb.Wakeups[i+1:]...)
				return nil
			}
		}
		err := torpor.Errorf(torpor.ENotFound, "sandbox %s has no wake-up %q", sb.ID, wakeup)
		err.Param = "wakeup"
		return err
	})
}

// changeWakeups changes a sandbox's wake-ups with fn under its lock and
// stores the change (event sandbox.updated), which plans the sandbox
// again.
func (e *Engine) changeWakeups(ctx context.Context, tenant, id string, fn func(sb *torpor.Sandbox) error) (*torpor.Sandbox, error) {
	return e.withSandbox(ctx, tenant, id, func(sb *torpor.Sandbox) error {
		if sb.State == torpor.StateTerminated {
			return gone(sb)
		}
		if sb.Pool != "" {
			return torpor.WrongState("schedule", sb.State)
		}
		if err := fn(sb); err != nil {
			return err
		}
		return e.save(ctx, sb, e.event(sb, "sandbox.updated", "wakeups", strconv.Itoa(len(sb.Wakeups))))
	})
}

// tailBuffer keeps the last max bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if over := len(t.b) - t.max; over > 0 {
		t.b = append(t.b[:0], t.b[over:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

// lastBytes returns the last n bytes of s.
func lastBytes(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[len(s)-n:]
}
