package network

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/vishvananda/netlink"

	"github.com/torpor-dev/torpor/network/networktest"
)

// hostState reports whether the bridge exists on the host, and which of
// its nftables tables do.
func hostState(t *testing.T, bridge string) (bool, []string) {
	t.Helper()
	_, err := netlink.LinkByName(bridge)
	var nf netlink.LinkNotFoundError
	if err != nil && !errors.As(err, &nf) {
		t.Fatal(err)
	}
	return err == nil, networktest.Tables(t, bridge)
}

// TestCloseRemovesTheBridgeWhenNothingUsesIt: Close leaves the bridge and
// its tables while a sandbox is plugged in or another Network holds the
// bridge, and removes both when neither is so; the lease stays, so the
// sandbox gets its address again from the Network that makes the bridge
// anew.
func TestCloseRemovesTheBridgeWhenNothingUsesIt(t *testing.T) {
	n, cfg := testNetwork(t)
	ctx := context.Background()
	ns := filepath.Join(t.TempDir(), "netns")
	addr, err := n.Attach(ctx, Endpoint{NetNS: ns})
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"bridge", "inet"}
	if err := n.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if link, tables := hostState(t, cfg.Bridge); !link || !slices.Equal(tables, want) {
		t.Fatalf("closed with a sandbox attached: bridge %v, tables %q; want both kept", link, tables)
	}

	n2, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := n2.Detach(ctx, ns); err != nil { // hibernated: the lease stays
		t.Fatal(err)
	}
	n3, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := n2.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if link, tables := hostState(t, cfg.Bridge); !link || !slices.Equal(tables, want) {
		t.Fatalf("closed while another Network holds the bridge: bridge %v, tables %q; want both kept", link, tables)
	}
	if err := n3.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if link, tables := hostState(t, cfg.Bridge); link || len(tables) > 0 {
		t.Fatalf("closed with nothing using it: bridge %v, tables %q; want both gone", link, tables)
	}
	if _, err := os.Stat(filepath.Join(cfg.StateDir, cfg.Bridge, "leases", addr.String())); err != nil {
		t.Fatalf("the lease went with the bridge: %v", err)
	}

	n4, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if link, tables := hostState(t, cfg.Bridge); !link || !slices.Equal(tables, want) {
		t.Fatalf("a new Network: bridge %v, tables %q; want both made again", link, tables)
	}
	got, err := n4.Attach(ctx, Endpoint{NetNS: ns})
	if err != nil || got != addr {
		t.Fatalf("attach again: %s %v, want %s", got, err, addr)
	}
	if err := n4.Release(ctx, ns); err != nil {
		t.Fatal(err)
	}
	if err := n4.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if link, tables := hostState(t, cfg.Bridge); link || len(tables) > 0 {
		t.Fatalf("closed after the release: bridge %v, tables %q; want both gone", link, tables)
	}
}
