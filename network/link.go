package network

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	goruntime "runtime"
	"strings"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// sandboxLink is the name of the veth end inside a sandbox.
const sandboxLink = "eth0"

// nsBridge is the bridge inside the namespace of a VM's endpoint, which
// joins its eth0 and its tap device.
const nsBridge = "br0"

// GuestMAC is the MAC address of the network card of the VM that holds
// address a (Endpoint.Tap): locally administered, unique on the host as
// the address is, and the same across the VM's restarts and restores.
func GuestMAC(a netip.Addr) net.HardwareAddr {
	b := a.As4()
	return net.HardwareAddr{0x02, 0x74, b[0], b[1], b[2], b[3]}
}

// bridgeMAC is the bridge's own MAC address, set once so that it does
// not follow its ports: a bridge whose address was never set takes the
// lowest of its ports', which changes as sandboxes come and go, and a VM
// restored from a snapshot remembers the gateway's.
func bridgeMAC(bridge string) net.HardwareAddr {
	g := linkGroup(bridge)
	return net.HardwareAddr{0x02, 0x62, byte(g >> 24), byte(g >> 16), byte(g >> 8), byte(g)}
}

// hostLinkName names the host end of the veth pair of the sandbox with
// address a: unique on the host as the address is, and at most 15 bytes.
func hostLinkName(a netip.Addr) string {
	b := a.As4()
	return fmt.Sprintf("tv%02x%02x%02x%02x", b[0], b[1], b[2], b[3])
}

// ensureBridge makes the bridge when it is missing, gives it the range's
// first address and turns off IPv6 on it (sandboxes have none, and the
// host must not be reached over a link-local address).
func (n *Network) ensureBridge() error {
	link, err := netlink.LinkByName(n.bridge)
	var nf netlink.LinkNotFoundError
	switch {
	case errors.As(err, &nf):
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: n.bridge, MTU: n.mtu}}
		if err := netlink.LinkAdd(br); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("network: add bridge %s: %w", n.bridge, err)
		}
		if link, err = netlink.LinkByName(n.bridge); err != nil {
			return fmt.Errorf("network: bridge %s: %w", n.bridge, err)
		}
	case err != nil:
		return fmt.Errorf("network: bridge %s: %w", n.bridge, err)
	}
	if link.Type() != "bridge" {
		return fmt.Errorf("network: %s is a %s link, not a bridge", n.bridge, link.Type())
	}
	_ = os.WriteFile("/proc/sys/net/ipv6/conf/"+n.bridge+"/disable_ipv6", []byte("1"), 0o644)
	if mac := bridgeMAC(n.bridge); link.Attrs().HardwareAddr.String() != mac.String() {
		if err := netlink.LinkSetHardwareAddr(link, mac); err != nil {
			return fmt.Errorf("network: MAC address of %s: %w", n.bridge, err)
		}
	}
	addrs, err := netlink.AddrList(link, netlink.FAMILY_V4)
	if err != nil {
		return fmt.Errorf("network: addresses of %s: %w", n.bridge, err)
	}
	want := netip.PrefixFrom(n.gw, n.prefix.Bits())
	have := false
	for _, a := range addrs {
		p, ok := prefixOf(a.IPNet)
		switch {
		case !ok:
		case p == want:
			have = true
		default:
			return fmt.Errorf("network: bridge %s has the address %s, not %s: another torpor with another sandbox range uses it (choose another bridge)", n.bridge, p, want)
		}
	}
	if !have {
		if err := netlink.AddrAdd(link, &netlink.Addr{IPNet: ipNet(want)}); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("network: address %s on %s: %w", want, n.bridge, err)
		}
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("network: %s up: %w", n.bridge, err)
	}
	return nil
}

// addVeth makes the veth pair of the sandbox with address addr: the host
// end an isolated port of the bridge, the other end eth0 in the namespace
// mounted at nsPath, with the address, lo up, and a default route through
// the bridge. With a tap name, the namespace's eth0 has no address: it
// and a tap device of that name are ports of a bridge in the namespace,
// and the host's port forwards only to the VM's MAC address.
func (n *Network) addVeth(nsPath string, addr netip.Addr, tap string) error {
	ns, err := netns.GetFromPath(nsPath)
	if err != nil {
		return fmt.Errorf("open %s: %w", nsPath, err)
	}
	defer ns.Close()
	br, err := netlink.LinkByName(n.bridge)
	if err != nil {
		return fmt.Errorf("bridge %s: %w", n.bridge, err)
	}
	name := hostLinkName(addr)
	veth := &netlink.Veth{
		LinkAttrs:     netlink.LinkAttrs{Name: name, MTU: n.mtu, TxQLen: -1},
		PeerName:      sandboxLink,
		PeerNamespace: netlink.NsFd(int(ns)),
		PeerMTU:       uint32(n.mtu),
		PeerTxQLen:    -1,
	}
	if err := netlink.LinkAdd(veth); err != nil {
		return fmt.Errorf("add veth %s: %w", name, err)
	}
	host, err := netlink.LinkByName(name)
	if err != nil {
		return fmt.Errorf("veth %s: %w", name, err)
	}
	if err := netlink.LinkSetGroup(host, int(linkGroup(n.bridge))); err != nil {
		return fmt.Errorf("veth %s group: %w", name, err)
	}
	if err := netlink.LinkSetMaster(host, br); err != nil {
		return fmt.Errorf("veth %s on %s: %w", name, n.bridge, err)
	}
	// The bridge does not forward between isolated ports; the bridge
	// rules drop such frames too, for kernels without isolation.
	if err := netlink.LinkSetIsolated(host, true); err != nil {
		n.log.Warn("network: cannot isolate the bridge port (the bridge rules still drop sandbox-to-sandbox frames)", "link", name, "err", err)
	}
	if tap != "" {
		if err := pinGuestMAC(host, addr); err != nil {
			return fmt.Errorf("veth %s: %w", name, err)
		}
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return fmt.Errorf("veth %s up: %w", name, err)
	}
	if tap != "" {
		return n.addTap(nsPath, tap)
	}

	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		return fmt.Errorf("netlink in %s: %w", nsPath, err)
	}
	defer h.Close()
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("lo: %w", err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		return fmt.Errorf("lo up: %w", err)
	}
	eth, err := h.LinkByName(sandboxLink)
	if err != nil {
		return fmt.Errorf("%s: %w", sandboxLink, err)
	}
	// A /32: every packet, to another sandbox too, goes through the
	// bridge's address, where the rules judge it.
	if err := h.AddrAdd(eth, &netlink.Addr{IPNet: ipNet(netip.PrefixFrom(addr, 32))}); err != nil {
		return fmt.Errorf("address %s: %w", addr, err)
	}
	if err := h.LinkSetUp(eth); err != nil {
		return fmt.Errorf("%s up: %w", sandboxLink, err)
	}
	gw := net.IP(n.gw.AsSlice())
	if err := h.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Dst: ipNet(netip.PrefixFrom(n.gw, 32)), Scope: netlink.SCOPE_LINK}); err != nil {
		return fmt.Errorf("route to %s: %w", n.gw, err)
	}
	if err := h.RouteAdd(&netlink.Route{LinkIndex: eth.Attrs().Index, Gw: gw}); err != nil {
		return fmt.Errorf("default route: %w", err)
	}
	return nil
}

// pinGuestMAC makes the host's port of a VM forward to the VM's MAC
// address only through a static entry, and learn none from it: a VM's
// root could otherwise claim another sandbox's MAC address and draw the
// frames the host sends to that sandbox.
func pinGuestMAC(port netlink.Link, addr netip.Addr) error {
	if err := netlink.LinkSetLearning(port, false); err != nil {
		return fmt.Errorf("learning off: %w", err)
	}
	err := netlink.NeighSet(&netlink.Neigh{
		LinkIndex:    port.Attrs().Index,
		Family:       unix.AF_BRIDGE,
		State:        netlink.NUD_NOARP,
		Flags:        netlink.NTF_MASTER,
		HardwareAddr: GuestMAC(addr),
	})
	if err != nil {
		return fmt.Errorf("static forwarding entry: %w", err)
	}
	return nil
}

// addTap makes the inside of a VM's namespace: lo up, IPv6 off, and its
// eth0 and a persistent tap device (for the VM's QEMU to open) as the
// ports of a bridge, none of them with an address.
func (n *Network) addTap(nsPath, tap string) error {
	return In(nsPath, func() error {
		for _, k := range []string{"default", "all"} {
			_ = os.WriteFile("/proc/sys/net/ipv6/conf/"+k+"/disable_ipv6", []byte("1"), 0o644)
		}
		if err := createTap(tap); err != nil {
			return err
		}
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: nsBridge, MTU: n.mtu}}
		if err := netlink.LinkAdd(br); err != nil {
			return fmt.Errorf("add bridge %s: %w", nsBridge, err)
		}
		for _, name := range []string{sandboxLink, tap} {
			l, err := netlink.LinkByName(name)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			if err := netlink.LinkSetMTU(l, n.mtu); err != nil {
				return fmt.Errorf("%s mtu: %w", name, err)
			}
			if err := netlink.LinkSetMaster(l, br); err != nil {
				return fmt.Errorf("%s on %s: %w", name, nsBridge, err)
			}
		}
		for _, name := range []string{"lo", sandboxLink, tap, nsBridge} {
			l, err := netlink.LinkByName(name)
			if err != nil {
				return fmt.Errorf("%s: %w", name, err)
			}
			if err := netlink.LinkSetUp(l); err != nil {
				return fmt.Errorf("%s up: %w", name, err)
			}
		}
		return nil
	})
}

// createTap makes a persistent tap device in the calling thread's
// network namespace; QEMU attaches to it by name (-netdev tap,ifname=).
func createTap(name string) error {
	fd, err := unix.Open("/dev/net/tun", unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open /dev/net/tun: %w", err)
	}
	defer unix.Close(fd)
	ifr, err := unix.NewIfreq(name)
	if err != nil {
		return err
	}
	ifr.SetUint16(unix.IFF_TAP | unix.IFF_NO_PI | unix.IFF_VNET_HDR)
	if err := unix.IoctlIfreq(fd, unix.TUNSETIFF, ifr); err != nil {
		return fmt.Errorf("tap %s: %w", name, err)
	}
	if err := unix.IoctlSetInt(fd, unix.TUNSETPERSIST, 1); err != nil {
		return fmt.Errorf("tap %s persist: %w", name, err)
	}
	return nil
}

// In runs fn on an OS thread inside the network namespace at path (a
// namespace file or /proc/PID/ns/net): sockets fn opens and processes it
// starts are in that namespace. The thread goes back to the caller's
// namespace afterwards (or ends, if it cannot).
func In(path string, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		goruntime.LockOSThread()
		ns, err := os.Open(path)
		if err != nil {
			goruntime.UnlockOSThread()
			errc <- fmt.Errorf("network: namespace %s: %w", path, err)
			return
		}
		defer ns.Close()
		home, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			goruntime.UnlockOSThread()
			errc <- err
			return
		}
		defer home.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			goruntime.UnlockOSThread()
			errc <- fmt.Errorf("network: enter %s: %w", path, err)
			return
		}
		err = fn()
		// Left locked when it cannot go home, the thread ends with this
		// goroutine rather than run others in the sandbox's namespace.
		if unix.Setns(int(home.Fd()), unix.CLONE_NEWNET) == nil {
			goruntime.UnlockOSThread()
		}
		errc <- err
	}()
	return <-errc
}

// forgetNeighbor drops the host's ARP entry for addr on the bridge. The
// address's next holder has another MAC address, which the host would not
// ask for while the old entry lives: half a minute and more of packets
// lost, while other ports keep the bridge up (the entries of a bridge go
// with its last port). A missing entry or bridge is fine.
func (n *Network) forgetNeighbor(addr netip.Addr) error {
	br, err := netlink.LinkByName(n.bridge)
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("bridge %s: %w", n.bridge, err)
	}
	err = netlink.NeighDel(&netlink.Neigh{LinkIndex: br.Attrs().Index, Family: unix.AF_INET, IP: net.IP(addr.AsSlice())})
	if err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("forget the neighbour %s on %s: %w", addr, n.bridge, err)
	}
	return nil
}

// ports lists the names of the links plugged into the bridge (none when
// the bridge is missing).
func (n *Network) ports() ([]string, error) {
	br, err := netlink.LinkByName(n.bridge)
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("network: bridge %s: %w", n.bridge, err)
	}
	links, err := netlink.LinkList()
	if err != nil {
		return nil, fmt.Errorf("network: links: %w", err)
	}
	var out []string
	for _, l := range links {
		if l.Attrs().MasterIndex == br.Attrs().Index {
			out = append(out, l.Attrs().Name)
		}
	}
	return out, nil
}

// deleteLink deletes a link by name (a veth's peer goes with it); a
// missing link is fine.
func deleteLink(name string) error {
	link, err := netlink.LinkByName(name)
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("link %s: %w", name, err)
	}
	if err := netlink.LinkDel(link); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("delete link %s: %w", name, err)
	}
	return nil
}

// createNetNS makes a network namespace and bind-mounts it at path, so it
// outlives every process in it (and the daemon).
func createNetNS(path string) error {
	f, err := os.OpenFile(path, os.O_RDONLY|os.O_CREATE|os.O_EXCL, 0o444)
	if err != nil {
		return fmt.Errorf("netns %s: %w", path, err)
	}
	f.Close()
	errc := make(chan error, 1)
	go func() {
		// The thread is not unlocked: it ends with this goroutine rather
		// than go back to the scheduler in another namespace.
		goruntime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare: %w", err)
			return
		}
		src := fmt.Sprintf("/proc/self/task/%d/ns/net", unix.Gettid())
		if err := unix.Mount(src, path, "none", unix.MS_BIND, ""); err != nil {
			errc <- fmt.Errorf("bind-mount the namespace: %w", err)
			return
		}
		errc <- nil
	}()
	if err := <-errc; err != nil {
		_ = os.Remove(path)
		return fmt.Errorf("netns %s: %w", path, err)
	}
	return nil
}

// removeNetNS unmounts and removes a namespace file; the namespace ends
// with its last process. A missing file is fine.
func removeNetNS(path string) error {
	for i := 0; i < 8; i++ {
		err := unix.Unmount(path, unix.MNT_DETACH)
		if errors.Is(err, unix.EINVAL) || errors.Is(err, unix.ENOENT) {
			break
		}
		if err != nil {
			return fmt.Errorf("unmount %s: %w", path, err)
		}
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// defaultMTU is the MTU of the interface of the host's default route
// (1500 when there is none), so that sandbox packets fit the way out.
func defaultMTU() int {
	routes, err := netlink.RouteList(nil, netlink.FAMILY_V4)
	if err == nil {
		for _, r := range routes {
			if r.Dst != nil && !r.Dst.IP.IsUnspecified() {
				continue
			}
			if link, err := netlink.LinkByIndex(r.LinkIndex); err == nil && link.Attrs().MTU >= 576 {
				return min(link.Attrs().MTU, 1500)
			}
		}
	}
	return 1500
}

// enableForwarding turns on IPv4 forwarding, which sandboxes allowed the
// internet need (as Docker does). The rules keep forwarding from or to
// other sandboxes closed.
func enableForwarding(log *slog.Logger) error {
	const p = "/proc/sys/net/ipv4/ip_forward"
	b, err := os.ReadFile(p)
	if err != nil {
		return err
	}
	if strings.TrimSpace(string(b)) == "1" {
		return nil
	}
	log.Info("network: turning on IPv4 forwarding for sandboxes allowed the internet", "sysctl", "net.ipv4.ip_forward")
	return os.WriteFile(p, []byte("1"), 0o644)
}

func ipNet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: net.IP(p.Addr().AsSlice()), Mask: net.CIDRMask(p.Bits(), p.Addr().BitLen())}
}

func prefixOf(n *net.IPNet) (netip.Prefix, bool) {
	if n == nil {
		return netip.Prefix{}, false
	}
	a, ok := netip.AddrFromSlice(n.IP)
	if !ok {
		return netip.Prefix{}, false
	}
	ones, _ := n.Mask.Size()
	return netip.PrefixFrom(a.Unmap(), ones), true
}
