package api

import (
	"fmt"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/clocktest"
)

// TestSessionTableBounded: the table holds at most MaxSessions; past
// that, with every one live, a sign-in is 503 with Retry-After, and once
// some expired there is room again. An ended session's context is done.
func TestSessionTableBounded(t *testing.T) {
	clock := clocktest.New(time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC))
	ss := newSessions(clock)
	var first session
	for i := range MaxSessions {
		_, s, err := ss.open(principal{tenant: "t", keyID: fmt.Sprintf("key_%d", i)})
		if err != nil {
			t.Fatalf("session %d: %v", i+1, err)
		}
		if i == 0 {
			first = s
		}
	}
	_, _, err := ss.open(principal{tenant: "t", keyID: "key_more"})
	if e := torpor.AsError(err); e.Code != torpor.EUnavailable || e.RetryAfter <= 0 {
		t.Fatalf("past the bound: %v", err)
	}
	if first.p.session.Err() != nil {
		t.Fatal("a live session's context is done")
	}
	// Expiry without the timers having run: the sign-in sweeps.
	ss.mu.Lock()
	for k, s := range ss.byHash {
		s.expires = clock.Now()
		ss.byHash[k] = s
	}
	ss.mu.Unlock()
	if _, _, err := ss.open(principal{tenant: "t", keyID: "key_more"}); err != nil {
		t.Fatalf("after expiry: %v", err)
	}
	if first.p.session.Err() == nil {
		t.Error("an expired session's context is not done")
	}
	ss.mu.Lock()
	n, keys := len(ss.byHash), len(ss.perKey)
	ss.mu.Unlock()
	if n != 1 || keys != 1 {
		t.Errorf("%d sessions of %d keys after the sweep, want 1 of 1", n, keys)
	}
}
