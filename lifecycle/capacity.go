package lifecycle

import (
	"fmt"
	"sync"
	"time"

	"github.com/torpor-dev/torpor"
)

// Capacity is what the node can hold at once. Zero fields are unlimited.
type Capacity struct {
	VCPUs     float64
	MemoryMiB int64
	// PausedReleaseRatio (0..1) is the fraction of a paused sandbox's
	// resources given back to the pool (spec 000's
	// paused_resource_release_ratio).
	PausedReleaseRatio float64
}

// charge is what one sandbox holds of the node.
type charge struct {
	vcpus  float64
	memory float64
}

// ledger tracks what every sandbox holds, from its state: running (and
// every in-between state on the way to running) holds its resources in
// full, paused holds them less the release ratio, the rest hold nothing.
type ledger struct {
	cap  Capacity
	mu   sync.Mutex
	held map[string]charge
	used charge
}

func newLedger(c Capacity) *ledger { return &ledger{cap: c, held: map[string]charge{}} }

func (l *ledger) chargeFor(s torpor.State, r torpor.Resources) charge {
	full := charge{vcpus: r.VCPUs, memory: float64(r.MemoryMiB)}
	switch s {
	case torpor.StateStarting, torpor.StateRunning, torpor.StateResuming, torpor.StateRestarting, torpor.StatePausing:
		return full
	case torpor.StatePaused:
		keep := 1 - l.cap.PausedReleaseRatio
		return charge{vcpus: full.vcpus * keep, memory: full.memory * keep}
	}
	return charge{}
}

// record sets what a sandbox holds in its (stored) state.
func (l *ledger) record(id string, s torpor.State, r torpor.Resources) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.setLocked(id, l.chargeFor(s, r))
}

func (l *ledger) setLocked(id string, c charge) {
	old := l.held[id]
	l.used.vcpus += c.vcpus - old.vcpus
	l.used.memory += c.memory - old.memory
	if c == (charge{}) {
		delete(l.held, id)
	} else {
		l.held[id] = c
	}
}

// admit reserves what a sandbox will hold in state s, or refuses with a
// retriable capacity conflict when the node cannot take it. The
// reservation stands until the next record of that sandbox.
func (l *ledger) admit(id string, s torpor.State, r torpor.Resources) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	want := l.chargeFor(s, r)
	old := l.held[id]
	vcpus := l.used.vcpus - old.vcpus + want.vcpus
	memory := l.used.memory - old.memory + want.memory
	const eps = 1e-9
	if (l.cap.VCPUs > 0 && vcpus > l.cap.VCPUs+eps) || (l.cap.MemoryMiB > 0 && memory > float64(l.cap.MemoryMiB)+eps) {
		return &torpor.Error{Code: torpor.EConflict, Reason: "capacity", RetryAfter: 2 * time.Second,
			Message: fmt.Sprintf("the node is full: %.2f of %.2f vCPUs and %.0f of %d MiB are taken; retry later, or pause or hibernate other sandboxes",
				l.used.vcpus-old.vcpus, l.cap.VCPUs, l.used.memory-old.memory, l.cap.MemoryMiB)}
	}
	l.setLocked(id, want)
	return nil
}

// usage returns what is held in all.
func (l *ledger) usage() (vcpus, memoryMiB float64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.used.vcpus, l.used.memory
}
