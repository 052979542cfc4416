package runtimetest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/netip"
	"testing"

	"github.com/torpor-dev/torpor/network"
)

// Network makes a sandbox network for a test: a bridge named prefix plus
// random hex, on a random /24 of 10.<second>.0.0/16, removed when the
// test ends (after the sandboxes, when their cleanups are registered
// later: cleanups run last registered first). Needs root.
func Network(t testing.TB, prefix string, second byte) network.Config {
	t.Helper()
	var b [3]byte
	rand.Read(b[:])
	cfg := network.Config{
		Bridge:   prefix + hex.EncodeToString(b[:]),
		Prefix:   netip.PrefixFrom(netip.AddrFrom4([4]byte{10, second, b[0], 0}), 24),
		StateDir: t.TempDir(),
	}
	n, err := network.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Remove(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return cfg
}
