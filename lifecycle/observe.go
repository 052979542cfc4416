package lifecycle

import (
	"time"

	"github.com/torpor-dev/torpor"
)

// Observer is told what the engine does, for metrics. The engine calls it
// on its hot paths: implementations must be quick and must not block.
type Observer interface {
	// Transition reports a completed transition of a kind (create, pause,
	// resume, hibernate, start, restart, terminate, fail) with its cause
	// and how long it took.
	Transition(kind, cause string, took time.Duration)
	// HookRan reports a hook run for a transition (on), failed or not.
	HookRan(on string, failed bool)
	// SweepLag reports how late the idle engine acted on a deadline.
	SweepLag(lag time.Duration)
	// StoreWrite reports how long a sandbox write to the store took.
	StoreWrite(took time.Duration)
	// UsageRows reports rows written to the usage ledger.
	UsageRows(n int)
}

type nopObserver struct{}

func (nopObserver) Transition(string, string, time.Duration) {}
func (nopObserver) HookRan(string, bool)                     {}
func (nopObserver) SweepLag(time.Duration)                   {}
func (nopObserver) StoreWrite(time.Duration)                 {}
func (nopObserver) UsageRows(int)                            {}

// StateCounts returns how many sandboxes are in each state, terminated
// excepted, from the engine's own bookkeeping (no store query).
func (e *Engine) StateCounts() map[torpor.State]int {
	e.statesMu.Lock()
	defer e.statesMu.Unlock()
	out := make(map[torpor.State]int, len(torpor.AllStates))
	for _, s := range e.states {
		out[s]++
	}
	return out
}

// CapacityUsed returns the vCPUs and memory (MiB) that sandboxes hold of
// the node, and the node's capacity (0: unlimited).
func (e *Engine) CapacityUsed() (vcpus, memoryMiB float64, capacity Capacity) {
	v, m := e.ledger.usage()
	return v, m, e.ledger.cap
}

// noteState keeps the in-memory state of every live sandbox for
// StateCounts.
func (e *Engine) noteState(sb *torpor.Sandbox) {
	e.statesMu.Lock()
	defer e.statesMu.Unlock()
	if sb.State == torpor.StateTerminated {
		delete(e.states, sb.ID)
		return
	}
	e.states[sb.ID] = sb.State
}

// noteUnstored sets the in-memory state of sandbox id to s, an in-between
// state that its transition does not store (see recordsPausing). The
// transition's next write sets it again; one that stores nothing more must
// set it back itself.
func (e *Engine) noteUnstored(id string, s torpor.State) {
	e.statesMu.Lock()
	defer e.statesMu.Unlock()
	e.states[id] = s
}

// unstoredState returns the in-memory state of sandbox id: where it
// differs from the stored one, the in-between state a transition under
// way does not store.
func (e *Engine) unstoredState(id string) torpor.State {
	e.statesMu.Lock()
	defer e.statesMu.Unlock()
	return e.states[id]
}

// since measures a transition from start.
func (e *Engine) observe(kind, cause string, start time.Time) {
	e.obs.Transition(kind, cause, time.Since(start))
}
