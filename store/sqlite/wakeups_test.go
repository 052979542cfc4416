package sqlite

import (
	"reflect"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

// TestWakeupsRoundTrip: a sandbox's wake-ups, with their last result,
// come back from the record as they went in.
func TestWakeupsRoundTrip(t *testing.T) {
	at := func(d time.Duration) *time.Time {
		v := time.Date(2026, 1, 2, 3, 4, 5, 6000, time.UTC).Add(d)
		return &v
	}
	code := 3
	in := &torpor.Sandbox{ID: "sb", Wakeups: []torpor.Wakeup{
		{ID: "wk_a", WakeupSpec: torpor.WakeupSpec{WakeSchedule: "0 3 * * *", TimeZone: "Europe/Paris", Cmd: []string{"./nightly.sh", "x"}, TimeoutSeconds: 60},
			CreatedAt: *at(0), NextAt: at(time.Hour), RetryAt: at(time.Minute), Waiting: "capacity", Runs: 4,
			LastResult: &torpor.WakeupResult{DueAt: *at(time.Second), StartedAt: *at(2 * time.Second), Late: true, Missed: 2,
				WokeFrom: torpor.StateHibernated, Status: torpor.WakeupDone, FinishedAt: at(3 * time.Second), ExitCode: &code,
				TimedOut: true, Output: "tail", Error: "e"}},
		{ID: "wk_b", WakeupSpec: torpor.WakeupSpec{WakeAt: at(2 * time.Hour)}, CreatedAt: *at(0), NextAt: at(2 * time.Hour)},
	}}
	rec, err := encodeRecord(in)
	if err != nil {
		t.Fatal(err)
	}
	out := &torpor.Sandbox{ID: "sb"}
	if err := decodeRecord(out, rec); err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(in.Wakeups, out.Wakeups) {
		t.Fatalf("wake-ups changed in the record:\n in  %+v\n out %+v", in.Wakeups, out.Wakeups)
	}
}
