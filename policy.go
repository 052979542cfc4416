package torpor

import (
	"bytes"
	"encoding/json"
	"time"
)

// OptSeconds is a policy field in seconds that can be absent (not Set: keep
// the current value or the server's default), null (Set and Null: turned
// off) or a number.
type OptSeconds struct {
	Set   bool
	Null  bool
	Value int64
}

// Seconds returns a set, non-null OptSeconds.
func Seconds(n int64) OptSeconds { return OptSeconds{Set: true, Value: n} }

// Off returns a null OptSeconds: the rule is turned off.
func Off() OptSeconds { return OptSeconds{Set: true, Null: true} }

// On reports whether the field holds a number.
func (o OptSeconds) On() bool { return o.Set && !o.Null }

// Duration is the value as a duration (0 when off).
func (o OptSeconds) Duration() time.Duration {
	if !o.On() {
		return 0
	}
	return time.Duration(o.Value) * time.Second
}

// IsZero makes `omitzero` leave an absent field out.
func (o OptSeconds) IsZero() bool { return !o.Set }

// MarshalJSON writes null or the number.
func (o OptSeconds) MarshalJSON() ([]byte, error) {
	if !o.On() {
		return []byte("null"), nil
	}
	return json.Marshal(o.Value)
}

// UnmarshalJSON reads null or a whole number of seconds.
func (o *OptSeconds) UnmarshalJSON(b []byte) error {
	*o = OptSeconds{Set: true}
	if bytes.Equal(bytes.TrimSpace(b), []byte("null")) {
		o.Null = true
		return nil
	}
	return json.Unmarshal(b, &o.Value)
}

// OptTime is a time field that can be absent (not Set), null (Set and
// Null: cleared) or a time, written as RFC 3339.
type OptTime struct {
	Set   bool
	Null  bool
	Value time.Time
}

// At returns a set, non-null OptTime.
func At(t time.Time) OptTime { return OptTime{Set: true, Value: t} }

// IsZero makes `omitzero` leave an absent field out.
func (o OptTime) IsZero() bool { return !o.Set }

// MarshalJSON writes null or the time.
func (o OptTime) MarshalJSON() ([]byte, error) {
	if !o.Set || o.Null {
		return []byte("null"), nil
	}
	return json.Marshal(o.Value.UTC())
}

// UnmarshalJSON reads null or an RFC 3339 time.
func (o *OptTime) UnmarshalJSON(b []byte) error {
	*o = OptTime{Set: true}
	if bytes.Equal(bytes.TrimSpace(b), []byte("null")) {
		o.Null = true
		return nil
	}
	if err := json.Unmarshal(b, &o.Value); err != nil {
		return err
	}
	o.Value = o.Value.UTC()
	return nil
}

// Idle actions.
const (
	ActionNone      = ""
	ActionKill      = "kill"
	ActionPause     = "pause"
	ActionHibernate = "hibernate"
	// ActionArchive packs a hibernated sandbox's disk into its archive
	// (docs/archive.md); only the idle engine does it.
	ActionArchive = "archive"
)

// Lifecycle is the CubeSandbox form of the idle policy (with Timeout on
// the sandbox): what to do when the idle timeout passes, and whether a
// request to a paused sandbox wakes it.
type Lifecycle struct {
	// OnTimeout is kill (the default), pause or hibernate.
	OnTimeout string `json:"on_timeout,omitempty"`
	// AutoResume wakes a paused or hibernated sandbox on the next
	// operation. Nil means the default, true.
	AutoResume *bool `json:"auto_resume,omitempty"`
	// PauseMode is how the idle engine pauses the sandbox (freeze or
	// snapshot); empty means the runtime's default.
	PauseMode PauseMode `json:"pause_mode,omitempty"`
}

// LifecyclePolicy is the machine-policy form of the idle policy (spec 003).
type LifecyclePolicy struct {
	PauseAfterIdleSeconds       OptSeconds `json:"pause_after_idle_seconds,omitzero"`
	HibernateAfterPausedSeconds OptSeconds `json:"hibernate_after_paused_seconds,omitzero"`
	ConnectionIdleSeconds       OptSeconds `json:"connection_idle_seconds,omitzero"`
	// ArchiveAfterHibernatedSeconds archives a sandbox hibernated this
	// long (docs/archive.md).
	ArchiveAfterHibernatedSeconds OptSeconds `json:"archive_after_hibernated_seconds,omitzero"`
}

// Policy is the one internal idle policy both forms map onto.
type Policy struct {
	// IdleAction happens IdleAfter after the last activity of a running
	// sandbox (ActionNone: never).
	IdleAction string
	IdleAfter  time.Duration
	// HibernateAfterPaused hibernates a sandbox paused this long (0: never).
	HibernateAfterPaused time.Duration
	// ConnectionIdle is how long a silent connection still counts as
	// activity.
	ConnectionIdle time.Duration
	AutoResume     bool
	// ArchiveAfterHibernated archives a sandbox hibernated this long (0:
	// never).
	ArchiveAfterHibernated time.Duration
}

// MaxPolicySeconds bounds every policy duration (one year).
const MaxPolicySeconds = 365 * 24 * 3600

// Policy derives the internal policy from the sandbox's two forms:
//   - timeout T with on_timeout A: A (kill by default) after T idle seconds;
//   - pause_after_idle_seconds P: pause after P idle seconds;
//   - hibernate_after_paused_seconds H: hibernate after H seconds paused,
//     or, when neither T nor P is set, hibernate after H idle seconds;
//   - connection_idle_seconds C: a silent connection stops counting after C;
//   - auto_resume: true unless set false.
func (s *Sandbox) Policy() Policy {
	p := Policy{AutoResume: true, ConnectionIdle: s.LifecyclePolicy.ConnectionIdleSeconds.Duration(),
		ArchiveAfterHibernated: s.LifecyclePolicy.ArchiveAfterHibernatedSeconds.Duration()}
	if s.Lifecycle != nil && s.Lifecycle.AutoResume != nil {
		p.AutoResume = *s.Lifecycle.AutoResume
	}
	lp := s.LifecyclePolicy
	switch {
	case s.Timeout.On():
		p.IdleAction, p.IdleAfter = ActionKill, s.Timeout.Duration()
		if s.Lifecycle != nil && s.Lifecycle.OnTimeout != "" {
			p.IdleAction = s.Lifecycle.OnTimeout
		}
		p.HibernateAfterPaused = lp.HibernateAfterPausedSeconds.Duration()
	case lp.PauseAfterIdleSeconds.On():
		p.IdleAction, p.IdleAfter = ActionPause, lp.PauseAfterIdleSeconds.Duration()
		p.HibernateAfterPaused = lp.HibernateAfterPausedSeconds.Duration()
	case lp.HibernateAfterPausedSeconds.On():
		p.IdleAction, p.IdleAfter = ActionHibernate, lp.HibernateAfterPausedSeconds.Duration()
		p.HibernateAfterPaused = lp.HibernateAfterPausedSeconds.Duration()
	}
	return p
}

// PolicyRequest holds the policy fields of a create or PATCH request.
type PolicyRequest struct {
	Timeout         OptSeconds       `json:"timeout,omitzero"`
	Lifecycle       *Lifecycle       `json:"lifecycle,omitempty"`
	LifecyclePolicy *LifecyclePolicy `json:"lifecycle_policy,omitempty"`
	// The end time (see Sandbox.EndAt): end_at sets it (null: no end),
	// end_after_seconds sets the run time each create, start and resume
	// grants (and, without end_at, the end to now plus it), on_end what
	// happens at the end.
	EndAt           OptTime    `json:"end_at,omitzero"`
	EndAfterSeconds OptSeconds `json:"end_after_seconds,omitzero"`
	OnEnd           string     `json:"on_end,omitempty"`
}

// Validate checks the fields that are given.
func (r PolicyRequest) Validate() error {
	if err := checkSeconds("timeout", r.Timeout, 1); err != nil {
		return err
	}
	if err := checkSeconds("end_after_seconds", r.EndAfterSeconds, 1); err != nil {
		return err
	}
	if r.EndAt.Set && !r.EndAt.Null && (r.EndAt.Value.Year() < 2000 || r.EndAt.Value.Year() > 9999) {
		return Invalid("end_at", "must be a time (RFC 3339) between the years 2000 and 9999, or null for no end")
	}
	switch r.OnEnd {
	case "", ActionKill, ActionPause, ActionHibernate:
	default:
		return Invalid("on_end", "must be kill, pause or hibernate")
	}
	if l := r.Lifecycle; l != nil {
		switch l.OnTimeout {
		case "", ActionKill, ActionPause, ActionHibernate:
		default:
			return Invalid("lifecycle.on_timeout", "must be kill, pause or hibernate")
		}
		switch l.PauseMode {
		case "", PauseFreeze, PauseSnapshot:
		default:
			return Invalid("lifecycle.pause_mode", "must be freeze or snapshot")
		}
	}
	if lp := r.LifecyclePolicy; lp != nil {
		for _, f := range []struct {
			name string
			v    OptSeconds
			min  int64
		}{
			{"lifecycle_policy.pause_after_idle_seconds", lp.PauseAfterIdleSeconds, 1},
			{"lifecycle_policy.hibernate_after_paused_seconds", lp.HibernateAfterPausedSeconds, 1},
			{"lifecycle_policy.connection_idle_seconds", lp.ConnectionIdleSeconds, 1},
			{"lifecycle_policy.archive_after_hibernated_seconds", lp.ArchiveAfterHibernatedSeconds, 1},
		} {
			if err := checkSeconds(f.name, f.v, f.min); err != nil {
				return err
			}
		}
		if r.Timeout.On() && lp.PauseAfterIdleSeconds.On() {
			return Invalid("lifecycle_policy.pause_after_idle_seconds", "contradicts timeout: give the idle timeout in one form, timeout + lifecycle.on_timeout or lifecycle_policy")
		}
	}
	return nil
}

func checkSeconds(param string, v OptSeconds, min int64) error {
	if !v.On() {
		return nil
	}
	if v.Value < min {
		return Invalid(param, "must be at least %d second(s), or null to turn it off", min)
	}
	if v.Value > MaxPolicySeconds {
		return Invalid(param, "must be at most %d seconds (a year)", MaxPolicySeconds)
	}
	return nil
}

// Apply merges the fields a request gives into the sandbox's policy, at
// now. A timeout given in the CubeSandbox form turns an existing pause
// timer of the machine-policy form off, and the other way round, so the
// two never contradict. end_after_seconds without end_at moves the end
// time to now plus it.
func (r PolicyRequest) Apply(s *Sandbox, now time.Time) {
	if r.EndAfterSeconds.Set {
		s.EndAfterSeconds = 0
		if r.EndAfterSeconds.On() {
			s.EndAfterSeconds = r.EndAfterSeconds.Value
			if !r.EndAt.Set {
				at := now.Add(r.EndAfterSeconds.Duration())
				s.EndAt = &at
			}
		}
	}
	if r.EndAt.Set {
		s.EndAt = nil
		if !r.EndAt.Null {
			at := r.EndAt.Value.UTC()
			s.EndAt = &at
		}
	}
	if r.OnEnd != "" {
		s.OnEnd = r.OnEnd
	}
	if r.Timeout.Set {
		s.Timeout = r.Timeout
		if r.Timeout.On() {
			s.LifecyclePolicy.PauseAfterIdleSeconds = Off()
		}
	}
	if l := r.Lifecycle; l != nil {
		cur := Lifecycle{}
		if s.Lifecycle != nil {
			cur = *s.Lifecycle
		}
		if l.OnTimeout != "" {
			cur.OnTimeout = l.OnTimeout
		}
		if l.AutoResume != nil {
			v := *l.AutoResume
			cur.AutoResume = &v
		}
		if l.PauseMode != "" {
			cur.PauseMode = l.PauseMode
		}
		s.Lifecycle = &cur
	}
	if lp := r.LifecyclePolicy; lp != nil {
		if lp.PauseAfterIdleSeconds.Set {
			s.LifecyclePolicy.PauseAfterIdleSeconds = lp.PauseAfterIdleSeconds
			if lp.PauseAfterIdleSeconds.On() {
				s.Timeout = Off()
			}
		}
		if lp.HibernateAfterPausedSeconds.Set {
			s.LifecyclePolicy.HibernateAfterPausedSeconds = lp.HibernateAfterPausedSeconds
		}
		if lp.ConnectionIdleSeconds.Set {
			s.LifecyclePolicy.ConnectionIdleSeconds = lp.ConnectionIdleSeconds
		}
		if lp.ArchiveAfterHibernatedSeconds.Set {
			s.LifecyclePolicy.ArchiveAfterHibernatedSeconds = lp.ArchiveAfterHibernatedSeconds
		}
	}
}

// ScheduledEvent is something the idle engine will do to a sandbox.
type ScheduledEvent struct {
	Action string    `json:"action"`
	At     time.Time `json:"at"`
	// Cause is idle (the sandbox's policy), end (its end time),
	// platform (max_paused_seconds) or wake_up (one of its wake-ups,
	// named by Wakeup).
	Cause  string `json:"cause"`
	Wakeup string `json:"wakeup,omitempty"`
}

// Schedule is what the idle engine plans for a sandbox. It is derived
// from the record and the clock, never stored.
type Schedule struct {
	PauseAt        *time.Time       `json:"pause_at"`
	HibernatesAt   *time.Time       `json:"hibernates_at"`
	KillAt         *time.Time       `json:"kill_at"`
	ArchivesAt     *time.Time       `json:"archives_at,omitempty"`
	UpcomingEvents []ScheduledEvent `json:"upcoming_events"`
}
