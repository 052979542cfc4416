package torpor

import (
	"errors"
	"strings"
	"testing"
	"time"
)

func mustTime(t *testing.T, s string) time.Time {
	t.Helper()
	v, err := time.Parse(time.RFC3339, s)
	if err != nil {
		t.Fatal(err)
	}
	return v
}

// TestWakeupNext: the next time of a cron schedule in its time zone,
// across a change of summer time, and of a one-off.
func TestWakeupNext(t *testing.T) {
	at := mustTime(t, "2026-07-01T12:00:00Z")
	cases := []struct {
		name  string
		spec  WakeupSpec
		after string
		want  string // "" for none
	}{
		{"daily in UTC", WakeupSpec{WakeSchedule: "0 3 * * *"}, "2026-03-28T10:00:00Z", "2026-03-29T03:00:00Z"},
		{"daily at 3 in Paris, winter (UTC+1)", WakeupSpec{WakeSchedule: "0 3 * * *", TimeZone: "Europe/Paris"}, "2026-01-10T10:00:00Z", "2026-01-11T02:00:00Z"},
		{"daily at 3 in Paris, summer (UTC+2)", WakeupSpec{WakeSchedule: "0 3 * * *", TimeZone: "Europe/Paris"}, "2026-07-10T10:00:00Z", "2026-07-11T01:00:00Z"},
		{"the night the clocks go forward in Paris", WakeupSpec{WakeSchedule: "30 4 * * *", TimeZone: "Europe/Paris"}, "2026-03-28T12:00:00Z", "2026-03-29T02:30:00Z"},
		{"New York, weekdays at 9", WakeupSpec{WakeSchedule: "0 9 * * 1-5", TimeZone: "America/New_York"}, "2026-12-04T15:00:00Z", "2026-12-07T14:00:00Z"},
		{"strictly after", WakeupSpec{WakeSchedule: "0 3 * * *"}, "2026-03-29T03:00:00Z", "2026-03-30T03:00:00Z"},
		{"descriptor", WakeupSpec{WakeSchedule: "@hourly"}, "2026-03-29T03:10:00Z", "2026-03-29T04:00:00Z"},
		{"one-off ahead", WakeupSpec{WakeAt: &at}, "2026-06-30T00:00:00Z", "2026-07-01T12:00:00Z"},
		{"one-off passed", WakeupSpec{WakeAt: &at}, "2026-07-01T12:00:00Z", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, ok := c.spec.Next(mustTime(t, c.after))
			switch {
			case c.want == "" && ok:
				t.Fatalf("next %s, want none", got)
			case c.want != "" && (!ok || !got.Equal(mustTime(t, c.want))):
				t.Fatalf("next %s (%v), want %s", got, ok, c.want)
			}
		})
	}
}

// TestWakeupTake: a run taken at its time is on time; one taken after the
// daemon was down past several times is late, runs once, counts the
// others as missed, and moves on to the first time after now.
func TestWakeupTake(t *testing.T) {
	daily := WakeupSpec{WakeSchedule: "0 3 * * *"}
	cases := []struct {
		name             string
		spec             WakeupSpec
		next, now        string
		wantLate         bool
		wantMissed       int
		wantNext         string // "" for none left
		wantDue, wantRun string
	}{
		{"on time", daily, "2026-01-02T03:00:00Z", "2026-01-02T03:00:00Z", false, 0, "2026-01-03T03:00:00Z", "2026-01-02T03:00:00Z", ""},
		{"within the grace", daily, "2026-01-02T03:00:00Z", "2026-01-02T03:00:59Z", false, 0, "2026-01-03T03:00:00Z", "2026-01-02T03:00:00Z", ""},
		{"late, none missed", daily, "2026-01-02T03:00:00Z", "2026-01-02T09:00:00Z", true, 0, "2026-01-03T03:00:00Z", "2026-01-02T03:00:00Z", ""},
		{"down past two times", daily, "2026-01-02T03:00:00Z", "2026-01-03T12:00:00Z", true, 1, "2026-01-04T03:00:00Z", "2026-01-02T03:00:00Z", ""},
		{"down a week", daily, "2026-01-02T03:00:00Z", "2026-01-09T03:00:00Z", true, 7, "2026-01-10T03:00:00Z", "2026-01-02T03:00:00Z", ""},
		{"one-off on time", WakeupSpec{WakeAt: ptr(mustTime(t, "2026-01-02T03:00:00Z"))}, "2026-01-02T03:00:00Z", "2026-01-02T03:00:00Z", false, 0, "", "2026-01-02T03:00:00Z", ""},
		{"one-off late", WakeupSpec{WakeAt: ptr(mustTime(t, "2026-01-02T03:00:00Z"))}, "2026-01-02T03:00:00Z", "2026-01-05T00:00:00Z", true, 0, "", "2026-01-02T03:00:00Z", ""},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			next := mustTime(t, c.next)
			w := Wakeup{ID: "wk_x", WakeupSpec: c.spec, NextAt: &next, RetryAt: ptr(next.Add(time.Minute)), Waiting: "capacity"}
			r := w.Take(mustTime(t, c.now))
			if r.Late != c.wantLate || r.Missed != c.wantMissed || !r.DueAt.Equal(mustTime(t, c.wantDue)) || r.Status != WakeupRunning {
				t.Fatalf("result %+v, want late %v missed %d due %s", r, c.wantLate, c.wantMissed, c.wantDue)
			}
			if w.RetryAt != nil || w.Waiting != "" || w.Runs != 1 {
				t.Fatalf("after the take: retry %v waiting %q runs %d", w.RetryAt, w.Waiting, w.Runs)
			}
			switch {
			case c.wantNext == "" && w.NextAt != nil:
				t.Fatalf("next %s, want none", w.NextAt)
			case c.wantNext != "" && (w.NextAt == nil || !w.NextAt.Equal(mustTime(t, c.wantNext))):
				t.Fatalf("next %v, want %s", w.NextAt, c.wantNext)
			}
			// Taken again at the same instant: nothing is due.
			if due, ok := w.DueAt(); ok && !due.After(mustTime(t, c.now)) {
				t.Fatalf("still due at %s after the take", due)
			}
		})
	}
}

func ptr[T any](v T) *T { return &v }

// TestWakeupValidate: bad input is an invalid_argument naming its field.
func TestWakeupValidate(t *testing.T) {
	now := mustTime(t, "2026-01-02T03:00:00Z")
	past, future := now.Add(-time.Second), now.Add(time.Hour)
	cases := []struct {
		name  string
		specs []WakeupSpec
		param string
	}{
		{"neither", []WakeupSpec{{}}, "wakeups[0]"},
		{"both", []WakeupSpec{{WakeAt: &future, WakeSchedule: "@daily"}}, "wakeups[0]"},
		{"past wake_at", []WakeupSpec{{WakeAt: &past}}, "wakeups[0].wake_at"},
		{"now is past", []WakeupSpec{{WakeAt: &now}}, "wakeups[0].wake_at"},
		{"zone with wake_at", []WakeupSpec{{WakeAt: &future, TimeZone: "Europe/Paris"}}, "wakeups[0].time_zone"},
		{"bad cron", []WakeupSpec{{WakeSchedule: "61 * * * *"}}, "wakeups[0].wake_schedule"},
		{"six fields", []WakeupSpec{{WakeSchedule: "0 0 3 * * *"}}, "wakeups[0].wake_schedule"},
		{"zone in the expression", []WakeupSpec{{WakeSchedule: "CRON_TZ=Europe/Paris 0 3 * * *"}}, "wakeups[0].wake_schedule"},
		{"too often", []WakeupSpec{{WakeSchedule: "@every 10s"}}, "wakeups[0].wake_schedule"},
		{"never comes", []WakeupSpec{{WakeSchedule: "0 0 30 2 *"}}, "wakeups[0].wake_schedule"},
		{"unknown zone", []WakeupSpec{{WakeSchedule: "@daily", TimeZone: "Mars/Olympus"}}, "wakeups[0].time_zone"},
		{"Local is no zone", []WakeupSpec{{WakeSchedule: "@daily", TimeZone: "Local"}}, "wakeups[0].time_zone"},
		{"empty program", []WakeupSpec{{WakeSchedule: "@daily", Cmd: []string{""}}}, "wakeups[0].cmd"},
		{"long command", []WakeupSpec{{WakeSchedule: "@daily", Cmd: []string{"sh", "-c", strings.Repeat("x", MaxWakeupCmdBytes)}}}, "wakeups[0].cmd"},
		{"negative timeout", []WakeupSpec{{WakeSchedule: "@daily", Cmd: []string{"true"}, TimeoutSeconds: -1}}, "wakeups[0].timeout_seconds"},
		{"timeout without a command", []WakeupSpec{{WakeSchedule: "@daily", TimeoutSeconds: 5}}, "wakeups[0].timeout_seconds"},
		{"second one bad", []WakeupSpec{{WakeSchedule: "@daily"}, {WakeSchedule: "nope"}}, "wakeups[1].wake_schedule"},
		{"too many", make([]WakeupSpec, MaxWakeups+1), "wakeups"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := NewWakeups("wakeups", c.specs, now)
			var te *Error
			if !errors.As(err, &te) || te.Code != EInvalid || te.Param != c.param {
				t.Fatalf("got %v, want invalid_argument on %s", err, c.param)
			}
		})
	}
	ws, err := NewWakeups("wakeups", []WakeupSpec{{WakeAt: &future, Cmd: []string{"true"}, TimeoutSeconds: 60},
		{WakeSchedule: "0 3 * * *", TimeZone: "Europe/Paris"}}, now)
	if err != nil {
		t.Fatal(err)
	}
	if len(ws) != 2 || ws[0].ID == ws[1].ID || !ws[0].NextAt.Equal(future) || !ws[1].NextAt.Equal(mustTime(t, "2026-01-03T02:00:00Z")) {
		t.Fatalf("wake-ups %+v", ws)
	}
}
