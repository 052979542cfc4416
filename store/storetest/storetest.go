// Package storetest is the behaviour suite that every torpor.Store must
// pass. A store's own test calls Run with a function that opens a fresh,
// empty store:
//
//	func TestStore(t *testing.T) {
//		storetest.Run(t, func(t *testing.T) (torpor.Store, func() torpor.Store) {
//			path := filepath.Join(t.TempDir(), "torpor.db")
//			open := func() torpor.Store {
//				s, err := sqlite.Open(t.Context(), path)
//				if err != nil {
//					t.Fatal(err)
//				}
//				return s
//			}
//			return open(), open
//		})
//	}
//
// Each subtest is a rule of the torpor.Store contract (store.go) that a
// user would notice if it broke. Subtests run in parallel, each on its own
// store; run the suite with -race.
package storetest

import (
	"testing"

	"github.com/torpor-dev/torpor"
)

// Opener opens a new, empty store for one test. It returns the store and a
// function that opens another Store over the same data, as a restarted
// daemon would; the suite calls it after closing the store it had, and,
// in the fleet tests, while it is open, as a second daemon on a shared
// database.
// The suite closes every store it is given; the Opener removes the data
// when the test ends (t.TempDir, a dropped database, ...). It fails the
// test (t.Fatal) when it cannot open.
type Opener func(t *testing.T) (s torpor.Store, reopen func() torpor.Store)

// test is one named behaviour.
type test struct {
	name string
	run  func(t *testing.T, h *harness)
}

// Run runs the whole suite against the stores that open makes.
func Run(t *testing.T, open Opener) {
	groups := []struct {
		name  string
		tests []test
	}{
		{"Sandboxes", sandboxTests()},
		{"Updates", updateTests()},
		{"List", listTests()},
		{"Events", eventTests()},
		{"Tenants", tenantTests()},
		{"APIKeys", apiKeyTests()},
		{"Templates", templateTests()},
		{"Webhooks", webhookTests()},
		{"Secrets", secretTests()},
		{"Volumes", volumeTests()},
		{"Pools", poolTests()},
		{"Usage", usageTests()},
		{"Durability", durabilityTests()},
		{"Context", contextTests()},
		{"Concurrency", concurrencyTests()},
		{"Nodes", nodeTests()},
	}
	for _, g := range groups {
		t.Run(g.name, func(t *testing.T) {
			for _, tc := range g.tests {
				t.Run(tc.name, func(t *testing.T) {
					t.Parallel()
					tc.run(t, newHarness(t, open))
				})
			}
		})
	}
}

// harness holds the store a test works on.
type harness struct {
	t      *testing.T
	s      torpor.Store
	reopen func() torpor.Store
}

func newHarness(t *testing.T, open Opener) *harness {
	t.Helper()
	s, reopen := open(t)
	if s == nil {
		t.Fatal("storetest: Opener returned a nil store")
	}
	h := &harness{t: t, s: s, reopen: reopen}
	t.Cleanup(func() {
		if h.s != nil {
			if err := h.s.Close(); err != nil {
				t.Errorf("Close: %v", err)
			}
		}
	})
	return h
}

// another opens a second store over the same data while the first is
// open, as a second daemon on a shared database does; it is closed when
// the test ends.
func (h *harness) another() torpor.Store {
	h.t.Helper()
	s := h.reopen()
	if s == nil {
		h.t.Fatal("storetest: reopen returned a nil store")
	}
	h.t.Cleanup(func() {
		if err := s.Close(); err != nil {
			h.t.Errorf("Close of the second store: %v", err)
		}
	})
	return s
}

// restart closes the store and opens a new one over the same data, as a
// daemon restart does.
func (h *harness) restart() torpor.Store {
	h.t.Helper()
	if err := h.s.Close(); err != nil {
		h.t.Fatalf("Close: %v", err)
	}
	h.s = nil
	s := h.reopen()
	if s == nil {
		h.t.Fatal("storetest: reopen returned a nil store")
	}
	h.s = s
	return s
}
