package lifecycle

import "sync"

// keyedMutex serializes work per sandbox id; entries are freed when no
// goroutine holds or waits for them, so it costs nothing for idle sandboxes.
type keyedMutex struct {
	mu      sync.Mutex
	entries map[string]*keyedEntry
}

type keyedEntry struct {
	mu   sync.Mutex
	refs int
}

func newKeyedMutex() *keyedMutex { return &keyedMutex{entries: map[string]*keyedEntry{}} }

// lock locks id and returns its unlock function.
func (k *keyedMutex) lock(id string) (unlock func()) {
	k.mu.Lock()
	e, ok := k.entries[id]
	if !ok {
		e = &keyedEntry{}
		k.entries[id] = e
	}
	e.refs++
	k.mu.Unlock()
	e.mu.Lock()
	return func() {
		e.mu.Unlock()
		k.mu.Lock()
		e.refs--
		if e.refs == 0 {
			delete(k.entries, id)
		}
		k.mu.Unlock()
	}
}
