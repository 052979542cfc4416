package webhook

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"syscall"
	"time"

	"github.com/torpor-dev/torpor"
)

// Resolver looks up a host's addresses; *net.Resolver is one.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// GuardConfig is what a Guard needs.
type GuardConfig struct {
	// Allow lists the ranges deliveries may reach although the rule
	// refuses them (the webhook_allow_cidrs setting), e.g. 10.1.0.0/16
	// for an internal receiver.
	Allow []netip.Prefix
	// Self lists the daemon's own listeners (API, port proxy). Deliveries
	// never reach them, whatever Allow says; an unspecified address
	// (0.0.0.0, ::) stands for every address of the host on that port.
	Self []net.Addr
	// Resolver resolves host names at registration; nil: the system's.
	Resolver Resolver
}

// Guard keeps deliveries away from the host's own services and networks:
// a tenant must not make the daemon POST to its loopback, private,
// link-local (cloud metadata at 169.254.169.254), shared (CGNAT),
// multicast or unspecified addresses, nor to the daemon itself. It checks
// a URL when it is registered, after resolving its host, and every address
// the delivery client dials, so that a name which resolves elsewhere later
// (DNS rebinding) gets no further.
type Guard struct {
	allow []netip.Prefix
	// self is the set of the daemon's listen addresses, selfPorts the
	// ports it listens on at every address of the host.
	self      map[netip.AddrPort]bool
	selfPorts map[uint16]bool
	// local are the host's interface addresses, for selfPorts.
	local    map[netip.Addr]bool
	resolver Resolver
}

// NewGuard returns a guard.
func NewGuard(cfg GuardConfig) *Guard {
	g := &Guard{allow: cfg.Allow, self: map[netip.AddrPort]bool{}, selfPorts: map[uint16]bool{}, local: map[netip.Addr]bool{}, resolver: cfg.Resolver}
	if g.resolver == nil {
		g.resolver = net.DefaultResolver
	}
	for _, a := range cfg.Self {
		ap, err := netip.ParseAddrPort(a.String())
		if err != nil {
			continue // not an IP listener (a Unix socket): nothing to dial
		}
		if ip := ap.Addr().Unmap(); ip.IsUnspecified() {
			g.selfPorts[ap.Port()] = true
		} else {
			g.self[netip.AddrPortFrom(ip, ap.Port())] = true
		}
	}
	if len(g.selfPorts) > 0 {
		addrs, _ := net.InterfaceAddrs()
		for _, a := range addrs {
			if p, err := netip.ParsePrefix(a.String()); err == nil {
				g.local[p.Addr().Unmap()] = true
			}
		}
	}
	return g
}

// sharedSpace is RFC 6598's carrier-grade NAT range, nat64 RFC 6052's
// well-known prefix (an IPv4 address in its last four bytes), thisNetwork
// RFC 1122's "this network" (Linux dials 0.0.0.0 as the loopback).
var (
	sharedSpace = netip.MustParsePrefix("100.64.0.0/10")
	nat64       = netip.MustParsePrefix("64:ff9b::/96")
	thisNetwork = netip.MustParsePrefix("0.0.0.0/8")
	broadcast   = netip.AddrFrom4([4]byte{255, 255, 255, 255})
)

// refusal says why a delivery must not reach ip ("" when it may): the
// rule every registration and every dial obeys, before the allow-list.
func refusal(ip netip.Addr) string {
	ip = ip.Unmap().WithZone("")
	if nat64.Contains(ip) {
		b := ip.As16()
		if why := refusal(netip.AddrFrom4([4]byte(b[12:]))); why != "" {
			return why + " (through NAT64)"
		}
	}
	switch {
	case !ip.IsValid():
		return "not an address"
	case ip.IsUnspecified() || thisNetwork.Contains(ip):
		return "an unspecified address"
	case ip.IsLoopback():
		return "a loopback address"
	case ip.IsPrivate():
		return "a private address"
	case ip.IsLinkLocalUnicast():
		return "a link-local address"
	case ip.IsMulticast() || ip == broadcast:
		return "a multicast or broadcast address"
	case sharedSpace.Contains(ip):
		return "a shared (carrier-grade NAT) address"
	}
	return ""
}

// check returns an error when a delivery must not reach ap.
func (g *Guard) check(ap netip.AddrPort) error {
	ip := ap.Addr().Unmap().WithZone("")
	if g.self[netip.AddrPortFrom(ip, ap.Port())] || (g.selfPorts[ap.Port()] && (ip.IsLoopback() || g.local[ip])) {
		return errors.New("this server's own address")
	}
	for _, p := range g.allow {
		if p.Contains(ip) {
			return nil
		}
	}
	if why := refusal(ip); why != "" {
		return errors.New(why)
	}
	return nil
}

// CheckURL checks an endpoint before it is registered: its syntax
// (torpor.ValidateWebhookURL), then every address its host resolves to.
// A refusal is invalid_argument on "url"; it does not say which address
// a name resolved to, lest registration map the host's internal names.
func (g *Guard) CheckURL(ctx context.Context, raw string) error {
	if err := torpor.ValidateWebhookURL(raw); err != nil {
		return err
	}
	u, _ := url.Parse(raw) // parsed by ValidateWebhookURL
	port := uint16(80)
	if u.Scheme == "https" {
		port = 443
	}
	if p := u.Port(); p != "" {
		n, err := strconv.ParseUint(p, 10, 16)
		if err != nil || n == 0 {
			return torpor.Invalid("url", "the port must be between 1 and 65535")
		}
		port = uint16(n)
	}
	host := u.Hostname()
	var addrs []netip.Addr
	if ip, err := netip.ParseAddr(host); err == nil {
		addrs = append(addrs, ip)
	} else {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		if addrs, err = g.resolver.LookupNetIP(ctx, "ip", host); err != nil {
			var dnsErr *net.DNSError
			if errors.As(err, &dnsErr) && dnsErr.IsNotFound {
				return torpor.Invalid("url", "the host %q does not resolve", host)
			}
			return torpor.Errorf(torpor.EUnavailable, "could not resolve the host %q; try again", host)
		}
		if len(addrs) == 0 {
			return torpor.Invalid("url", "the host %q does not resolve", host)
		}
	}
	for _, ip := range addrs {
		if err := g.check(netip.AddrPortFrom(ip, port)); err != nil {
			return torpor.Invalid("url", "%q reaches %v, which webhooks may not: loopback, private, link-local, shared, multicast "+
				"and unspecified addresses and this server's own are refused (an administrator can allow ranges with webhook_allow_cidrs)", host, err)
		}
	}
	return nil
}

// ErrGuarded is wrapped by a delivery the guard refused to dial; the
// dispatcher's state reports only that, never which address or rule.
var ErrGuarded = errors.New("webhook: the address is refused by the daemon's webhook guard")

// client returns the delivery client: it dials only addresses the guard
// allows, checked on the address actually dialled after resolution, uses
// no proxy, follows no redirect (a 3xx is not an acknowledgement, and
// would lead elsewhere), and gives up on an attempt after 10 s.
func (g *Guard) client() *http.Client {
	dialer := &net.Dialer{Timeout: 10 * time.Second, Control: func(network, address string, _ syscall.RawConn) error {
		ap, err := netip.ParseAddrPort(address)
		if err != nil {
			return fmt.Errorf("%w: refusing to dial %q: %w", ErrGuarded, address, err)
		}
		if err := g.check(ap); err != nil {
			return fmt.Errorf("%w: refusing to deliver to %s: %w", ErrGuarded, ap, err)
		}
		return nil
	}}
	return &http.Client{
		Timeout:       10 * time.Second,
		Transport:     &http.Transport{DialContext: dialer.DialContext},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}
