package gpu

import (
	"math"
	"sync"
)

// SettleKind is a charged component a front settles from a node.
type SettleKind string

const (
	// SettleBusy is shared by the exec's busy seconds, the idle seconds, a
	// transparent lease's freeze-only frozen intervals and a none lease's
	// whole residency: one frontier, so each second lands exactly once.
	SettleBusy   SettleKind = "busy"
	SettleResume SettleKind = "resume"
)

// Settlement turns a node's cumulative counters into charges exactly
// once. It keeps one frontier per lease and kind: the total already
// settled. A reply adds only what lies beyond the frontier, so reading
// the same reply again adds 0, a reply older than the frontier adds 0,
// and a front that restarts re-seeds the frontiers from its durable trail
// (Seed) instead of billing the past twice.
type Settlement struct {
	mu       sync.Mutex
	frontier map[string]map[SettleKind]float64
}

// NewSettlement returns a settlement with no frontiers.
func NewSettlement() *Settlement {
	return &Settlement{frontier: map[string]map[SettleKind]float64{}}
}

// Seed raises the frontier of lease and kind to settled, the total the
// durable trail already holds. Seeding lower than the frontier does
// nothing.
func (s *Settlement) Seed(lease string, kind SettleKind, settled float64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.kinds(lease)
	f[kind] = math.Max(f[kind], settled)
}

// Settle takes a node's counters for lease and returns what is new in
// them, advancing the frontiers. The caller writes the returned seconds
// to its ledger (as busy and resume rows) together with the new frontier
// (Frontier), so that Seed can restore it.
func (s *Settlement) Settle(lease string, c Counters) Counters {
	s.mu.Lock()
	defer s.mu.Unlock()
	f := s.kinds(lease)
	var d Counters
	d.Busy = advance(f, SettleBusy, c.Busy)
	d.Resume = advance(f, SettleResume, c.Resume)
	return d
}

// Frontier returns the settled total of lease and kind.
func (s *Settlement) Frontier(lease string, kind SettleKind) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.frontier[lease][kind]
}

// Forget drops a lease's frontiers once it is settled for good.
func (s *Settlement) Forget(lease string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.frontier, lease)
}

func (s *Settlement) kinds(lease string) map[SettleKind]float64 {
	f := s.frontier[lease]
	if f == nil {
		f = map[SettleKind]float64{}
		s.frontier[lease] = f
	}
	return f
}

func advance(f map[SettleKind]float64, k SettleKind, total float64) float64 {
	if math.IsNaN(total) || total <= f[k] {
		return 0
	}
	d := total - f[k]
	f[k] = total
	return d
}
