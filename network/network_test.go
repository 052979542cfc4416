package network

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor/network/networktest"
)

// needsRoot skips unless the test can change the host's network.
func needsRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (bridges, veth pairs, network namespaces, nftables)")
	}
}

// testNetwork makes a network on a bridge and a /24 of its own, removed
// when the test ends.
func testNetwork(t *testing.T) (*Network, Config) {
	t.Helper()
	needsRoot(t)
	var b [3]byte
	rand.Read(b[:])
	cfg := Config{
		Bridge:   "tpt" + hex.EncodeToString(b[:]),
		Prefix:   netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 214, b[0], 0}), 24),
		StateDir: t.TempDir(),
	}
	n, err := New(context.Background(), cfg)
	if err != nil {
		deleteLink(cfg.Bridge)
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Remove(context.Background()); err != nil {
			t.Error(err)
		}
	})
	return n, cfg
}

// endpoint attaches a namespace under a directory of its own and
// releases it when the test ends.
func endpoint(t *testing.T, n *Network, internet bool) (string, netip.Addr) {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "netns")
	addr, err := n.Attach(context.Background(), Endpoint{NetNS: path, Internet: internet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Release(context.Background(), path); err != nil {
			t.Error(err)
		}
	})
	return path, addr
}

// serve listens on addr inside the namespace at path (the host's when
// path is empty) and answers each connection with the address it came
// from.
func serve(t *testing.T, path, network, addr string) string {
	t.Helper()
	var ln net.Listener
	listen := func() (err error) {
		ln, err = net.Listen(network+"4", addr)
		return err
	}
	var err error
	if path == "" {
		err = listen()
	} else {
		err = networktest.In(path, listen)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintln(c, c.RemoteAddr().(*net.TCPAddr).IP)
			c.Close()
		}
	}()
	return ln.Addr().String()
}

// dial connects from inside the namespace at path (the host when empty)
// and returns the address the server saw us come from.
func dial(t *testing.T, path, addr string) (string, error) {
	return dialWithin(t, path, addr, 10*time.Second)
}

// dialWithin is dial with a timeout, for connections that must fail.
func dialWithin(t *testing.T, path, addr string, timeout time.Duration) (string, error) {
	t.Helper()
	var c net.Conn
	d := func() (err error) {
		c, err = net.DialTimeout("tcp4", addr, timeout)
		return err
	}
	var err error
	if path == "" {
		err = d()
	} else {
		err = networktest.In(path, d)
	}
	if err != nil {
		return "", err
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	return strings.TrimSpace(line), err
}

func port(addr string) string {
	_, p, _ := net.SplitHostPort(addr)
	return p
}

func TestHostReachesSandboxButSandboxesNotEachOther(t *testing.T) {
	n, _ := testNetwork(t)
	a, addrA := endpoint(t, n, false)
	b, addrB := endpoint(t, n, true)
	if addrA == addrB || !n.Prefix().Contains(addrA) || !n.Prefix().Contains(addrB) || addrA == n.Gateway() {
		t.Fatalf("addresses %s and %s in %s (gateway %s)", addrA, addrB, n.Prefix(), n.Gateway())
	}
	srvA := serve(t, a, "tcp", "0.0.0.0:0")
	srvB := serve(t, b, "tcp", "0.0.0.0:0")

	// The host reaches both, from the bridge's address.
	for _, s := range []struct {
		addr netip.Addr
		srv  string
	}{{addrA, srvA}, {addrB, srvB}} {
		from, err := dial(t, "", net.JoinHostPort(s.addr.String(), port(s.srv)))
		if err != nil || from != n.Gateway().String() {
			t.Fatalf("host to %s: from %q, %v", s.addr, from, err)
		}
	}
	// A sandbox reaches neither another sandbox (allowed the internet or
	// not) nor a service on the host, and fails fast.
	hostSrv := serve(t, "", "tcp", "0.0.0.0:0")
	for _, c := range []struct{ from, to string }{
		{a, net.JoinHostPort(addrB.String(), port(srvB))},
		{b, net.JoinHostPort(addrA.String(), port(srvA))},
		{a, net.JoinHostPort(n.Gateway().String(), port(hostSrv))},
		{b, net.JoinHostPort(n.Gateway().String(), port(hostSrv))},
	} {
		start := time.Now()
		if _, err := dialWithin(t, c.from, c.to, 2*time.Second); err == nil {
			t.Errorf("a sandbox reached %s", c.to)
		} else if !errors.Is(err, syscall.EHOSTUNREACH) && !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("dial %s: %v (took %v), want a refusal", c.to, err, time.Since(start))
		}
	}
	// Its own loopback works as before.
	lo := serve(t, a, "tcp", "127.0.0.1:0")
	if _, err := dial(t, a, lo); err != nil {
		t.Fatalf("loopback inside: %v", err)
	}
}

func TestInternetOnlyWhenAllowed(t *testing.T) {
	n, _ := testNetwork(t)
	o := networktest.NewOutside(t)
	out, hostSide, far := o.NetNS, o.Host, o.Addr
	srv := serve(t, out, "tcp", net.JoinHostPort(far.String(), "0"))

	closed, _ := endpoint(t, n, false)
	if _, err := dialWithin(t, closed, srv, 2*time.Second); err == nil {
		t.Fatal("a sandbox without internet reached an outside address")
	}
	open, _ := endpoint(t, n, true)
	from, err := dial(t, open, srv)
	if err != nil {
		t.Fatalf("a sandbox allowed the internet: %v", err)
	}
	if from != hostSide.String() {
		t.Fatalf("the outside saw %s, want the host's address %s (masquerade)", from, hostSide)
	}
	// Nothing outside opens a connection to a sandbox through the host.
	inSrv := serve(t, open, "tcp", "0.0.0.0:0")
	openAddr, _ := n.Addr(open)
	if err := networktest.In(out, func() error {
		return netlink.RouteAdd(&netlink.Route{Dst: ipNet(n.Prefix()), Gw: net.IP(hostSide.AsSlice())})
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := dialWithin(t, out, net.JoinHostPort(openAddr.String(), port(inSrv)), 2*time.Second); err == nil {
		t.Fatal("the outside opened a connection to a sandbox")
	}
}

// TestSandboxCannotSpoofAnotherAddress: a sandbox cannot send from
// another's address (its processes lack CAP_NET_ADMIN and CAP_NET_RAW, and
// IP_FREEBIND does not let a socket send from an address the namespace
// lacks); the bridge rules stop it even when it can. Here the test gives
// a sandbox without internet the address of one with it, as a sandbox
// holding CAP_NET_ADMIN could, and sends from it.
func TestSandboxCannotSpoofAnotherAddress(t *testing.T) {
	n, _ := testNetwork(t)
	o := networktest.NewOutside(t)
	out, far := o.NetNS, o.Addr
	var pc net.PacketConn
	if err := networktest.In(out, func() (err error) {
		pc, err = net.ListenPacket("udp4", net.JoinHostPort(far.String(), "0"))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer pc.Close()
	open, openAddr := endpoint(t, n, true)
	closed, _ := endpoint(t, n, false)
	if err := networktest.In(closed, func() error {
		eth, err := netlink.LinkByName(sandboxLink)
		if err != nil {
			return err
		}
		return netlink.AddrAdd(eth, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(openAddr, 32))})
	}); err != nil {
		t.Fatal(err)
	}

	send := func(from string, src netip.Addr, msg string) {
		t.Helper()
		err := networktest.In(from, func() error {
			d := net.Dialer{LocalAddr: &net.UDPAddr{IP: net.IP(src.AsSlice())}}
			c, err := d.Dial("udp4", pc.LocalAddr().String())
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.Write([]byte(msg))
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	// Sent first, the spoofed datagram would arrive first.
	send(closed, openAddr, "spoofed")
	send(open, openAddr, "genuine")
	pc.SetReadDeadline(time.Now().Add(10 * time.Second))
	buf := make([]byte, 64)
	k, _, err := pc.ReadFrom(buf)
	if err != nil || string(buf[:k]) != "genuine" {
		t.Fatalf("the outside got %q, %v; want only the genuine datagram", buf[:k], err)
	}
}

// TestLeasesOutliveRestartAndAreReleased: a new Network over the same
// state (a daemon restart) keeps each endpoint's address and its rules;
// Detach keeps the address, Release frees it, and the lease of an
// endpoint whose directory vanished is reclaimed.
func TestLeasesOutliveRestartAndAreReleased(t *testing.T) {
	n, cfg := testNetwork(t)
	ctx := context.Background()
	a, addrA := endpoint(t, n, false)
	srv := serve(t, a, "tcp", "0.0.0.0:0")

	n2, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if got, ok := n2.Addr(a); !ok || got != addrA {
		t.Fatalf("after a restart: %s %v, want %s", got, ok, addrA)
	}
	if _, err := dial(t, "", net.JoinHostPort(addrA.String(), port(srv))); err != nil {
		t.Fatalf("the host lost the sandbox after a restart: %v", err)
	}

	// Detach and attach again: same address.
	if err := n2.Detach(ctx, a); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(a); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the namespace file outlived Detach: %v", err)
	}
	if got, err := n2.Attach(ctx, Endpoint{NetNS: a}); err != nil || got != addrA {
		t.Fatalf("attach again: %s %v, want %s", got, err, addrA)
	}

	// Release frees the address.
	if err := n2.Release(ctx, a); err != nil {
		t.Fatal(err)
	}
	if _, ok := n2.Addr(a); ok {
		t.Fatal("Addr after Release")
	}
	if _, err := os.Stat(filepath.Join(cfg.StateDir, cfg.Bridge, "leases", addrA.String())); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the lease outlived Release: %v", err)
	}
	if _, err := os.Stat("/sys/class/net/" + hostLinkName(addrA)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the veth outlived Release: %v", err)
	}

	// An endpoint whose directory is gone loses its lease at the next New.
	dir := t.TempDir()
	gone := filepath.Join(dir, "sub", "netns")
	os.Mkdir(filepath.Dir(gone), 0o700)
	addrG, err := n2.Attach(ctx, Endpoint{NetNS: gone})
	if err != nil {
		t.Fatal(err)
	}
	if err := removeNetNS(gone); err != nil {
		t.Fatal(err)
	}
	os.RemoveAll(filepath.Dir(gone))
	if _, err := New(ctx, cfg); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(cfg.StateDir, cfg.Bridge, "leases", addrG.String())); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the lease of a vanished endpoint was kept: %v", err)
	}
	if _, err := os.Stat("/sys/class/net/" + hostLinkName(addrG)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the veth of a vanished endpoint was kept: %v", err)
	}
}

// TestAllocationSkipsLeasedAddresses: two networks over the same bridge
// and state (two daemons on one host) never share an address, and a full
// range is an error.
func TestAllocationSkipsLeasedAddresses(t *testing.T) {
	needsRoot(t)
	var b [3]byte
	rand.Read(b[:])
	cfg := Config{Bridge: "tpt" + hex.EncodeToString(b[:]), Prefix: netip.MustParsePrefix("10.214.250.0/29"), StateDir: t.TempDir()}
	ctx := context.Background()
	n1, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { n1.Remove(ctx) })
	n2, err := New(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[netip.Addr]bool{}
	for i := 0; i < 5; i++ { // a /29: .2 to .6
		n := n1
		if i%2 == 1 {
			n = n2
		}
		_, a := endpoint(t, n, false)
		if seen[a] {
			t.Fatalf("%s leased twice", a)
		}
		seen[a] = true
	}
	if _, err := n1.Attach(ctx, Endpoint{NetNS: filepath.Join(t.TempDir(), "netns")}); err == nil || !strings.Contains(err.Error(), "leased") {
		t.Fatalf("attach to a full range: %v", err)
	}
}

// TestTapEndpoint: a VM's endpoint is a namespace whose eth0 and tap
// device are the ports of a bridge, with no address of their own; the
// host's port forwards to the VM's MAC address through a static entry
// and learns none; an endpoint may ask for an address, which it gets
// unless another holds it; the bridge's MAC address does not follow its
// ports.
func TestTapEndpoint(t *testing.T) {
	n, _ := testNetwork(t)
	ctx := context.Background()
	br, err := netlink.LinkByName(n.Bridge())
	if err != nil {
		t.Fatal(err)
	}
	if got := br.Attrs().HardwareAddr.String(); got != bridgeMAC(n.Bridge()).String() {
		t.Fatalf("bridge MAC %s, want %s", got, bridgeMAC(n.Bridge()))
	}
	want := n.Prefix().Addr().Next().Next().Next().Next() // .4
	path, addr := endpointOf(t, n, Endpoint{Tap: "tap0", Addr: want})
	if addr != want {
		t.Fatalf("attached at %s, asked for %s", addr, want)
	}

	err = In(path, func() error {
		bridge, err := netlink.LinkByName(nsBridge)
		if err != nil {
			return err
		}
		for _, name := range []string{sandboxLink, "tap0"} {
			l, err := netlink.LinkByName(name)
			if err != nil {
				return err
			}
			if l.Attrs().MasterIndex != bridge.Attrs().Index || l.Attrs().MTU != n.MTU() || l.Attrs().Flags&net.FlagUp == 0 {
				return fmt.Errorf("%s: master %d, mtu %d, flags %s", name, l.Attrs().MasterIndex, l.Attrs().MTU, l.Attrs().Flags)
			}
			if addrs, _ := netlink.AddrList(l, netlink.FAMILY_V4); len(addrs) != 0 {
				return fmt.Errorf("%s has addresses %v", name, addrs)
			}
		}
		if tap, _ := netlink.LinkByName("tap0"); tap.Type() != "tuntap" {
			return fmt.Errorf("tap0 is a %s", tap.Type())
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}

	port, err := netlink.LinkByName(hostLinkName(addr))
	if err != nil {
		t.Fatal(err)
	}
	if pi, err := netlink.LinkGetProtinfo(port); err != nil || pi.Learning {
		t.Errorf("the VM's port learns MAC addresses (%v)", err)
	}
	fdb, err := netlink.NeighList(port.Attrs().Index, unix.AF_BRIDGE)
	if err != nil {
		t.Fatal(err)
	}
	static := false
	for _, e := range fdb {
		static = static || e.HardwareAddr.String() == GuestMAC(addr).String() && e.State&netlink.NUD_NOARP != 0
	}
	if !static {
		t.Errorf("no static forwarding entry for %s in %v", GuestMAC(addr), fdb)
	}

	// Another endpoint cannot have that address, and leases nothing.
	other := filepath.Join(t.TempDir(), "netns")
	if _, err := n.Attach(ctx, Endpoint{NetNS: other, Tap: "tap0", Addr: want}); !errors.Is(err, ErrAddrTaken) {
		t.Fatalf("attach at a leased address: %v", err)
	}
	if _, ok := n.Addr(other); ok {
		t.Fatal("a refused endpoint holds a lease")
	}
	if br, err = netlink.LinkByName(n.Bridge()); err != nil || br.Attrs().HardwareAddr.String() != bridgeMAC(n.Bridge()).String() {
		t.Errorf("bridge MAC after ports came: %v %v, want %s", br.Attrs().HardwareAddr, err, bridgeMAC(n.Bridge()))
	}

	// Detach and attach again (a snapshot and its restore): same address.
	if err := n.Detach(ctx, path); err != nil {
		t.Fatal(err)
	}
	if got, err := n.Attach(ctx, Endpoint{NetNS: path, Tap: "tap0"}); err != nil || got != addr {
		t.Fatalf("attach again: %s %v, want %s", got, err, addr)
	}
}

// endpointOf attaches ep at a namespace under a directory of its own and
// releases it when the test ends.
func endpointOf(t *testing.T, n *Network, ep Endpoint) (string, netip.Addr) {
	t.Helper()
	ep.NetNS = filepath.Join(t.TempDir(), "netns")
	addr, err := n.Attach(context.Background(), ep)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Release(context.Background(), ep.NetNS); err != nil {
			t.Error(err)
		}
	})
	return ep.NetNS, addr
}

// TestSetsFollowAttachments: the nftables sets hold a sandbox's port and
// (with internet) its address while it is attached, and nothing of it
// once detached; an attachment left by a crash (attached again without
// a detach) loses the internet it no longer asks for.
func TestSetsFollowAttachments(t *testing.T) {
	n, _ := testNetwork(t)
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "netns")
	t.Cleanup(func() { n.Release(ctx, path) })
	sets := func() (ports, internet int) {
		t.Helper()
		c, err := nftables.New()
		if err != nil {
			t.Fatal(err)
		}
		inetSet, portSet := n.sets()
		p, err := c.GetSetElements(portSet)
		if err != nil {
			t.Fatal(err)
		}
		i, err := c.GetSetElements(inetSet)
		if err != nil {
			t.Fatal(err)
		}
		return len(p), len(i)
	}
	check := func(when string, wantPorts, wantInternet int) {
		t.Helper()
		if p, i := sets(); p != wantPorts || i != wantInternet {
			t.Fatalf("%s: %d port and %d internet elements, want %d and %d", when, p, i, wantPorts, wantInternet)
		}
	}
	if _, err := n.Attach(ctx, Endpoint{NetNS: path, Internet: true}); err != nil {
		t.Fatal(err)
	}
	check("attached with internet", 1, 1)
	if _, err := n.Attach(ctx, Endpoint{NetNS: path}); err != nil {
		t.Fatal(err)
	}
	check("attached again without internet, no detach between", 1, 0)
	if err := n.Detach(ctx, path); err != nil {
		t.Fatal(err)
	}
	check("detached", 0, 0)
	if err := n.Detach(ctx, path); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Attach(ctx, Endpoint{NetNS: path, Internet: true}); err != nil {
		t.Fatal(err)
	}
	check("attached again with internet", 1, 1)
}
