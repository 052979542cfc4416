package e2e

import (
	"fmt"
	"io"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/torpor-dev/torpor/network/networktest"
	"golang.org/x/net/dns/dnsmessage"
)

// testDNS serves the A records of zone (names with a trailing dot) on a
// local UDP port until the test ends, and returns its address: the
// upstream of the daemon's resolver, so that no query leaves the machine.
func testDNS(t *testing.T, zone map[string]netip.Addr) string {
	t.Helper()
	pc, err := net.ListenPacket("udp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	go func() {
		buf := make([]byte, 1500)
		for {
			n, from, err := pc.ReadFrom(buf)
			if err != nil {
				return
			}
			var p dnsmessage.Parser
			h, err := p.Start(buf[:n])
			if err != nil {
				continue
			}
			q, err := p.Question()
			if err != nil {
				continue
			}
			a, ok := zone[strings.ToLower(q.Name.String())]
			rc := dnsmessage.RCodeSuccess
			if !ok {
				rc = dnsmessage.RCodeNameError
			}
			b := dnsmessage.NewBuilder(nil, dnsmessage.Header{ID: h.ID, Response: true, RecursionAvailable: true, RCode: rc})
			b.StartQuestions()
			b.Question(q)
			b.StartAnswers()
			if ok && q.Type == dnsmessage.TypeA {
				b.AResource(dnsmessage.ResourceHeader{Name: q.Name, Class: dnsmessage.ClassINET, TTL: 5}, dnsmessage.AResource{A: a.As4()})
			}
			out, _ := b.Finish()
			pc.WriteTo(out, from)
		}
	}()
	return pc.LocalAddr().String()
}

// serveHTTP answers every connection to ln with a 200 and tag.
func serveHTTP(ln net.Listener, tag string) {
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			buf := make([]byte, 1024)
			c.Read(buf)
			io.WriteString(c, "HTTP/1.0 200 OK\r\n\r\n"+tag+"\n")
		}()
	}
}

// TestEgressHostNames: a sandbox with host name rules resolves through
// torpor's resolver (which asks a DNS server of the test, on this
// machine), reaches an allowed name's address only once it has looked the
// name up, is refused a denied name, cannot reach the denied name's
// address through an allowed name that answers the same address (deny
// wins), and never reaches an address it did not look up
// (docs/egress.md).
func TestEgressHostNames(t *testing.T) {
	needs(t)
	outA, outB, outC := networktest.NewOutside(t), networktest.NewOutside(t), networktest.NewOutside(t)
	var port string
	for _, o := range []struct {
		out networktest.Outside
		tag string
	}{{outA, "server-a"}, {outB, "server-b"}, {outC, "server-c"}} {
		ln := o.out.Listen(t)
		go serveHTTP(ln, o.tag)
		_, p, _ := net.SplitHostPort(ln.Addr().String())
		if port == "" {
			port = p
		}
		// One port for all three: the names differ, the port does not.
		if p != port {
			ln.Close()
			var err error
			err = networktest.In(o.out.NetNS, func() error {
				l2, err := net.Listen("tcp4", net.JoinHostPort(o.out.Addr.String(), port))
				if err == nil {
					t.Cleanup(func() { l2.Close() })
					go serveHTTP(l2, o.tag)
				}
				return err
			})
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	up := testDNS(t, map[string]netip.Addr{
		"allowed.test.": outA.Addr,
		"denied.test.":  outB.Addr,
		"alias.test.":   outB.Addr, // an allowed name for the denied address
		"other.test.":   outC.Addr,
	})
	// A bridge of its own: daemons of other builds on the default bridge
	// rebuild its tables without the resolver's rules.
	var cidr string
	_, env := privateNetwork(t, "tpd", func(b byte) string { cidr = fmt.Sprintf("10.219.%d.0/24", b); return cidr })
	d := startDaemon(t, torporBin(t), t.TempDir(), append(env, "TORPOR_NETWORK_DNS_UPSTREAM="+up)...)
	fetch := func(id, host string) (string, bool) {
		got, code := fetchFrom(d, id, host, port)
		return got, code == 0 && strings.Contains(got, "200 OK")
	}
	lookup := func(id, name string) (string, int) {
		out, errs, code := d.cli("exec", id, "--", "nslookup", "-type=a", name)
		return out + errs, code
	}

	id := strings.TrimSpace(d.ok("create", "--allow-out", "allowed.test", "--allow-out", "alias.test", "--deny-out", "denied.test"))
	if sb := d.get(id); sb.Network == nil || len(sb.Network.AllowOut) != 2 || sb.Network.DenyOut[0] != "denied.test" {
		t.Fatalf("the sandbox object's network: %+v", sb.Network)
	}
	gw := netip.MustParsePrefix(cidr).Addr().Next().String()
	if rc := d.ok("exec", id, "--", "cat", "/etc/resolv.conf"); !strings.Contains(rc, "nameserver "+gw) {
		t.Fatalf("resolv.conf does not name torpor's resolver %s:\n%s", gw, rc)
	}
	// Not looked up yet: closed, whatever the sandbox claims.
	if got, ok := fetch(id, outA.Addr.String()); ok {
		t.Fatalf("allowed.test's address was reached before any lookup: %q", got)
	}
	if got, ok := fetch(id, "allowed.test"); !ok || !strings.Contains(got, "server-a") {
		t.Fatalf("allowed.test by name: %q", got)
	}
	if got, ok := fetch(id, outA.Addr.String()); !ok {
		t.Fatalf("allowed.test's address after the lookup: %q", got)
	}
	// A denied name is refused, and its address stays closed even when an
	// allowed name answers it.
	if got, code := lookup(id, "denied.test"); code == 0 || strings.Contains(got, outB.Addr.String()) {
		t.Fatalf("denied.test was answered (exit %d): %q", code, got)
	}
	if got, code := lookup(id, "alias.test"); code != 0 || !strings.Contains(got, outB.Addr.String()) {
		t.Fatalf("alias.test (exit %d): %q", code, got)
	}
	if got, ok := fetch(id, outB.Addr.String()); ok {
		t.Fatalf("denied.test's address was reached through alias.test: %q", got)
	}
	// A name no rule covers resolves, but its address stays closed.
	if got, code := lookup(id, "other.test"); code != 0 || !strings.Contains(got, outC.Addr.String()) {
		t.Fatalf("other.test (exit %d): %q", code, got)
	}
	if got, ok := fetch(id, outC.Addr.String()); ok {
		t.Fatalf("an address the rules do not allow was reached: %q", got)
	}

	// A sandbox without name rules is not answered by the resolver.
	plain := strings.TrimSpace(d.ok("create", "--allow-out", outA.Addr.String()))
	if out, errs, code := d.cli("exec", plain, "--", "nslookup", "-type=a", "allowed.test", gw); code == 0 && strings.Contains(out+errs, outA.Addr.String()) {
		t.Fatalf("a sandbox without name rules was answered: %q", out+errs)
	}

	// A rule change that drops allowed.test closes its address; the name
	// rules survive a pause.
	d.ok("update", id, "--allow-out", "alias.test", "--deny-out", "denied.test")
	if got, ok := fetch(id, outA.Addr.String()); ok {
		t.Fatalf("allowed.test's address still passes after its rule went: %q", got)
	}
	d.ok("update", id, "--allow-out", "allowed.test", "--deny-out", "denied.test")
	d.ok("pause", id)
	d.ok("start", id)
	if got, ok := fetch(id, "allowed.test"); !ok {
		t.Fatalf("after a pause, allowed.test by name: %q", got)
	}
}
