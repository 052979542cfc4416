// Package keyedmutex serializes work per key (a sandbox id): callers with
// the same key take turns, different keys never wait for each other, and an
// idle key costs nothing.
package keyedmutex

import (
	"context"
	"sync"
)

// Mutex is a set of mutexes by key. The zero value is ready to use.
type Mutex struct {
	mu sync.Mutex
	m  map[string]*entry
}

type entry struct {
	held chan struct{} // holds a value while the key is locked
	refs int
}

// Lock locks key and returns the function that unlocks it. Entries are
// dropped when no one holds or waits for them.
func (k *Mutex) Lock(key string) (unlock func()) {
	unlock, _ = k.LockContext(context.Background(), key)
	return unlock
}

// LockContext is Lock that gives up when ctx ends first, with its error.
func (k *Mutex) LockContext(ctx context.Context, key string) (unlock func(), err error) {
	k.mu.Lock()
	if k.m == nil {
		k.m = map[string]*entry{}
	}
	e := k.m[key]
	if e == nil {
		e = &entry{held: make(chan struct{}, 1)}
		k.m[key] = e
	}
	e.refs++
	k.mu.Unlock()
	release := func() {
		k.mu.Lock()
		if e.refs--; e.refs == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}
	select {
	case e.held <- struct{}{}:
	case <-ctx.Done():
		release()
		return nil, ctx.Err()
	}
	return func() {
		<-e.held
		release()
	}, nil
}

// Len returns how many keys are held or waited for.
func (k *Mutex) Len() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.m)
}
