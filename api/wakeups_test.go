package api_test

import (
	"errors"
	"net/http"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/lifecycle"
)

// TestWakeupsThroughTheClient: wake-ups set at create, added, listed,
// shown in the sandbox object and its upcoming events, removed and
// cleared through the Go client; bad ones are 400 naming the field.
func TestWakeupsThroughTheClient(t *testing.T) {
	f := newFixture(t)
	cl := f.tenantCl
	soon := time.Now().Add(30 * time.Minute).UTC().Truncate(time.Second)
	sb, err := cl.Create(ctx, torpor.CreateRequest{Template: "base", Wakeups: []torpor.WakeupSpec{{WakeAt: &soon, Cmd: []string{"./report.sh"}, TimeoutSeconds: 60}}})
	if err != nil {
		t.Fatal(err)
	}
	if len(sb.Wakeups) != 1 || !sb.Wakeups[0].NextAt.Equal(soon) || len(sb.UpcomingEvents) != 1 ||
		sb.UpcomingEvents[0].Action != torpor.ActionWake || sb.UpcomingEvents[0].Cause != lifecycle.CauseWakeup {
		t.Fatalf("created %+v %+v", sb.Wakeups, sb.UpcomingEvents)
	}
	w, err := cl.AddWakeup(ctx, sb.ID, torpor.WakeupSpec{WakeSchedule: "0 3 * * *", TimeZone: "Europe/Paris", Cmd: []string{"./nightly.sh"}})
	if err != nil || w.ID == "" || w.NextAt == nil || w.TimeZone != "Europe/Paris" {
		t.Fatalf("added %+v %v", w, err)
	}
	ws, err := cl.Wakeups(ctx, sb.ID)
	if err != nil || len(ws) != 2 || ws[1].ID != w.ID {
		t.Fatalf("listed %+v %v", ws, err)
	}
	for _, c := range []struct {
		spec  torpor.WakeupSpec
		param string
	}{
		{torpor.WakeupSpec{WakeSchedule: "every night"}, "wake_schedule"},
		{torpor.WakeupSpec{WakeSchedule: "@daily", TimeZone: "Europe/Atlantis"}, "time_zone"},
		{torpor.WakeupSpec{WakeAt: ptrTime(time.Now().Add(-time.Hour))}, "wake_at"},
	} {
		_, err := cl.AddWakeup(ctx, sb.ID, c.spec)
		var te *torpor.Error
		if !errors.As(err, &te) || te.Code != torpor.EInvalid || te.Param != c.param {
			t.Fatalf("adding %+v: %v, want invalid %s", c.spec, err, c.param)
		}
	}
	if code, eb := f.raw(t, "PUT", "/v1/sandboxes/"+sb.ID+"/wakeups", f.acmeKey, "application/json",
		`{"wakeups":[{"wake_schedule":"@daily"},{"wake_schedule":"@daily","cmd":["sh","-c",""],"timeout_seconds":-1}]}`); code != http.StatusBadRequest || eb.Error.Param != "wakeups[1].timeout_seconds" {
		t.Fatalf("a bad PUT: %d %+v", code, eb)
	}
	if ws, _ := cl.Wakeups(ctx, sb.ID); len(ws) != 2 {
		t.Fatalf("a refused PUT changed the wake-ups: %+v", ws)
	}
	if err := cl.RemoveWakeup(ctx, sb.ID, w.ID); err != nil {
		t.Fatal(err)
	}
	if err := cl.RemoveWakeup(ctx, sb.ID, w.ID); !torpor.IsCode(err, torpor.ENotFound) {
		t.Fatalf("removing it again: %v", err)
	}
	ws, err = cl.SetWakeups(ctx, sb.ID, []torpor.WakeupSpec{{WakeSchedule: "@hourly"}, {WakeSchedule: "@daily"}})
	if err != nil || len(ws) != 2 {
		t.Fatalf("set %+v %v", ws, err)
	}
	if err := cl.ClearWakeups(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	got, err := cl.Get(ctx, sb.ID)
	if err != nil || len(got.Wakeups) != 0 || len(got.UpcomingEvents) != 0 {
		t.Fatalf("after clearing: %+v %v", got, err)
	}
	// PATCH replaces them too.
	specs := []torpor.WakeupSpec{{WakeSchedule: "@weekly"}}
	if got, err = cl.Update(ctx, sb.ID, torpor.UpdateRequest{Wakeups: &specs}); err != nil || len(got.Wakeups) != 1 {
		t.Fatalf("PATCH wakeups: %+v %v", got, err)
	}
}

func ptrTime(t time.Time) *time.Time { return &t }
