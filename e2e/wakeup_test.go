package e2e

import (
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

// TestScheduledWakeup: `torpor schedule --at` a few seconds ahead on a
// paused sandbox wakes it at that time (cause wake_up), runs the command,
// keeps its exit code and output as the wake-up's last result, and the
// sandbox is paused again by its idle policy.
func TestScheduledWakeup(t *testing.T) {
	needs(t)
	d := startDaemon(t, torporBin(t), t.TempDir())
	id := strings.TrimSpace(d.ok("create", "--pause-after", "2"))
	d.ok("exec", id, "--", "sh", "-c", "echo before > /tmp/mark")
	d.ok("pause", id)
	out := d.ok("schedule", id, "--at", "+3s", "--timeout", "30s", "--", "sh", "-c", "cat /tmp/mark; echo woke; exit 7")
	if !strings.HasPrefix(out, "wk_") {
		t.Fatalf("torpor schedule printed %q", out)
	}
	sb := d.get(id)
	if len(sb.Wakeups) != 1 || sb.Wakeups[0].NextAt == nil || len(sb.UpcomingEvents) == 0 || sb.UpcomingEvents[0].Action != torpor.ActionWake {
		t.Fatalf("the wake-up does not show: %+v %+v", sb.Wakeups, sb.UpcomingEvents)
	}
	if got := d.ok("get", id); !strings.Contains(got, "Wake-up:") || !strings.Contains(got, "at ") {
		t.Fatalf("torpor get:\n%s", got)
	}

	deadline := time.Now().Add(30 * time.Second)
	var r *torpor.WakeupResult
	for {
		sb = d.get(id)
		if r = sb.Wakeups[0].LastResult; r != nil && r.Status != torpor.WakeupRunning {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the wake-up did not run: %+v\n%s", sb.Wakeups[0], d.logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if r.Status != torpor.WakeupDone || r.ExitCode == nil || *r.ExitCode != 7 || r.Output != "before\nwoke\n" || r.Late || r.WokeFrom != torpor.StatePaused {
		t.Fatalf("result %+v", r)
	}
	if sb.Wakeups[0].NextAt != nil || sb.Wakeups[0].Runs != 1 {
		t.Fatalf("a one-off after its run: %+v", sb.Wakeups[0])
	}
	// Asleep again by its own policy, two seconds after the command.
	d.waitState(id, torpor.StatePaused)
	evs := d.ok("events", id)
	for _, want := range []string{"sandbox.resumed", "cause=wake_up", "sandbox.wakeup_done", "exit_code=7"} {
		if !strings.Contains(evs, want) {
			t.Fatalf("events lack %q:\n%s", want, evs)
		}
	}
	if list := d.ok("schedule", id); !strings.Contains(list, "done exit 7") {
		t.Fatalf("torpor schedule lists:\n%s", list)
	}
	d.ok("schedule", id, "--clear")
	if sb := d.get(id); len(sb.Wakeups) != 0 {
		t.Fatalf("after --clear: %+v", sb.Wakeups)
	}
}

// TestMissedWakeupOfAHibernatedSandbox: a one-off wake-up of a hibernated
// sandbox whose time passes while the daemon is down runs once when the
// daemon is back: the sandbox boots on its kept disk (woke from
// hibernated), runs the command, keeps its result, and hibernates again
// by its own policy.
func TestMissedWakeupOfAHibernatedSandbox(t *testing.T) {
	needs(t)
	bin, dataDir := torporBin(t), t.TempDir()
	d := startDaemon(t, bin, dataDir)
	id := strings.TrimSpace(d.ok("create", "--hibernate-after", "2"))
	d.ok("exec", id, "--", "sh", "-c", "echo kept > /root/mark")
	d.ok("hibernate", id)
	at := time.Now().Add(3 * time.Second)
	d.ok("schedule", id, "--at", at.UTC().Format(time.RFC3339Nano), "--", "sh", "-c", "cat /root/mark; echo woke")
	d.stop()
	time.Sleep(time.Until(at) + time.Second)

	d = startDaemon(t, bin, dataDir)
	deadline := time.Now().Add(45 * time.Second)
	var sb *torpor.Sandbox
	var r *torpor.WakeupResult
	for {
		sb = d.get(id)
		if r = sb.Wakeups[0].LastResult; r != nil && r.Status != torpor.WakeupRunning {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the missed wake-up did not run: %+v\n%s", sb.Wakeups[0], d.logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if r.Status != torpor.WakeupDone || r.ExitCode == nil || *r.ExitCode != 0 || r.Output != "kept\nwoke\n" || r.WokeFrom != torpor.StateHibernated {
		t.Fatalf("result %+v", r)
	}
	if sb.Wakeups[0].Runs != 1 || sb.Wakeups[0].NextAt != nil {
		t.Fatalf("a missed one-off after its run: %+v", sb.Wakeups[0])
	}
	d.waitState(id, torpor.StateHibernated)
	if got := d.get(id).Wakeups[0]; got.Runs != 1 {
		t.Fatalf("the wake-up ran %d times", got.Runs)
	}
	evs := d.ok("events", id)
	if n := strings.Count(evs, "sandbox.wakeup_done"); n != 1 {
		t.Fatalf("%d wakeup_done events, want 1:\n%s", n, evs)
	}
}
