package keyedmutex

import (
	"context"
	"sync"
	"testing"
	"time"
)

func TestSameKeyTakesTurnsOtherKeysDoNot(t *testing.T) {
	var k Mutex
	unlock := k.Lock("a")
	other := make(chan struct{})
	go func() { k.Lock("b")(); close(other) }()
	select {
	case <-other:
	case <-time.After(5 * time.Second):
		t.Fatal("a different key waited")
	}
	var mu sync.Mutex
	order := []string{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		u := k.Lock("a")
		mu.Lock()
		order = append(order, "second")
		mu.Unlock()
		u()
	}()
	time.Sleep(20 * time.Millisecond)
	mu.Lock()
	order = append(order, "first")
	mu.Unlock()
	unlock()
	<-done
	if len(order) != 2 || order[0] != "first" {
		t.Fatalf("order %v", order)
	}
	if k.Len() != 0 {
		t.Fatalf("%d keys kept after every unlock", k.Len())
	}
}

// TestLockContextGivesUp: a caller that stops waiting leaves the key to
// the others, and nothing behind.
func TestLockContextGivesUp(t *testing.T) {
	var k Mutex
	unlock := k.Lock("a")
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error)
	go func() {
		_, err := k.LockContext(ctx, "a")
		errc <- err
	}()
	cancel()
	if err := <-errc; err != context.Canceled {
		t.Fatalf("LockContext on a held key after cancel: %v", err)
	}
	unlock()
	u, err := k.LockContext(context.Background(), "a")
	if err != nil {
		t.Fatal(err)
	}
	u()
	if k.Len() != 0 {
		t.Fatalf("%d keys kept", k.Len())
	}
}
