package lifecycle

import (
	"testing"
	"time"
)

var actT0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// TestActivityOperations: a sandbox is busy while any operation on it is
// under way, and an end without a start never leaves it owing one.
func TestActivityOperations(t *testing.T) {
	type step struct {
		start    bool // opStarted, else opEnded
		wantBusy bool
	}
	cases := []struct {
		name  string
		steps []step
	}{
		{"one operation", []step{{true, true}, {false, false}}},
		{"two overlap", []step{{true, true}, {true, true}, {false, true}, {false, false}}},
		{"an end without a start", []step{{false, false}, {true, true}, {false, false}}},
		{"ends past the starts", []step{{true, true}, {false, false}, {false, false}, {true, true}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := newActivity(0)
			for i, s := range c.steps {
				if s.start {
					a.opStarted("a")
				} else {
					a.opEnded("a")
				}
				if got := a.busy("a"); got != s.wantBusy {
					t.Fatalf("step %d: busy = %v, want %v", i, got, s.wantBusy)
				}
				if got := isClosed(a.beginStop("a")); got == s.wantBusy {
					t.Fatalf("step %d: quiet = %v while busy = %v", i, got, s.wantBusy)
				}
				a.endStop("a")
				if a.busy("b") {
					t.Fatalf("step %d: another sandbox is busy", i)
				}
			}
		})
	}
}

// TestActivityStop: the channel a stop takes while operations are under
// way closes when the last of them ends, not before, and the ends of
// operations say whether a stop is under way.
func TestActivityStop(t *testing.T) {
	a := newActivity(0)
	a.opStarted("a")
	a.opStarted("a")
	if a.opEnded("a") {
		t.Fatal("an operation's end sees a stop before any began")
	}
	a.opStarted("a")
	q := a.beginStop("a")
	if !a.opEnded("a") || isClosed(q) {
		t.Fatal("with an operation still under way: quiet, or the stop unseen")
	}
	if !isClosed(a.beginStop("b")) {
		t.Fatal("a sandbox without operations is not quiet")
	}
	a.endStop("b")
	a.opEnded("a")
	if !isClosed(q) {
		t.Fatal("not quiet once the last operation ended")
	}
	a.endStop("a")
	a.opStarted("a")
	if a.opEnded("a") {
		t.Fatal("an operation's end sees a stop that ended")
	}
}

func isClosed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// TestActivityTraffic: pending traffic keeps its latest moment, requests
// under way are counted, and a flush takes the traffic but not the
// requests.
func TestActivityTraffic(t *testing.T) {
	type note struct {
		at       time.Duration // after actT0
		inflight int
	}
	cases := []struct {
		name         string
		notes        []note
		wantAt       time.Duration
		wantUnderWay bool
	}{
		{"traffic alone", []note{{1 * time.Second, 0}}, 1 * time.Second, false},
		{"never back", []note{{5 * time.Second, 0}, {2 * time.Second, 0}}, 5 * time.Second, false},
		{"a request under way", []note{{1 * time.Second, 1}}, 1 * time.Second, true},
		{"a request that ended", []note{{1 * time.Second, 1}, {3 * time.Second, -1}}, 3 * time.Second, false},
		{"one of two ended", []note{{1 * time.Second, 1}, {2 * time.Second, 1}, {3 * time.Second, -1}}, 3 * time.Second, true},
		{"an end without a start", []note{{1 * time.Second, -1}, {2 * time.Second, 1}}, 2 * time.Second, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := newActivity(0)
			for _, n := range c.notes {
				a.noteTraffic("a", actT0.Add(n.at), n.inflight)
			}
			at, ok := a.pendingTraffic("a")
			if !ok || !at.Equal(actT0.Add(c.wantAt)) {
				t.Fatalf("pending = %v %v, want %v", at, ok, actT0.Add(c.wantAt))
			}
			if got := a.requestsUnderWay("a"); got != c.wantUnderWay {
				t.Fatalf("under way = %v, want %v", got, c.wantUnderWay)
			}
			if _, ok := a.pendingTraffic("b"); ok || a.requestsUnderWay("b") {
				t.Fatal("another sandbox has traffic")
			}
			batch := a.takeTraffic()
			if len(batch) != 1 || !batch["a"].Equal(actT0.Add(c.wantAt)) {
				t.Fatalf("flushed %v", batch)
			}
			if _, ok := a.pendingTraffic("a"); ok {
				t.Fatal("traffic still pending after the flush")
			}
			if got := a.requestsUnderWay("a"); got != c.wantUnderWay {
				t.Fatalf("after the flush: under way = %v, want %v", got, c.wantUnderWay)
			}
		})
	}
}

// TestActivityCPURule: CPU use counts as activity when its average since
// the last usable sample reaches the configured share of a core; without
// a usable sample the sweep looks again after the window.
func TestActivityCPURule(t *testing.T) {
	const idleAfter = 10 * time.Second // window: 10 s, under cpuWindow
	cases := []struct {
		name        string
		share       float64
		prev        *cpuSample // nil: no earlier sample
		used        time.Duration
		at          time.Duration // after actT0
		idleAfter   time.Duration
		wantBusy    bool
		wantRecheck time.Duration
	}{
		{"first sample", 0.1, nil, time.Second, 0, idleAfter, false, 10 * time.Second},
		{"first sample, long idle timeout", 0.1, nil, time.Second, 0, time.Hour, false, cpuWindow},
		{"busy", 0.1, &cpuSample{0, actT0}, 2 * time.Second, 10 * time.Second, idleAfter, true, 0},
		{"exactly the share", 0.1, &cpuSample{0, actT0}, time.Second, 10 * time.Second, idleAfter, true, 0},
		{"under the share", 0.1, &cpuSample{0, actT0}, 999 * time.Millisecond, 10 * time.Second, idleAfter, false, 0},
		{"idle", 0.1, &cpuSample{time.Second, actT0}, time.Second, 10 * time.Second, idleAfter, false, 0},
		{"sample not older", 0.1, &cpuSample{0, actT0.Add(10 * time.Second)}, time.Hour, 10 * time.Second, idleAfter, false, 10 * time.Second},
		{"sample at the edge of the window", 0.1, &cpuSample{0, actT0}, 4 * time.Second, 10*time.Second + sweepRetry, idleAfter, true, 0},
		{"sample too old", 0.1, &cpuSample{0, actT0}, time.Hour, 10*time.Second + sweepRetry + time.Second, idleAfter, false, 10 * time.Second},
		{"counter went back", 0.1, &cpuSample{time.Hour, actT0}, time.Second, 10 * time.Second, idleAfter, false, 10 * time.Second},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			a := newActivity(c.share)
			if c.prev != nil {
				a.samples["a"] = *c.prev
			}
			now := actT0.Add(c.at)
			busy, recheck := a.computing("a", c.used, now, c.idleAfter)
			if busy != c.wantBusy || recheck != c.wantRecheck {
				t.Fatalf("computing = %v, %v; want %v, %v", busy, recheck, c.wantBusy, c.wantRecheck)
			}
			if s := a.samples["a"]; s.used != c.used || !s.at.Equal(now) {
				t.Fatalf("the sample kept is %+v, want this one", s)
			}
		})
	}
}

// TestActivityForgetCPU: a terminated sandbox's sample is dropped, so a
// sandbox of the same id never compares with it.
func TestActivityForgetCPU(t *testing.T) {
	a := newActivity(0.1)
	a.computing("a", 0, actT0, 10*time.Second)
	a.forgetCPU("a")
	if busy, recheck := a.computing("a", time.Hour, actT0.Add(5*time.Second), 10*time.Second); busy || recheck != 10*time.Second {
		t.Fatalf("after forgetCPU: %v, %v; want a first sample", busy, recheck)
	}
}

// TestActivityWatchesCPU: CPU use counts only with a share above 0.
func TestActivityWatchesCPU(t *testing.T) {
	for share, want := range map[float64]bool{0: false, -1: false, 0.1: true} {
		if got := newActivity(share).watchesCPU(); got != want {
			t.Errorf("share %v: watchesCPU = %v, want %v", share, got, want)
		}
	}
}
