package webhook

import (
	"net"
	"net/netip"
	"testing"
)

// TestGuardAddressRule: which addresses a delivery may reach, by default,
// with an allow-list, and never the daemon's own listeners.
func TestGuardAddressRule(t *testing.T) {
	def := NewGuard(GuardConfig{})
	allowing := NewGuard(GuardConfig{
		Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("10.1.0.0/16"), netip.MustParsePrefix("fd00::/8")},
		Self:  []net.Addr{&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7070}, &net.TCPAddr{IP: net.IPv6unspecified, Port: 7071}},
	})
	for _, c := range []struct {
		addr              string
		byDefault, listed bool // allowed by def, by allowing
	}{
		{"93.184.215.14:443", true, true},
		{"[2606:2800:21f:cb07:6820:80da:af6b:8b2c]:443", true, true},
		{"8.8.8.8:53", true, true},
		{"127.0.0.1:80", false, true},
		{"127.0.0.1:7070", false, false}, // the API, whatever the list says
		{"127.0.0.1:7071", false, false}, // the proxy, listening on every address
		{"127.1.2.3:22", false, true},
		{"[::1]:80", false, false},
		{"[::1]:7071", false, false},
		{"[::ffff:127.0.0.1]:80", false, true},
		{"[::ffff:169.254.169.254]:80", false, false},
		{"10.0.0.1:80", false, false},
		{"10.1.2.3:80", false, true},
		{"172.16.0.1:80", false, false},
		{"172.31.255.255:80", false, false},
		{"172.32.0.1:80", true, true},
		{"192.168.1.1:80", false, false},
		{"169.254.169.254:80", false, false},
		{"169.254.0.1:80", false, false},
		{"100.64.0.1:80", false, false},
		{"100.127.255.254:80", false, false},
		{"100.128.0.1:80", true, true},
		{"0.0.0.0:80", false, false},
		{"0.1.2.3:80", false, false},
		{"[::]:80", false, false},
		{"224.0.0.1:80", false, false},
		{"239.255.255.250:1900", false, false},
		{"255.255.255.255:80", false, false},
		{"[ff02::1]:80", false, false},
		{"[fe80::1]:80", false, false},
		{"[fe80::1%eth0]:80", false, false},
		{"[fc00::1]:80", false, false},
		{"[fd12::1]:80", false, true},
		{"[64:ff9b::7f00:1]:80", false, false},    // NAT64 of 127.0.0.1
		{"[64:ff9b::808:808]:80", true, true},     // NAT64 of 8.8.8.8
		{"[64:ff9b::a9fe:a9fe]:80", false, false}, // NAT64 of 169.254.169.254
	} {
		ap := netip.MustParseAddrPort(c.addr)
		if got := def.check(ap) == nil; got != c.byDefault {
			t.Errorf("%s by default: allowed = %v, want %v (%v)", c.addr, got, c.byDefault, def.check(ap))
		}
		if got := allowing.check(ap) == nil; got != c.listed {
			t.Errorf("%s with the allow-list: allowed = %v, want %v (%v)", c.addr, got, c.listed, allowing.check(ap))
		}
	}
}
