package network

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"strings"
)

// HostResolvConfs are the host's resolver files a sandbox's nameservers
// are taken from, in order: the host's own, then systemd-resolved's list
// of its upstream servers (it exists while systemd-resolved runs, whose
// /etc/resolv.conf names only its stub on 127.0.0.53).
var HostResolvConfs = []string{"/etc/resolv.conf", "/run/systemd/resolve/resolv.conf"}

// MaxNameservers is the most nameservers a resolver uses (MAXNS of glibc
// and musl); more are ignored.
const MaxNameservers = 3

// DNS is the resolver configuration of the sandboxes allowed the
// internet.
type DNS struct {
	Nameservers []netip.Addr
	// Search and Options are the values of the host file's search (or
	// domain) and options lines; none with given nameservers.
	Search  []string
	Options []string
	// Source is the host file the settings come from; empty when the
	// nameservers were given, or none was found.
	Source string
}

// CheckNameserver says why a sandbox cannot use a as a nameserver, or
// returns nil. A sandbox reaches only IPv4 addresses beyond the host: it
// has no IPv6, the sandbox network forbids link-local destinations, and
// the host's loopback is not the sandbox's.
func CheckNameserver(a netip.Addr) error {
	a = a.Unmap()
	switch {
	case !a.IsValid():
		return errors.New("not an address")
	case !a.Is4():
		return fmt.Errorf("%s is an IPv6 address; sandboxes have no IPv6", a)
	case a.IsLoopback():
		return fmt.Errorf("%s is a loopback address, which a sandbox cannot reach on the host", a)
	case a.IsLinkLocalUnicast() || linkLocal.Contains(a):
		return fmt.Errorf("%s is a link-local address, which the sandbox network forbids", a)
	case a.IsUnspecified() || a.IsMulticast() || a == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return fmt.Errorf("%s is not a unicast address", a)
	}
	return nil
}

// ChooseDNS returns the sandboxes' resolver configuration: the given
// nameservers when there are any (checked by the caller), else those of
// the first of hostFiles (see HostResolvConfs) that names a nameserver a
// sandbox can use (CheckNameserver; the others are skipped), with that
// file's search and options lines. Missing and unreadable files are
// skipped; when no file names a usable nameserver, the result has none.
func ChooseDNS(servers []netip.Addr, hostFiles ...string) DNS {
	if len(servers) > 0 {
		return DNS{Nameservers: servers}
	}
	for _, f := range hostFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		if d := parseResolvConf(b); len(d.Nameservers) > 0 {
			d.Source = f
			return d
		}
	}
	return DNS{}
}

// parseResolvConf reads the usable nameservers (at most MaxNameservers),
// the last search or domain line and every options line of a
// resolv.conf, as the C library does.
func parseResolvConf(b []byte) DNS {
	var d DNS
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 2 {
			continue // comments start with '#' or ';', and match no case below
		}
		switch f[0] {
		case "nameserver":
			a, err := netip.ParseAddr(f[1])
			if err == nil && CheckNameserver(a) == nil && len(d.Nameservers) < MaxNameservers {
				d.Nameservers = append(d.Nameservers, a.Unmap())
			}
		case "search", "domain":
			d.Search = f[1:]
		case "options":
			d.Options = append(d.Options, f[1:]...)
		}
	}
	return d
}

// ResolvConf returns d as the text of a sandbox's /etc/resolv.conf.
func (d DNS) ResolvConf() string {
	var b strings.Builder
	switch {
	case d.Source != "":
		fmt.Fprintf(&b, "# Written by torpor at boot, from the host's %s.\n", d.Source)
	case len(d.Nameservers) > 0:
		b.WriteString("# Written by torpor at boot, from the server's configuration.\n")
	default:
		b.WriteString("# Written by torpor at boot: the host names no nameserver a sandbox can use.\n")
	}
	for _, a := range d.Nameservers {
		fmt.Fprintf(&b, "nameserver %s\n", a)
	}
	if len(d.Search) > 0 {
		fmt.Fprintf(&b, "search %s\n", strings.Join(d.Search, " "))
	}
	if len(d.Options) > 0 {
		fmt.Fprintf(&b, "options %s\n", strings.Join(d.Options, " "))
	}
	return b.String()
}

// HostUpstreams are the nameservers of the first of hostFiles that names
// any, as "addr:53": the resolvers torpor's own resolver forwards to
// when none are configured. Unlike a sandbox, the daemon reaches the
// host's loopback, so loopback servers (systemd-resolved's stub) count.
func HostUpstreams(hostFiles ...string) []string {
	for _, f := range hostFiles {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		var out []string
		sc := bufio.NewScanner(bytes.NewReader(b))
		for sc.Scan() {
			fs := strings.Fields(sc.Text())
			if len(fs) < 2 || fs[0] != "nameserver" {
				continue
			}
			if a, err := netip.ParseAddr(fs[1]); err == nil && a.Unmap().Is4() && len(out) < MaxNameservers {
				out = append(out, netip.AddrPortFrom(a.Unmap(), 53).String())
			}
		}
		if len(out) > 0 {
			return out
		}
	}
	return nil
}

// ResolverConf is the /etc/resolv.conf of a sandbox with host name
// egress rules: torpor's resolver on the bridge's address.
func (n *Network) ResolverConf() string {
	return "# Written by torpor: this sandbox has host name egress rules, which torpor's resolver enforces.\n" +
		"nameserver " + n.gw.String() + "\n"
}
