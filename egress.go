package torpor

import (
	"net/netip"
	"strings"
)

// NetworkRules are a sandbox's egress rules (docs/egress.md): what it may
// reach beyond the host. Each entry is an IPv4 address, an IPv4 CIDR
// block or a host name. Deny wins over allow. With any allow entry,
// everything else is refused; with only deny entries, the sandbox keeps
// its allow_internet reach less what they deny. Rules never open the host
// or other sandboxes.
type NetworkRules struct {
	AllowOut []string `json:"allow_out,omitempty"`
	DenyOut  []string `json:"deny_out,omitempty"`
}

// MaxNetworkRules bounds the entries of each of allow_out and deny_out.
const MaxNetworkRules = 64

// Empty reports whether r has no rule (nil included).
func (r *NetworkRules) Empty() bool {
	return r == nil || len(r.AllowOut) == 0 && len(r.DenyOut) == 0
}

// Clone copies r (nil, and rules without entries, give nil).
func (r *NetworkRules) Clone() *NetworkRules {
	if r.Empty() {
		return nil
	}
	return &NetworkRules{AllowOut: append([]string(nil), r.AllowOut...), DenyOut: append([]string(nil), r.DenyOut...)}
}

// HasNames reports whether any rule names a host.
func (r *NetworkRules) HasNames() bool {
	if r == nil {
		return false
	}
	for _, l := range [][]string{r.AllowOut, r.DenyOut} {
		for _, e := range l {
			if _, _, ok := ParseNetworkRule(e); ok {
				continue
			}
			return true
		}
	}
	return false
}

// ParseNetworkRule reads an address or CIDR entry as a prefix (an
// address is its /32); ok is false for a host name (or anything else).
func ParseNetworkRule(s string) (p netip.Prefix, isAddr, ok bool) {
	if a, err := netip.ParseAddr(s); err == nil {
		a = a.Unmap()
		if !a.Is4() {
			return netip.Prefix{}, false, false
		}
		return netip.PrefixFrom(a, 32), true, true
	}
	if p, err := netip.ParsePrefix(s); err == nil && p.Addr().Unmap().Is4() {
		return netip.PrefixFrom(p.Addr().Unmap(), p.Bits()).Masked(), false, true
	}
	return netip.Prefix{}, false, false
}

// ValidateNetworkRules checks the rules of a create or an update (param
// is "network") and writes them in canonical form: CIDR blocks masked,
// host names in lower case without a trailing dot.
func ValidateNetworkRules(param string, r *NetworkRules) error {
	if r == nil {
		return nil
	}
	for _, f := range []struct {
		name string
		list *[]string
	}{{"allow_out", &r.AllowOut}, {"deny_out", &r.DenyOut}} {
		p := param + "." + f.name
		if len(*f.list) > MaxNetworkRules {
			return Invalid(p, "at most %d entries", MaxNetworkRules)
		}
		for i, e := range *f.list {
			canon, err := checkNetworkRule(e)
			if err != "" {
				return Invalid(p, "%q is not %s", truncate(e), err)
			}
			(*f.list)[i] = canon
		}
	}
	return nil
}

// checkNetworkRule returns e in canonical form, or what it should have
// been.
func checkNetworkRule(e string) (string, string) {
	const want = "an IPv4 address, an IPv4 CIDR block or a host name (exact, or *.example.com)"
	if e == "" {
		return "", want
	}
	if a, err := netip.ParseAddr(e); err == nil {
		if !a.Unmap().Is4() {
			return "", "an IPv4 address (sandboxes have no IPv6)"
		}
		return a.Unmap().String(), ""
	}
	if strings.Contains(e, "/") {
		p, err := netip.ParsePrefix(e)
		if err != nil {
			return "", "a valid CIDR block"
		}
		if !p.Addr().Unmap().Is4() {
			return "", "an IPv4 CIDR block (sandboxes have no IPv6)"
		}
		return netip.PrefixFrom(p.Addr().Unmap(), p.Bits()).Masked().String(), ""
	}
	name := strings.ToLower(strings.TrimSuffix(e, "."))
	// "*.example.com": every name under example.com.
	if rest, ok := strings.CutPrefix(name, "*."); ok && strings.Contains(rest, ".") && validHostName(rest) {
		return name, ""
	}
	if !validHostName(name) {
		return "", want
	}
	return name, ""
}

// validHostName reports whether s is a DNS name of letters, digits and
// hyphens (labels of 1-63, 253 in all), not all digits (an address).
func validHostName(s string) bool {
	if len(s) == 0 || len(s) > 253 {
		return false
	}
	digits := true
	for _, l := range strings.Split(s, ".") {
		if len(l) == 0 || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for _, c := range l {
			switch {
			case c >= 'a' && c <= 'z', c == '-', c == '_':
				digits = false
			case c >= '0' && c <= '9':
			default:
				return false
			}
		}
	}
	return !digits
}
