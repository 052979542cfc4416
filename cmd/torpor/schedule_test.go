package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

// torpor schedule refuses contradicting flags before it asks the daemon.
func TestScheduleFlags(t *testing.T) {
	getenv := func(string) string { return "" }
	for _, c := range []struct {
		args []string
		err  string
	}{
		{[]string{"schedule", "sb1", "--cron", "@daily", "--at", "+1m"}, "give --cron or --at, not both"},
		{[]string{"schedule", "sb1", "--tz", "Europe/Paris"}, "go with --cron or --at"},
		{[]string{"schedule", "sb1", "--", "./x.sh"}, "go with --cron or --at"},
		{[]string{"schedule", "sb1", "--cron", "@daily", "--clear"}, "separate requests"},
		{[]string{"schedule", "sb1", "--at", "tomorrow"}, "RFC 3339"},
		{[]string{"schedule", "sb1", "sb2", "--at", "+1m", "--", "true"}, "one sandbox id"},
	} {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			// The local admin key is looked for only once a request is
			// made: TORPOR_API_KEY keeps the test from reading one.
			env := func(k string) string {
				if k == "TORPOR_API_KEY" {
					return "tpk_test"
				}
				if k == "TORPOR_URL" {
					return "http://127.0.0.1:1"
				}
				return getenv(k)
			}
			code := Run(context.Background(), c.args, strings.NewReader(""), &stdout, &stderr, env)
			if code == 0 || !strings.Contains(stderr.String(), c.err) {
				t.Fatalf("exit %d, stderr %q; want %q", code, stderr.String(), c.err)
			}
		})
	}
}

func TestParseAt(t *testing.T) {
	now := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	if got, err := parseAt("+90s", now); err != nil || !got.Equal(now.Add(90*time.Second)) {
		t.Fatalf("+90s: %s %v", got, err)
	}
	if got, err := parseAt("2026-12-24T18:00:00+01:00", now); err != nil || !got.Equal(time.Date(2026, 12, 24, 17, 0, 0, 0, time.UTC)) {
		t.Fatalf("RFC 3339: %s %v", got, err)
	}
	for _, bad := range []string{"+", "+-5s", "+soon", "24/12/2026"} {
		if _, err := parseAt(bad, now); err == nil {
			t.Fatalf("%q was taken", bad)
		}
	}
}

// The list shows each wake-up's schedule, next time, runs and last
// result, late runs with the times they folded in.
func TestPrintWakeups(t *testing.T) {
	var out bytes.Buffer
	c := &cli{stdout: &out}
	next := time.Date(2026, 1, 3, 2, 0, 0, 0, time.UTC)
	code := 3
	err := c.printWakeups([]torpor.Wakeup{{ID: "wk_a", WakeupSpec: torpor.WakeupSpec{WakeSchedule: "0 3 * * *", TimeZone: "Europe/Paris", Cmd: []string{"./nightly.sh"}},
		NextAt: &next, Runs: 2, LastResult: &torpor.WakeupResult{Status: torpor.WakeupDone, ExitCode: &code, Late: true, Missed: 1,
			DueAt: next.Add(-48 * time.Hour), StartedAt: next.Add(-20 * time.Hour)}}})
	if err != nil {
		t.Fatal(err)
	}
	s := out.String()
	for _, want := range []string{"wk_a", `cron "0 3 * * *" Europe/Paris`, "done exit 3 late", "1 more missed", "./nightly.sh", "  2  "} {
		if !strings.Contains(s, want) {
			t.Fatalf("the list lacks %q:\n%s", want, s)
		}
	}
}
