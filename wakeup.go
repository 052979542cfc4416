package torpor

import (
	"fmt"
	"strings"
	"time"
	// Every daemon knows every time zone, whatever its host has installed.
	_ "time/tzdata"

	"github.com/robfig/cron/v3"
)

// A sandbox's wake-ups (docs/schedule.md): at a time, or on a cron
// schedule in a time zone, the idle engine wakes the sandbox (a paused or
// hibernated one; a running one just stays running), runs the wake-up's
// command in it, keeps the result, and lets the sandbox sleep again by its
// own idle policy.

// ActionWake is the action of a scheduled wake-up in upcoming_events.
const ActionWake = "wake"

// Bounds of a sandbox's wake-ups.
const (
	// MaxWakeups is how many wake-ups one sandbox may carry.
	MaxWakeups = 16
	// MaxWakeupCmdBytes bounds a wake-up's command, all its arguments
	// together: it is kept in the sandbox's record.
	MaxWakeupCmdBytes = 4096
	// WakeupOutputTail is how much of a wake-up command's output (the
	// end of stdout and stderr together) its result keeps.
	WakeupOutputTail = 4096
	// MinWakeupInterval is the shortest interval of a recurring wake-up.
	MinWakeupInterval = time.Minute
	// maxWakeupTimeout bounds a wake-up command's run time.
	maxWakeupTimeout = 24 * 3600
)

// WakeupSpec is a wake-up as a caller asks for it: exactly one of WakeAt
// (a one-off, RFC 3339) and WakeSchedule (a cron expression: five fields,
// minute hour day-of-month month day-of-week, or a descriptor such as
// @daily), read in TimeZone (an IANA name; empty: UTC). Cmd, when given,
// runs in the sandbox once it is awake, for at most TimeoutSeconds (0: no
// bound but the platform's, a day).
type WakeupSpec struct {
	WakeAt         *time.Time `json:"wake_at,omitempty"`
	WakeSchedule   string     `json:"wake_schedule,omitempty"`
	TimeZone       string     `json:"time_zone,omitempty"`
	Cmd            []string   `json:"cmd,omitempty"`
	TimeoutSeconds int64      `json:"timeout_seconds,omitempty"`
}

// Wakeup is one of a sandbox's wake-ups, with what the engine keeps of it.
type Wakeup struct {
	ID string `json:"id"`
	WakeupSpec
	CreatedAt time.Time `json:"created_at"`
	// NextAt is when it is due next; nil for a one-off that has come.
	NextAt *time.Time `json:"next_at"`
	// RetryAt is when a due wake-up that could not wake its sandbox (the
	// node was full, the tenant at its quota) tries again, and Waiting
	// why it waits.
	RetryAt *time.Time `json:"retry_at,omitempty"`
	Waiting string     `json:"waiting,omitempty"`
	// Runs counts the times it came.
	Runs int64 `json:"runs"`
	// LastResult is what its last run did.
	LastResult *WakeupResult `json:"last_result,omitempty"`
}

// Wake-up run statuses.
const (
	WakeupRunning     = "running"
	WakeupDone        = "done"
	WakeupError       = "error"
	WakeupInterrupted = "interrupted"
)

// WakeupResult is what one run of a wake-up did.
type WakeupResult struct {
	// DueAt is the time the run was for, StartedAt when it came: Late
	// when that was more than WakeupGrace after (the daemon was down, or
	// the sandbox waited for room). Missed counts the later times of a
	// recurring wake-up that had passed too by then: they were folded
	// into this one run, never run on their own.
	DueAt     time.Time `json:"due_at"`
	StartedAt time.Time `json:"started_at"`
	Late      bool      `json:"late"`
	Missed    int       `json:"missed,omitempty"`
	// WokeFrom is the state the run woke the sandbox from (paused,
	// hibernated); empty when it was running.
	WokeFrom State `json:"woke_from,omitempty"`
	// Status is running (the command runs), done (it ended, or there was
	// none), error (the sandbox could not be woken or the command not
	// run: Error says why) or interrupted (the daemon stopped while it ran).
	Status     string     `json:"status"`
	FinishedAt *time.Time `json:"finished_at,omitempty"`
	ExitCode   *int       `json:"exit_code,omitempty"`
	TimedOut   bool       `json:"timed_out,omitempty"`
	// Output is the tail of the command's output, stdout and stderr
	// together (at most WakeupOutputTail bytes).
	Output string `json:"output,omitempty"`
	Error  string `json:"error,omitempty"`
}

// WakeupGrace is how long after its time a wake-up may come and still not
// be late.
const WakeupGrace = time.Minute

// cronParser reads five-field cron expressions and descriptors.
var cronParser = cron.NewParser(cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// Validate checks one wake-up of a request at now, param naming it
// (wakeups[0]).
func (s WakeupSpec) Validate(param string, now time.Time) error {
	switch {
	case s.WakeAt == nil && s.WakeSchedule == "":
		return Invalid(param, "give wake_at (an RFC 3339 time) or wake_schedule (a cron expression)")
	case s.WakeAt != nil && s.WakeSchedule != "":
		return Invalid(param, "give wake_at or wake_schedule, not both")
	case s.WakeAt != nil:
		if s.TimeZone != "" {
			return Invalid(param+".time_zone", "goes with wake_schedule; wake_at carries its own offset")
		}
		if !s.WakeAt.After(now) {
			return Invalid(param+".wake_at", "%s is not in the future (now is %s)", s.WakeAt.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
		}
		if s.WakeAt.Year() > 9999 {
			return Invalid(param+".wake_at", "must be before the year 10000")
		}
	default:
		if _, err := s.schedule(param); err != nil {
			return err
		}
		if _, ok := s.Next(now); !ok {
			return Invalid(param+".wake_schedule", "%q never comes", s.WakeSchedule)
		}
	}
	if err := ValidateArgv(param+".cmd", s.Cmd, true); err != nil {
		return err
	}
	n := 0
	for _, a := range s.Cmd {
		n += len(a)
	}
	if n > MaxWakeupCmdBytes {
		return Invalid(param+".cmd", "at most %d bytes in all (put a longer script in the sandbox and run that)", MaxWakeupCmdBytes)
	}
	if s.TimeoutSeconds < 0 || s.TimeoutSeconds > maxWakeupTimeout {
		return Invalid(param+".timeout_seconds", "must be between 0 and %d", maxWakeupTimeout)
	}
	if s.TimeoutSeconds > 0 && len(s.Cmd) == 0 {
		return Invalid(param+".timeout_seconds", "bounds the command: give cmd too")
	}
	return nil
}

// schedule parses the wake-up's cron expression in its time zone.
func (s WakeupSpec) schedule(param string) (cron.Schedule, error) {
	expr := strings.TrimSpace(s.WakeSchedule)
	if strings.HasPrefix(expr, "TZ=") || strings.HasPrefix(expr, "CRON_TZ=") {
		return nil, Invalid(param+".wake_schedule", "give the time zone as time_zone, not in the expression")
	}
	if len(expr) > 256 {
		return nil, Invalid(param+".wake_schedule", "at most 256 bytes")
	}
	sched, err := cronParser.Parse(expr)
	if err != nil {
		return nil, Invalid(param+".wake_schedule", "%q is not a cron expression (minute hour day-of-month month day-of-week, or @daily, @hourly, ...): %v", truncate(expr), err)
	}
	if every, ok := sched.(cron.ConstantDelaySchedule); ok && every.Delay < MinWakeupInterval {
		return nil, Invalid(param+".wake_schedule", "comes at most once a minute")
	}
	if _, err := s.location(param); err != nil {
		return nil, err
	}
	return sched, nil
}

func (s WakeupSpec) location(param string) (*time.Location, error) {
	if s.TimeZone == "" {
		return time.UTC, nil
	}
	loc, err := time.LoadLocation(s.TimeZone)
	if err != nil || s.TimeZone == "Local" {
		return nil, Invalid(param+".time_zone", "unknown time zone %q (an IANA name such as Europe/Paris)", truncate(s.TimeZone))
	}
	return loc, nil
}

// Next returns the first time of the wake-up strictly after t; false when
// there is none (a one-off at or before t, a schedule that never comes).
func (s WakeupSpec) Next(t time.Time) (time.Time, bool) {
	if s.WakeAt != nil {
		return s.WakeAt.UTC(), s.WakeAt.After(t)
	}
	sched, err := s.schedule("wake_schedule")
	if err != nil {
		return time.Time{}, false
	}
	loc, _ := s.location("time_zone")
	next := sched.Next(t.In(loc))
	if next.IsZero() {
		return time.Time{}, false
	}
	return next.UTC(), true
}

// NewWakeups checks a request's wake-ups at now and returns them, each
// with an id and its first time (nil for none).
func NewWakeups(param string, specs []WakeupSpec, now time.Time) ([]Wakeup, error) {
	if len(specs) > MaxWakeups {
		return nil, Invalid(param, "at most %d wake-ups per sandbox", MaxWakeups)
	}
	var out []Wakeup
	for i, s := range specs {
		p := fmt.Sprintf("%s[%d]", param, i)
		if err := s.Validate(p, now); err != nil {
			return nil, err
		}
		if s.WakeAt != nil {
			at := s.WakeAt.UTC()
			s.WakeAt = &at
		}
		s.Cmd = append([]string(nil), s.Cmd...)
		next, _ := s.Next(now)
		out = append(out, Wakeup{ID: NewID("wk_", 12), WakeupSpec: s, CreatedAt: now, NextAt: &next})
	}
	return out, nil
}

// DueAt is when the engine next acts on the wake-up: its retry when it
// waits, else its next time; false when it has nothing left to do.
func (w *Wakeup) DueAt() (time.Time, bool) {
	if w.RetryAt != nil {
		return *w.RetryAt, true
	}
	if w.NextAt != nil {
		return *w.NextAt, true
	}
	return time.Time{}, false
}

// maxMissedCount bounds the count of missed times a run reports.
const maxMissedCount = 10000

// Take starts a run of a due wake-up at now: it returns the run's result
// (running) and moves the wake-up on to its first time after now, so that
// every time that passed while it could not run (the daemon was down, the
// sandbox waited for room) is folded into this one run. A one-off has no
// time left after it.
func (w *Wakeup) Take(now time.Time) WakeupResult {
	due := now
	if w.NextAt != nil {
		due = *w.NextAt
	}
	r := WakeupResult{DueAt: due, StartedAt: now, Late: now.Sub(due) > WakeupGrace, Status: WakeupRunning}
	w.NextAt, w.RetryAt, w.Waiting = nil, nil, ""
	w.Runs++
	if w.WakeAt != nil {
		return r
	}
	t := due
	for {
		next, ok := w.Next(t)
		if !ok {
			break
		}
		if next.After(now) {
			w.NextAt = &next
			break
		}
		if r.Missed == maxMissedCount {
			// Skip the rest at once: the next time after now.
			if next, ok := w.Next(now); ok {
				w.NextAt = &next
			}
			break
		}
		r.Missed++
		t = next
	}
	return r
}

// CloneWakeups returns a deep copy of ws.
func CloneWakeups(ws []Wakeup) []Wakeup {
	if ws == nil {
		return nil
	}
	out := make([]Wakeup, len(ws))
	for i, w := range ws {
		w.Cmd = append([]string(nil), w.Cmd...)
		w.WakeAt = cloneTime(w.WakeAt)
		w.NextAt = cloneTime(w.NextAt)
		w.RetryAt = cloneTime(w.RetryAt)
		if w.LastResult != nil {
			r := *w.LastResult
			r.FinishedAt = cloneTime(r.FinishedAt)
			if r.ExitCode != nil {
				c := *r.ExitCode
				r.ExitCode = &c
			}
			w.LastResult = &r
		}
		out[i] = w
	}
	return out
}

func cloneTime(t *time.Time) *time.Time {
	if t == nil {
		return nil
	}
	c := *t
	return &c
}
