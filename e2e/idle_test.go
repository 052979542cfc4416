package e2e

import (
	"strings"
	"testing"

	"github.com/torpor-dev/torpor"
)

// TestIdleCycle runs a real sandbox through second-scale policies: idle →
// paused → hibernated → exec wakes it (booting it again) → idle → paused →
// exec wakes it (thawing it, memory intact) → paused again.
func TestIdleCycle(t *testing.T) {
	needs(t)
	d := startDaemon(t, torporBin(t), t.TempDir())
	id := strings.TrimSpace(d.ok("create", "--pause-after", "2", "--hibernate-after", "3",
		"--setup", "echo boot >> /boots"))
	if sb := d.get(id); sb.PauseAt == nil || sb.HibernatesAt == nil || len(sb.UpcomingEvents) != 2 {
		t.Fatalf("schedule not shown: %+v", sb.Schedule)
	}
	counter(t, d, id)
	d.waitState(id, torpor.StatePaused)
	sb := d.waitState(id, torpor.StateHibernated)
	if sb.Meters.AutoPaused != 1 || sb.Meters.AutoHibernated != 1 {
		t.Fatalf("meters after idling: %+v", sb.Meters)
	}

	// exec on the hibernated sandbox boots it again and then runs.
	if out := d.ok("exec", id, "--", "cat", "/boots"); out != "boot\nboot\n" {
		t.Fatalf("exec after hibernation: %q", out)
	}
	if sb := d.get(id); sb.State != torpor.StateRunning || sb.Meters.AutoResumed != 1 {
		t.Fatalf("after the waking exec: %s %+v", sb.State, sb.Meters)
	}

	// A new counter; idle again: paused; exec thaws it with memory intact.
	read := counter(t, d, id)
	before, pid := read()
	d.waitState(id, torpor.StatePaused)
	after, pid2 := read() // wakes it
	if pid2 != pid || after < before {
		t.Fatalf("the process did not survive an auto-pause: %d/%s -> %d/%s", before, pid, after, pid2)
	}
	if sb := d.get(id); sb.Meters.AutoResumed != 2 || sb.Meters.AutoPaused != 2 {
		t.Fatalf("meters: %+v", sb.Meters)
	}
	// And the cycle repeats.
	d.waitState(id, torpor.StatePaused)
	evs := d.ok("events", id)
	if !strings.Contains(evs, "sandbox.resumed") || !strings.Contains(evs, "auto=true") || !strings.Contains(evs, "cause=idle") {
		t.Fatalf("events:\n%s", evs)
	}
}

// TestAutoResumeOffAndPatch: with auto_resume off an exec is refused with
// a message to connect; PATCH turns the policy off.
func TestAutoResumeOffAndPatch(t *testing.T) {
	needs(t)
	d := startDaemon(t, torporBin(t), t.TempDir())
	id := strings.TrimSpace(d.ok("create", "--timeout", "1", "--on-timeout", "pause", "--auto-resume=false"))
	d.waitState(id, torpor.StatePaused)
	if _, errs, code := d.cli("exec", id, "--", "true"); code == 0 || !strings.Contains(errs, "connect") {
		t.Fatalf("exec with auto-resume off: %d %q", code, errs)
	}
	d.ok("connect", id)
	d.ok("update", id, "--timeout", "0")
	if sb := d.get(id); sb.State != torpor.StateRunning || sb.PauseAt != nil || len(sb.UpcomingEvents) != 0 {
		t.Fatalf("after turning the timeout off: %s %+v", sb.State, sb.Schedule)
	}
}
