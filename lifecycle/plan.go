package lifecycle

import (
	"time"

	"github.com/torpor-dev/torpor"
)

// Causes of idle-engine transitions, recorded on events.
const (
	CauseIdle     = "idle"
	CausePlatform = "platform"
	CauseAuto     = "auto_resume"
	// CauseEnd: the sandbox's end time (Sandbox.EndAt) came.
	CauseEnd = "end"
)

// upcomingWindow is how far ahead upcoming_events looks.
const upcomingWindow = time.Hour

// sleepPlan returns what the idle engine will do to sb if nothing else
// happens, in time order: the first event is the next deadline, the rest
// follow from it (a pause, then the hibernation of the paused sandbox).
// The end time of a running sandbox comes first when it is due before its
// idle action; an idle action that comes first stops it (a paused
// sandbox's end does not run, and a killed one has none). plan adds the
// sandbox's wake-ups (wakeup.go).
func sleepPlan(sb *torpor.Sandbox, maxPaused time.Duration) []torpor.ScheduledEvent {
	if sb.Pool != "" {
		// A warm pool's member waits, frozen, for a claim: no policy
		// pauses, hibernates or ends it (lifecycle/pool.go).
		return nil
	}
	idle := idlePlan(sb, maxPaused)
	if sb.State != torpor.StateRunning || sb.EndAt == nil || (len(idle) > 0 && idle[0].At.Before(*sb.EndAt)) {
		return idle
	}
	end := torpor.ScheduledEvent{Action: sb.OnEnd, At: *sb.EndAt, Cause: CauseEnd}
	if end.Action == torpor.ActionNone {
		end.Action = torpor.ActionKill
	}
	evs := []torpor.ScheduledEvent{end}
	if end.Action == torpor.ActionPause {
		if next, ok := pausedDeadline(end.At, sb.Policy(), maxPaused); ok {
			evs = append(evs, next)
		}
	}
	return withArchive(evs, sb.Policy())
}

// renewEnd restarts sb's end clock as it starts or resumes at now: a
// sandbox with EndAfterSeconds gets that long from now.
func renewEnd(sb *torpor.Sandbox, now time.Time) {
	if sb.EndAfterSeconds > 0 {
		at := now.Add(time.Duration(sb.EndAfterSeconds) * time.Second)
		sb.EndAt = &at
	}
}

// idlePlan is plan without the end time.
func idlePlan(sb *torpor.Sandbox, maxPaused time.Duration) []torpor.ScheduledEvent {
	p := sb.Policy()
	switch sb.State {
	case torpor.StateRunning:
		if p.IdleAction == torpor.ActionNone || p.IdleAfter <= 0 {
			return nil
		}
		at := sb.LastActivityAt.Add(p.IdleAfter)
		evs := []torpor.ScheduledEvent{{Action: p.IdleAction, At: at, Cause: CauseIdle}}
		if p.IdleAction == torpor.ActionPause {
			if next, ok := pausedDeadline(at, p, maxPaused); ok {
				evs = append(evs, next)
			}
		}
		return withArchive(evs, p)
	case torpor.StatePaused:
		// Only hibernation acts on a paused sandbox: its idle timeout never
		// deletes it.
		next, ok := pausedDeadline(sb.StateSince, p, maxPaused)
		if sb.PauseMode == torpor.PauseSnapshot && sb.Accel == nil && p.ArchiveAfterHibernated > 0 {
			// A sandbox paused to a snapshot is archived, memory and all,
			// after as long as a hibernated one, unless it hibernates
			// first.
			arch := torpor.ScheduledEvent{Action: torpor.ActionArchive, At: sb.StateSince.Add(p.ArchiveAfterHibernated), Cause: CauseIdle}
			if !ok || arch.At.Before(next.At) {
				return []torpor.ScheduledEvent{arch}
			}
		}
		if ok {
			return withArchive([]torpor.ScheduledEvent{next}, p)
		}
	case torpor.StateHibernated:
		// A hibernated sandbox's only idle event is its archive
		// (docs/archive.md).
		if p.ArchiveAfterHibernated > 0 {
			return []torpor.ScheduledEvent{{Action: torpor.ActionArchive, At: sb.StateSince.Add(p.ArchiveAfterHibernated), Cause: CauseIdle}}
		}
	}
	return nil
}

// withArchive appends to evs the archive that follows a hibernation they
// end with, when the policy archives.
func withArchive(evs []torpor.ScheduledEvent, p torpor.Policy) []torpor.ScheduledEvent {
	if n := len(evs); n > 0 && evs[n-1].Action == torpor.ActionHibernate && p.ArchiveAfterHibernated > 0 {
		evs = append(evs, torpor.ScheduledEvent{Action: torpor.ActionArchive, At: evs[n-1].At.Add(p.ArchiveAfterHibernated), Cause: CauseIdle})
	}
	return evs
}

// pausedDeadline is when a sandbox paused at since gets hibernated: by its
// policy, or by the platform's maximum pause, whichever comes first.
func pausedDeadline(since time.Time, p torpor.Policy, maxPaused time.Duration) (torpor.ScheduledEvent, bool) {
	ev, ok := torpor.ScheduledEvent{}, false
	if p.HibernateAfterPaused > 0 {
		ev, ok = torpor.ScheduledEvent{Action: torpor.ActionHibernate, At: since.Add(p.HibernateAfterPaused), Cause: CauseIdle}, true
	}
	if maxPaused > 0 && (!ok || since.Add(maxPaused).Before(ev.At)) {
		ev, ok = torpor.ScheduledEvent{Action: torpor.ActionHibernate, At: since.Add(maxPaused), Cause: CausePlatform}, true
	}
	return ev, ok
}

// schedule derives the sandbox's Schedule from its plan.
func schedule(sb *torpor.Sandbox, maxPaused time.Duration, now time.Time) torpor.Schedule {
	var s torpor.Schedule
	s.UpcomingEvents = []torpor.ScheduledEvent{}
	for _, ev := range plan(sb, maxPaused) {
		at := ev.At
		switch ev.Action {
		case torpor.ActionPause:
			if s.PauseAt == nil {
				s.PauseAt = &at
			}
		case torpor.ActionHibernate:
			if s.HibernatesAt == nil {
				s.HibernatesAt = &at
			}
		case torpor.ActionKill:
			if s.KillAt == nil {
				s.KillAt = &at
			}
		case torpor.ActionArchive:
			if s.ArchivesAt == nil {
				s.ArchivesAt = &at
			}
		}
		if !ev.At.After(now.Add(upcomingWindow)) {
			s.UpcomingEvents = append(s.UpcomingEvents, ev)
		}
	}
	return s
}
