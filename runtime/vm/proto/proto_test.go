package proto

import (
	"net/netip"
	"testing"
)

// The guest's network settings go through the kernel command line and
// come back as they were; a command line without them has none, and a
// malformed one is an error.
func TestGuestNetParam(t *testing.T) {
	g := GuestNet{Addr: netip.MustParseAddr("10.213.0.7"), Gateway: netip.MustParseAddr("10.213.0.1"), MTU: 1400}
	got, ok, err := ParseGuestNet("console=ttyS0 quiet " + g.Param() + " rw")
	if err != nil || !ok || got != g {
		t.Fatalf("parsed %+v %v %v, want %+v", got, ok, err, g)
	}
	if _, ok, err := ParseGuestNet("console=ttyS0 torpor.other=1"); ok || err != nil {
		t.Fatalf("no settings: %v %v", ok, err)
	}
	for _, bad := range []string{"torpor.net=10.213.0.7", "torpor.net=10.213.0.7,x,1400", "torpor.net=::1,10.213.0.1,1400", "torpor.net=10.213.0.7,10.213.0.1,9"} {
		if _, ok, err := ParseGuestNet(bad); ok || err == nil {
			t.Errorf("%q: %v %v, want an error", bad, ok, err)
		}
	}
}
