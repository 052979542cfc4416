// Package networktest helps tests of sandbox networking: it runs code
// inside a network namespace and makes a namespace that stands for the
// internet, reached from the host through a veth pair of its own, so that
// no test traffic ever leaves the machine.
package networktest

import (
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	goruntime "runtime"
	"slices"
	"testing"

	"github.com/google/nftables"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// In runs fn on a thread inside the network namespace at path (a
// namespace file or /proc/PID/ns/net); sockets fn opens stay in it.
func In(path string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		goruntime.LockOSThread()
		ns, err := os.Open(path)
		if err != nil {
			errc <- err
			return
		}
		defer ns.Close()
		home, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			errc <- err
			return
		}
		defer home.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		err = fn()
		if unix.Setns(int(home.Fd()), unix.CLONE_NEWNET) == nil {
			goruntime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// Outside is a namespace standing for the internet.
type Outside struct {
	// NetNS is the path of its namespace file.
	NetNS string
	// Host is the host's address on the link to it, which a masqueraded
	// sandbox's packets come from; Addr is the outside's own address.
	Host, Addr netip.Addr
}

// Listen listens on a TCP port of the outside address.
func (o Outside) Listen(t testing.TB) net.Listener {
	t.Helper()
	var ln net.Listener
	err := In(o.NetNS, func() (err error) {
		ln, err = net.Listen("tcp4", net.JoinHostPort(o.Addr.String(), "0"))
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	return ln
}

// NewOutside makes an outside namespace on a /30 of 198.18.0.0/15 (the
// benchmarking range) and removes it when the test ends. It fails the test
// unless the outside address is routed to the namespace, so that traffic
// to it cannot leave the machine.
func NewOutside(t testing.TB) Outside {
	t.Helper()
	var b [3]byte
	rand.Read(b[:])
	path := filepath.Join(t.TempDir(), "outside")
	if err := newNetNS(path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = unix.Unmount(path, unix.MNT_DETACH)
		_ = os.Remove(path)
	})
	name := "tpo" + hex.EncodeToString(b[:])
	ns, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(ns.Fd()))}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(name); err == nil {
			_ = netlink.LinkDel(l)
		}
	})
	base := netip.AddrFrom4([4]byte{198, 18 + b[2]&1, b[0], b[1] &^ 3})
	o := Outside{NetNS: path, Host: base.Next(), Addr: base.Next().Next()}
	link, err := netlink.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.AddrAdd(link, addr(o.Host, 30)); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		t.Fatal(err)
	}
	err = In(path, func() error {
		eth, err := netlink.LinkByName("eth0")
		if err != nil {
			return err
		}
		if err := netlink.AddrAdd(eth, addr(o.Addr, 30)); err != nil {
			return err
		}
		return netlink.LinkSetUp(eth)
	})
	if err != nil {
		t.Fatal(err)
	}
	routes, err := netlink.RouteGet(net.IP(o.Addr.AsSlice()))
	if err != nil || len(routes) == 0 || routes[0].LinkIndex != link.Attrs().Index {
		t.Fatalf("%s is not routed to the outside namespace: %v %v", o.Addr, routes, err)
	}
	return o
}

func addr(a netip.Addr, bits int) *netlink.Addr {
	return &netlink.Addr{IPNet: &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(bits, 32)}}
}

// newNetNS makes a network namespace bind-mounted at path.
func newNetNS(path string) error {
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return err
	}
	f.Close()
	errc := make(chan error, 1)
	go func() {
		goruntime.LockOSThread() // never unlocked: the thread ends with the goroutine
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- err
			return
		}
		errc <- unix.Mount(fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid()), path, "none", unix.MS_BIND, "")
	}()
	if err := <-errc; err != nil {
		return errors.Join(err, os.Remove(path))
	}
	return nil
}

// HostService serves "host\n" over HTTP on every address of the host (a
// service sandboxes must not reach) until the test ends, and returns its
// port. It reads each request before it answers, so a client never sees
// a reset for a request the server did not read.
func HostService(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp4", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		io.WriteString(w, "host\n")
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}

// Tables returns the families ("bridge", "inet") of the host's nftables
// tables called name, sorted: a sandbox network's tables are named after
// its bridge.
func Tables(t testing.TB, name string) []string {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	all, err := c.ListTables()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, tb := range all {
		if tb.Name != name {
			continue
		}
		switch tb.Family {
		case nftables.TableFamilyBridge:
			out = append(out, "bridge")
		case nftables.TableFamilyINet:
			out = append(out, "inet")
		default:
			out = append(out, fmt.Sprint(tb.Family))
		}
	}
	slices.Sort(out)
	return out
}
