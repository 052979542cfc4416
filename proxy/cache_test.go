package proxy

import (
	"strconv"
	"testing"
)

// TestCacheSweepsStaleEntriesAsItGrows: entries made stale by later
// events (those of sandboxes deleted since, say) do not pile up to
// maxCached: a sweep comes each time the cache doubles, so they never
// outnumber the fresh ones by much, and every fresh entry stays.
func TestCacheSweepsStaleEntriesAsItGrows(t *testing.T) {
	var c cache
	stale, fresh := make(chan struct{}), make(chan struct{})
	close(stale)
	const n, every = 10000, 10 // one fresh entry in ten
	for i := range n {
		gen := stale
		if i%every == 0 {
			gen = fresh
		}
		c.mu.Lock()
		if c.full() {
			c.sweep()
		}
		c.sbs[strconv.Itoa(i)] = cached{gen: gen}
		c.mu.Unlock()
	}
	if most := 2*n/every + minSweep; len(c.sbs) > most {
		t.Fatalf("%d entries cached, %d of them fresh; want at most %d", len(c.sbs), n/every, most)
	}
	for i := 0; i < n; i += every {
		if _, ok := c.sbs[strconv.Itoa(i)]; !ok {
			t.Fatalf("fresh entry %d was dropped", i)
		}
	}
}
