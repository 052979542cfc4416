package sqlite

import (
	"time"

	"github.com/torpor-dev/torpor"
)

// wakeupRecord is the stored form of a sandbox's wake-up (times in
// microseconds, as the rest of the record).
type wakeupRecord struct {
	ID             string        `json:"id"`
	WakeAt         *int64        `json:"wake_at_us,omitempty"`
	WakeSchedule   string        `json:"wake_schedule,omitempty"`
	TimeZone       string        `json:"time_zone,omitempty"`
	Cmd            []string      `json:"cmd,omitempty"`
	TimeoutSeconds int64         `json:"timeout_s,omitempty"`
	CreatedAt      int64         `json:"created_at_us"`
	NextAt         *int64        `json:"next_at_us,omitempty"`
	RetryAt        *int64        `json:"retry_at_us,omitempty"`
	Waiting        string        `json:"waiting,omitempty"`
	Runs           int64         `json:"runs,omitempty"`
	Last           *wakeupResult `json:"last,omitempty"`
}

type wakeupResult struct {
	DueAt      int64  `json:"due_at_us"`
	StartedAt  int64  `json:"started_at_us"`
	Late       bool   `json:"late,omitempty"`
	Missed     int    `json:"missed,omitempty"`
	WokeFrom   string `json:"woke_from,omitempty"`
	Status     string `json:"status"`
	FinishedAt *int64 `json:"finished_at_us,omitempty"`
	ExitCode   *int   `json:"exit_code,omitempty"`
	TimedOut   bool   `json:"timed_out,omitempty"`
	Output     string `json:"output,omitempty"`
	Error      string `json:"error,omitempty"`
}

func optMicros(t *time.Time) *int64 {
	if t == nil {
		return nil
	}
	us := micros(*t)
	return &us
}

func optTime(us *int64) *time.Time {
	if us == nil {
		return nil
	}
	t := fromMicros(*us)
	return &t
}

func wakeupRecords(ws []torpor.Wakeup) []wakeupRecord {
	var out []wakeupRecord
	for _, w := range ws {
		r := wakeupRecord{ID: w.ID, WakeAt: optMicros(w.WakeAt), WakeSchedule: w.WakeSchedule, TimeZone: w.TimeZone,
			Cmd: w.Cmd, TimeoutSeconds: w.TimeoutSeconds, CreatedAt: micros(w.CreatedAt), NextAt: optMicros(w.NextAt),
			RetryAt: optMicros(w.RetryAt), Waiting: w.Waiting, Runs: w.Runs}
		if l := w.LastResult; l != nil {
			r.Last = &wakeupResult{DueAt: micros(l.DueAt), StartedAt: micros(l.StartedAt), Late: l.Late, Missed: l.Missed,
				WokeFrom: string(l.WokeFrom), Status: l.Status, FinishedAt: optMicros(l.FinishedAt), ExitCode: l.ExitCode,
				TimedOut: l.TimedOut, Output: l.Output, Error: l.Error}
		}
		out = append(out, r)
	}
	return out
}

func wakeupsOf(rs []wakeupRecord) []torpor.Wakeup {
	var out []torpor.Wakeup
	for _, r := range rs {
		w := torpor.Wakeup{ID: r.ID, WakeupSpec: torpor.WakeupSpec{WakeAt: optTime(r.WakeAt), WakeSchedule: r.WakeSchedule,
			TimeZone: r.TimeZone, Cmd: r.Cmd, TimeoutSeconds: r.TimeoutSeconds}, CreatedAt: fromMicros(r.CreatedAt),
			NextAt: optTime(r.NextAt), RetryAt: optTime(r.RetryAt), Waiting: r.Waiting, Runs: r.Runs}
		if l := r.Last; l != nil {
			w.LastResult = &torpor.WakeupResult{DueAt: fromMicros(l.DueAt), StartedAt: fromMicros(l.StartedAt), Late: l.Late,
				Missed: l.Missed, WokeFrom: torpor.State(l.WokeFrom), Status: l.Status, FinishedAt: optTime(l.FinishedAt),
				ExitCode: l.ExitCode, TimedOut: l.TimedOut, Output: l.Output, Error: l.Error}
		}
		out = append(out, w)
	}
	return out
}
