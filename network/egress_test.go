package network

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/netip"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/network/networktest"
)

func TestRanges(t *testing.T) {
	pfx := func(ss ...string) []netip.Prefix {
		var ps []netip.Prefix
		for _, s := range ss {
			ps = append(ps, netip.MustParsePrefix(s))
		}
		return ps
	}
	for _, tc := range []struct {
		name string
		in   []netip.Prefix
		want string
	}{
		{"none", nil, "[]"},
		{"one address", pfx("10.0.0.1/32"), "[10.0.0.1-10.0.0.2)"},
		{"unmasked block", pfx("10.1.2.3/16"), "[10.1.0.0-10.2.0.0)"},
		{"contained", pfx("10.0.0.0/8", "10.9.9.9/32"), "[10.0.0.0-11.0.0.0)"},
		{"adjacent merge", pfx("10.0.0.0/25", "10.0.0.128/25"), "[10.0.0.0-10.0.1.0)"},
		{"sorted disjoint", pfx("192.168.0.0/16", "10.0.0.1/32"), "[10.0.0.1-10.0.0.2) [192.168.0.0-192.169.0.0)"},
		{"everything", pfx("0.0.0.0/0", "1.2.3.4/32"), "[0.0.0.0-end)"},
		{"to the top", pfx("255.255.255.255/32"), "[255.255.255.255-end)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := "["
			for i, r := range ranges(tc.in) {
				if i > 0 {
					got += ") ["
				}
				hi := "end"
				if r.hi < 1<<32 {
					hi = netip.AddrFrom4([4]byte{byte(r.hi >> 24), byte(r.hi >> 16), byte(r.hi >> 8), byte(r.hi)}).String()
				}
				got += fmt.Sprintf("%s-%s", netip.AddrFrom4([4]byte{byte(r.lo >> 24), byte(r.lo >> 16), byte(r.lo >> 8), byte(r.lo)}), hi)
			}
			if got == "[" {
				got = "[]"
			} else {
				got += ")"
			}
			if got != tc.want {
				t.Fatalf("got %s, want %s", got, tc.want)
			}
		})
	}
	if n := len(intervalElems(pfx("0.0.0.0/0"))); n != 1 {
		t.Fatalf("0.0.0.0/0 has %d elements, want 1 (no end past the top)", n)
	}
}

func TestEgressOf(t *testing.T) {
	if EgressOf(nil, nil) != nil {
		t.Fatal("no rules: nil")
	}
	eg := EgressOf([]string{"10.0.0.1", "example.com", "10.1.0.0/16"}, []string{"10.1.2.0/24"})
	if !eg.Closed || len(eg.Allow) != 2 || len(eg.Deny) != 1 || eg.Allow[0] != netip.MustParsePrefix("10.0.0.1/32") {
		t.Fatalf("%+v", eg)
	}
	if eg := EgressOf(nil, []string{"1.2.3.4"}); eg.Closed {
		t.Fatal("deny only leaves the sandbox open")
	}
}

// TestEgressRules: allow and deny sets on a sandbox, changed in place
// while a connection is open, kept across a restart of the Network.
func TestEgressRules(t *testing.T) {
	n, cfg := testNetwork(t)
	o := networktest.NewOutside(t)
	out, far := o.NetNS, o.Addr
	srv := serve(t, out, "tcp", net.JoinHostPort(far.String(), "0"))
	farBlock := netip.PrefixFrom(far, 24).Masked()

	// Allowed by a block, without allow_internet.
	ns, _ := endpointOf(t, n, Endpoint{Egress: &Egress{Allow: []netip.Prefix{farBlock}, Closed: true}})
	if _, err := dial(t, ns, srv); err != nil {
		t.Fatalf("an allowed block: %v", err)
	}
	// Deny wins over allow.
	if err := n.SetEgress(context.Background(), ns, &Egress{Allow: []netip.Prefix{netip.MustParsePrefix("0.0.0.0/0")}, Deny: []netip.Prefix{netip.PrefixFrom(far, 32)}, Closed: true}); err != nil {
		t.Fatal(err)
	}
	if _, err := dialWithin(t, ns, srv, 2*time.Second); err == nil {
		t.Fatal("a denied address was reached")
	}
	// Closed: what is not allowed is refused, even with internet.
	ns2, _ := endpointOf(t, n, Endpoint{Internet: true, Egress: &Egress{Allow: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}, Closed: true}})
	if _, err := dialWithin(t, ns2, srv, 2*time.Second); err == nil {
		t.Fatal("an address outside the allow set was reached")
	}
	// Deny only: internet less the denied.
	if err := n.SetEgress(context.Background(), ns2, &Egress{Deny: []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}}); err != nil {
		t.Fatal(err)
	}
	if _, err := dial(t, ns2, srv); err != nil {
		t.Fatalf("deny-only rules with internet: %v", err)
	}

	// An open connection stops passing once its address is denied.
	echo := echoServer(t, out, far)
	var conn net.Conn
	if err := networktest.In(ns2, func() (err error) {
		conn, err = net.DialTimeout("tcp4", echo, 5*time.Second)
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	r := bufio.NewReader(conn)
	roundTrip := func() error {
		conn.SetDeadline(time.Now().Add(time.Second))
		if _, err := fmt.Fprintln(conn, "ping"); err != nil {
			return err
		}
		_, err := r.ReadString('\n')
		return err
	}
	if err := roundTrip(); err != nil {
		t.Fatal(err)
	}
	if err := n.SetEgress(context.Background(), ns2, &Egress{Deny: []netip.Prefix{farBlock}}); err != nil {
		t.Fatal(err)
	}
	if err := roundTrip(); err == nil {
		t.Fatal("an open connection to a now-denied address still passes")
	}

	// A Network made again (the daemon restarted) keeps the rules.
	n2, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	_ = n2
	if _, err := dialWithin(t, ns, srv, 2*time.Second); err == nil {
		t.Fatal("a denied address was reached after a restart")
	}
	if err := n.SetEgress(context.Background(), ns, nil); err != nil {
		t.Fatal(err)
	}
	if _, err := dialWithin(t, ns, srv, 2*time.Second); err == nil {
		t.Fatal("without rules or internet, the outside was reached")
	}
}

// echoServer answers each line with itself, in the namespace at path.
func echoServer(t *testing.T, path string, a netip.Addr) string {
	t.Helper()
	var ln net.Listener
	if err := networktest.In(path, func() (err error) {
		ln, err = net.Listen("tcp4", net.JoinHostPort(a.String(), "0"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				s := bufio.NewScanner(c)
				for s.Scan() {
					fmt.Fprintln(c, s.Text())
				}
			}()
		}
	}()
	return ln.Addr().String()
}
