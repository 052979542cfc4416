package lifecycle

import (
	"sync"
	"time"
)

// activity is what the engine knows of each sandbox's use that the store
// does not (yet) hold: operations under way, activity (proxied traffic,
// the starts and ends of operations) noted but not yet flushed, proxied
// requests under way, and the last CPU sample. The
// idle sweep consults it before it acts (see deferIdle), so a sandbox in
// use is never paused under its user. It is safe for concurrent use: the
// proxy notes traffic on its hot path, so every call is a short critical
// section under one lock.
type activity struct {
	// cpuShare, when above 0, is the average share of a core (0.1: a tenth
	// of one) from which a sandbox's CPU use counts as activity.
	cpuShare float64

	mu       sync.Mutex
	ops      map[string]int           // operations under way (operate to done)
	stopping map[string]bool          // a pause or hibernation is under way
	quiets   map[string]chan struct{} // closed when a sandbox's ops reach 0
	traffic  map[string]time.Time     // the latest activity not yet flushed
	inflight map[string]int           // proxied requests under way
	// reqQuiets are closed when a sandbox's proxied requests reach 0.
	reqQuiets map[string]chan struct{}
	samples   map[string]cpuSample // the last CPU sample the sweep took
}

// cpuSample is a sandbox's CPU use at a moment.
type cpuSample struct {
	used time.Duration
	at   time.Time
}

// cpuWindow is the longest span a CPU sample is compared over.
const cpuWindow = 30 * time.Second

func newActivity(cpuShare float64) *activity {
	return &activity{
		cpuShare:  cpuShare,
		ops:       map[string]int{},
		stopping:  map[string]bool{},
		quiets:    map[string]chan struct{}{},
		traffic:   map[string]time.Time{},
		inflight:  map[string]int{},
		reqQuiets: map[string]chan struct{}{},
		samples:   map[string]cpuSample{},
	}
}

// opStarted and opEnded bracket an operation on a sandbox (exec, files,
// code); while any is under way the sandbox is busy.
func (a *activity) opStarted(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.ops[id]++
}

// opEnded: see opStarted. It reports whether a pause or hibernation of
// the sandbox is under way (see beginStop), which makes the activity at
// the operation's end moot.
func (a *activity) opEnded(id string) (stopping bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.ops[id]--; a.ops[id] <= 0 {
		delete(a.ops, id)
		if ch := a.quiets[id]; ch != nil {
			close(ch)
			delete(a.quiets, id)
		}
	}
	return a.stopping[id]
}

// beginStop marks a pause or hibernation of the sandbox under way, until
// endStop, and returns a channel that is closed once no operation on it
// is under way: at once when none is. A drain waits on it (see
// Engine.drain), with the sandbox's lock held so that no new one starts.
func (a *activity) beginStop(id string) <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.stopping[id] = true
	if a.ops[id] <= 0 {
		return closedChan
	}
	ch := a.quiets[id]
	if ch == nil {
		ch = make(chan struct{})
		a.quiets[id] = ch
	}
	return ch
}

// endStop: see beginStop.
func (a *activity) endStop(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.stopping, id)
	delete(a.quiets, id)
}

// closedChan is a channel that is always closed.
var closedChan = func() chan struct{} {
	ch := make(chan struct{})
	close(ch)
	return ch
}()

// busy tells whether an operation on the sandbox is under way.
func (a *activity) busy(id string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.ops[id] > 0
}

// noteTraffic records traffic to a sandbox at at (the pending traffic
// never moves back) and adds inflight (+1 when a proxied request starts,
// -1 when it ends, 0 for traffic alone) to its requests under way.
func (a *activity) noteTraffic(id string, at time.Time, inflight int) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if at.After(a.traffic[id]) {
		a.traffic[id] = at
	}
	if inflight != 0 {
		if a.inflight[id] += inflight; a.inflight[id] <= 0 {
			delete(a.inflight, id)
			if ch := a.reqQuiets[id]; ch != nil {
				close(ch)
				delete(a.reqQuiets, id)
			}
		}
	}
}

// requestsUnderWay tells whether proxied requests to the sandbox are under
// way.
func (a *activity) requestsUnderWay(id string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.inflight[id] > 0
}

// requestsQuiet returns a channel that is closed once no proxied request
// to the sandbox is under way: at once when none is.
func (a *activity) requestsQuiet(id string) <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.inflight[id] <= 0 {
		return closedChan
	}
	ch := a.reqQuiets[id]
	if ch == nil {
		ch = make(chan struct{})
		a.reqQuiets[id] = ch
	}
	return ch
}

// pendingTraffic returns the traffic noted for id and not yet flushed.
func (a *activity) pendingTraffic(id string) (time.Time, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	t, ok := a.traffic[id]
	return t, ok
}

// latest is when a running sandbox whose store record says it was last
// active at stored was last active: later when activity noted since is
// not yet flushed.
func (a *activity) latest(id string, stored time.Time) time.Time {
	if t, ok := a.pendingTraffic(id); ok && t.After(stored) {
		return t
	}
	return stored
}

// takeTraffic returns the pending traffic of every sandbox and forgets it,
// for a flush to the store. Requests under way are not touched.
func (a *activity) takeTraffic() map[string]time.Time {
	a.mu.Lock()
	defer a.mu.Unlock()
	batch := a.traffic
	a.traffic = map[string]time.Time{}
	return batch
}

// watchesCPU tells whether CPU use counts as activity at all.
func (a *activity) watchesCPU() bool { return a.cpuShare > 0 }

// computing records that the sandbox had used used of CPU time at now and
// compares that with its last sample. It reports busy when the average
// since then reaches cpuShare of a core. With no usable earlier sample (none,
// one not older than now, one older than the window the sandbox's
// idleAfter allows, or a counter that went back, as after a restart) it
// asks to be called again after recheck.
func (a *activity) computing(id string, used time.Duration, now time.Time, idleAfter time.Duration) (busy bool, recheck time.Duration) {
	a.mu.Lock()
	prev, had := a.samples[id]
	a.samples[id] = cpuSample{used: used, at: now}
	a.mu.Unlock()
	window := min(idleAfter, cpuWindow)
	span := now.Sub(prev.at)
	if !had || span <= 0 || span > window+sweepRetry || used < prev.used {
		return false, window
	}
	return float64(used-prev.used)/float64(span) >= a.cpuShare, 0
}

// forgetCPU drops the sandbox's CPU sample (it is terminated).
func (a *activity) forgetCPU(id string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	delete(a.samples, id)
}
