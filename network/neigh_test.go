package network

import (
	"context"
	"net"
	"path/filepath"
	"testing"
	"time"
)

// TestReusedAddressIsReachableAtOnce: an address given back and leased
// again (by a restarted daemon, which looks from the start of the range)
// belongs to a new veth with another MAC address; the host reaches the
// new holder at once, not after its ARP entry for the old one has aged
// (half a minute or more, while other sandboxes keep the bridge up).
func TestReusedAddressIsReachableAtOnce(t *testing.T) {
	n, cfg := testNetwork(t)
	ctx := context.Background()
	// Another sandbox keeps the bridge's carrier up (its neighbours are
	// flushed when the last port goes).
	endpoint(t, n, false)
	first := filepath.Join(t.TempDir(), "netns")
	addr, err := n.Attach(ctx, Endpoint{NetNS: first})
	if err != nil {
		t.Fatal(err)
	}
	srv := serve(t, first, "tcp", "0.0.0.0:0")
	if _, err := dial(t, "", net.JoinHostPort(addr.String(), port(srv))); err != nil {
		t.Fatal(err)
	}
	if err := n.Release(ctx, first); err != nil {
		t.Fatal(err)
	}

	n2, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	second, got := endpoint(t, n2, false)
	if got != addr {
		t.Fatalf("the restarted network leased %s, not the free %s", got, addr)
	}
	srv = serve(t, second, "tcp", "0.0.0.0:0")
	if _, err := dialWithin(t, "", net.JoinHostPort(addr.String(), port(srv)), 2*time.Second); err != nil {
		t.Fatalf("the host to the address's new holder: %v", err)
	}
}
