package envd

import (
	"fmt"
	"testing"

	"connectrpc.com/connect"
)

// One sandbox cannot take every watch of the node, and a watch closed
// gives its place back.
func TestWatchBudget(t *testing.T) {
	var b watchBudget
	var releases []func()
	for i := range maxWatchesPerSandbox {
		r, err := b.take("a")
		if err != nil {
			t.Fatalf("watch %d of a: %v", i, err)
		}
		releases = append(releases, r)
	}
	if _, err := b.take("a"); connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("a watch past the sandbox's bound: %v", err)
	}
	releases[0]()
	releases[0]() // twice is once
	if _, err := b.take("a"); err != nil {
		t.Fatalf("after one closed: %v", err)
	}
	for i := 0; b.total < maxWatchesInAll; i++ {
		if _, err := b.take(fmt.Sprint("s", i/maxWatchesPerSandbox)); err != nil {
			t.Fatalf("filling the node: %v", err)
		}
	}
	if _, err := b.take("fresh"); connect.CodeOf(err) != connect.CodeResourceExhausted {
		t.Fatalf("a watch past the node's bound: %v", err)
	}
}
