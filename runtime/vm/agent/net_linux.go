package agent

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor/runtime/vm/proto"
)

// guestLink is the guest's network card (virtio-net), the only one.
const guestLink = "eth0"

// netUp configures the guest's network card from the kernel command
// line (proto.NetParam), as the host's sandbox network expects: the
// sandbox's address as a /32, the MTU, a route to the gateway on the
// link and the default route through it; no IPv6. A guest without the
// parameter has only its loopback.
func netUp() error {
	cmdline, err := os.ReadFile("/proc/cmdline")
	if err != nil {
		return err
	}
	g, ok, err := proto.ParseGuestNet(string(cmdline))
	if err != nil || !ok {
		return err
	}
	if err := waitFor(func() bool { _, err := os.Stat("/sys/class/net/" + guestLink); return err == nil }); err != nil {
		return fmt.Errorf("no network card %s: %w", guestLink, err)
	}
	_ = os.WriteFile("/proc/sys/net/ipv6/conf/"+guestLink+"/disable_ipv6", []byte("1"), 0o644)
	link, err := netlink.LinkByName(guestLink)
	if err != nil {
		return fmt.Errorf("%s: %w", guestLink, err)
	}
	if err := netlink.LinkSetMTU(link, g.MTU); err != nil {
		return fmt.Errorf("%s mtu %d: %w", guestLink, g.MTU, err)
	}
	if err := netlink.AddrAdd(link, &netlink.Addr{IPNet: hostNet(g.Addr)}); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("address %s: %w", g.Addr, err)
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("%s up: %w", guestLink, err)
	}
	idx := link.Attrs().Index
	if err := netlink.RouteReplace(&netlink.Route{LinkIndex: idx, Dst: hostNet(g.Gateway), Scope: netlink.SCOPE_LINK}); err != nil {
		return fmt.Errorf("route to %s: %w", g.Gateway, err)
	}
	if err := netlink.RouteReplace(&netlink.Route{LinkIndex: idx, Gw: net.IP(g.Gateway.AsSlice())}); err != nil {
		return fmt.Errorf("default route: %w", err)
	}
	return nil
}

// hostNet is a /32 of a.
func hostNet(a netip.Addr) *net.IPNet {
	return &net.IPNet{IP: net.IP(a.AsSlice()), Mask: net.CIDRMask(32, 32)}
}
