package gpu_test

import (
	"testing"
	"time"

	"github.com/torpor-dev/torpor/gpu"
)

// TestSettlingTheSameReplyTwiceAddsZero: a counter is settled exactly
// once; re-reading a reply (or an older one) adds nothing.
func TestSettlingTheSameReplyTwiceAddsZero(t *testing.T) {
	cases := []struct {
		name    string
		replies []gpu.Counters
		want    []gpu.Counters
	}{
		{"first reply settles all", []gpu.Counters{{Busy: 10, Resume: 2}}, []gpu.Counters{{Busy: 10, Resume: 2}}},
		{"re-read adds 0", []gpu.Counters{{Busy: 10, Resume: 2}, {Busy: 10, Resume: 2}}, []gpu.Counters{{Busy: 10, Resume: 2}, {}}},
		{"growth adds the difference", []gpu.Counters{{Busy: 10}, {Busy: 25, Resume: 1}}, []gpu.Counters{{Busy: 10}, {Busy: 15, Resume: 1}}},
		{"an older reply adds 0", []gpu.Counters{{Busy: 25, Resume: 3}, {Busy: 10, Resume: 1}, {Busy: 26, Resume: 3}}, []gpu.Counters{{Busy: 25, Resume: 3}, {}, {Busy: 1}}},
		{"kinds keep their own frontier", []gpu.Counters{{Busy: 5}, {Busy: 5, Resume: 4}}, []gpu.Counters{{Busy: 5}, {Resume: 4}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := gpu.NewSettlement()
			for i, r := range c.replies {
				got := s.Settle("a", r)
				if !near(got.Busy, c.want[i].Busy) || !near(got.Resume, c.want[i].Resume) {
					t.Fatalf("reply %d: settled %+v, want %+v", i, got, c.want[i])
				}
			}
		})
	}
}

// TestFreezeOnlyIntervalLandsOnceOnTheSharedBusyFrontier: the node's
// frozen_billed_s settles as the busy component, on the frontier it
// shares with the exec's busy seconds, so the interval lands exactly
// once however often the front reads the node.
func TestFreezeOnlyIntervalLandsOnceOnTheSharedBusyFrontier(t *testing.T) {
	e := newEnv(t, true)
	e.lease("a", gpu.SuspendTransparent)
	front := gpu.NewSettlement()
	var busy, resume float64
	read := func() {
		c, err := e.m.Counters("a")
		if err != nil {
			t.Fatal(err)
		}
		d := front.Settle("a", c)
		busy += d.Busy
		resume += d.Resume
	}
	e.job("a", 10*time.Second)
	read()
	e.jobChild("a", 1024)
	e.pause("a") // freeze-only
	e.clock.Advance(100 * time.Second)
	read()
	read()
	e.resume("a")
	read()
	read()
	m := e.status("a").Meters
	wantSeconds(t, "frozen_billed_s", m.FrozenBilledS, 100)
	wantSeconds(t, "settled busy", busy, m.BusyS+m.IdleS+m.FrozenBilledS)
	wantSeconds(t, "settled total", busy+resume, m.BilledS)
}

// TestFrontRestartReseedsItsFrontiersFromTheTrail: a front that restarts
// seeds its frontiers from what its ledger holds and does not bill the
// past twice.
func TestFrontRestartReseedsItsFrontiersFromTheTrail(t *testing.T) {
	front := gpu.NewSettlement()
	var ledger gpu.Counters
	add := func(d gpu.Counters) { ledger.Busy += d.Busy; ledger.Resume += d.Resume }
	add(front.Settle("a", gpu.Counters{Busy: 40, Resume: 3}))

	restarted := gpu.NewSettlement()
	restarted.Seed("a", gpu.SettleBusy, ledger.Busy)
	restarted.Seed("a", gpu.SettleResume, ledger.Resume)
	restarted.Seed("a", gpu.SettleBusy, 1) // a lower seed changes nothing
	add(restarted.Settle("a", gpu.Counters{Busy: 40, Resume: 3}))
	add(restarted.Settle("a", gpu.Counters{Busy: 55, Resume: 3}))
	if !near(ledger.Busy, 55) || !near(ledger.Resume, 3) {
		t.Fatalf("ledger = %+v, want busy 55 resume 3", ledger)
	}
	if f := restarted.Frontier("a", gpu.SettleBusy); !near(f, 55) {
		t.Fatalf("frontier = %v", f)
	}
}

// TestNoneLeaseSettlesItsWholeResidencyAsBusy: a none lease's busy
// counter is its residency, frozen time included.
func TestNoneLeaseSettlesItsWholeResidencyAsBusy(t *testing.T) {
	e := newEnv(t, false)
	e.lease("a", gpu.SuspendNone)
	e.job("a", 5*time.Second)
	e.clock.Advance(5 * time.Second)
	e.pause("a")
	e.clock.Advance(50 * time.Second)
	c, err := e.m.Counters("a")
	if err != nil {
		t.Fatal(err)
	}
	m := e.status("a").Meters
	wantSeconds(t, "busy counter", c.Busy, 60)
	wantSeconds(t, "busy counter vs resident_s", c.Busy, m.ResidentS)
	wantSeconds(t, "resume counter", c.Resume, 0)
}
