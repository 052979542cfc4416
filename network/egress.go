package network

import (
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"
	"slices"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Egress is an endpoint's egress rules as the kernel enforces them
// (docs/egress.md): a packet from the sandbox to a Deny block is
// refused, then one to an Allow block passes; what neither holds is
// refused when Closed, and otherwise goes as Endpoint.Internet says. The
// host and the other sandboxes are never reached through it (their
// rules come first), nor link-local addresses.
type Egress struct {
	Allow  []netip.Prefix `json:"allow,omitempty"`
	Deny   []netip.Prefix `json:"deny,omitempty"`
	Closed bool           `json:"closed,omitempty"`
	// AllowNames and DenyNames are the rules' host names (exact, or
	// "*.example.com" for every name under example.com), which torpor's
	// resolver matches (resolver.go).
	AllowNames []string `json:"allow_names,omitempty"`
	DenyNames  []string `json:"deny_names,omitempty"`
	// Learned are the addresses the resolver answered for the names:
	// those of an allowed name join the allow set, those of a denied
	// name the deny set. They are kept while the names' rules are, until
	// the sandbox's next boot (docs/egress.md); at most MaxLearned.
	Learned []Learned `json:"learned,omitempty"`
}

// Learned is one address the resolver answered for a name.
type Learned struct {
	Name string     `json:"name"`
	Addr netip.Addr `json:"addr"`
}

// MaxLearned bounds the learned addresses of a sandbox; past it, the
// oldest are forgotten first.
const MaxLearned = 1024

// HasNames reports whether eg has host name rules (and so torpor's
// resolver).
func (eg *Egress) HasNames() bool {
	return eg != nil && (len(eg.AllowNames) > 0 || len(eg.DenyNames) > 0)
}

// EgressOf makes the Egress of rule entries: addresses, CIDR blocks and
// host names (see torpor.NetworkRules; names as validated, in lower case
// without a trailing dot); any allow entry, a name included, closes the
// sandbox.
func EgressOf(allow, deny []string) *Egress {
	if len(allow) == 0 && len(deny) == 0 {
		return nil
	}
	eg := &Egress{Closed: len(allow) > 0}
	for _, l := range []struct {
		in    []string
		out   *[]netip.Prefix
		names *[]string
	}{{allow, &eg.Allow, &eg.AllowNames}, {deny, &eg.Deny, &eg.DenyNames}} {
		for _, s := range l.in {
			if p, err := netip.ParsePrefix(s); err == nil && p.Addr().Is4() {
				*l.out = append(*l.out, p.Masked())
			} else if a, err := netip.ParseAddr(s); err == nil && a.Unmap().Is4() {
				*l.out = append(*l.out, netip.PrefixFrom(a.Unmap(), 32))
			} else if err != nil && s != "" && !strings.ContainsAny(s, ":/") {
				*l.names = append(*l.names, strings.ToLower(strings.TrimSuffix(s, ".")))
			}
		}
	}
	return eg
}

// ipRange is the IPv4 addresses [lo, hi) (hi up to 1<<32).
type ipRange struct{ lo, hi uint64 }

// ranges merges the IPv4 blocks of ps into sorted, disjoint ranges (the
// elements of an interval set, which may not overlap).
func ranges(ps []netip.Prefix) []ipRange {
	var rs []ipRange
	for _, p := range ps {
		if !p.Addr().Is4() {
			continue
		}
		p = p.Masked()
		b := p.Addr().As4()
		lo := uint64(binary.BigEndian.Uint32(b[:]))
		rs = append(rs, ipRange{lo, lo + 1<<(32-p.Bits())})
	}
	slices.SortFunc(rs, func(a, b ipRange) int { return cmp.Compare(a.lo, b.lo) })
	var out []ipRange
	for _, r := range rs {
		if n := len(out); n > 0 && r.lo <= out[n-1].hi {
			out[n-1].hi = max(out[n-1].hi, r.hi)
			continue
		}
		out = append(out, r)
	}
	return out
}

// intervalElems are the elements of an IPv4 interval set holding ps.
func intervalElems(ps []netip.Prefix) []nftables.SetElement {
	var els []nftables.SetElement
	for _, r := range ranges(ps) {
		els = append(els, nftables.SetElement{Key: binary.BigEndian.AppendUint32(nil, uint32(r.lo))})
		if r.hi < 1<<32 {
			els = append(els, nftables.SetElement{Key: binary.BigEndian.AppendUint32(nil, uint32(r.hi)), IntervalEnd: true})
		}
	}
	return els
}

// egressMap is the verdict map from a sandbox's address to its egress
// chain, for the sandboxes that have rules.
func (n *Network) egressMap() *nftables.Set {
	inet, _ := n.tables()
	return &nftables.Set{Table: inet, Name: "egress", IsMap: true, KeyType: nftables.TypeIPAddr, DataType: nftables.TypeVerdict}
}

// egressNames are the names of a sandbox's egress chain and sets.
func egressNames(addr netip.Addr) (chain, allow, deny string) {
	b := addr.As4()
	s := fmt.Sprintf("eg-%08x", binary.BigEndian.Uint32(b[:]))
	return s, s + "-a", s + "-d"
}

// learnedSets are a sandbox's sets of the addresses its resolver learned
// for allowed and for denied names (plain sets: single addresses, which
// may overlap the blocks of the rules).
func (n *Network) learnedSets(addr netip.Addr) (allow, deny *nftables.Set) {
	inet, _ := n.tables()
	cn, _, _ := egressNames(addr)
	return &nftables.Set{Table: inet, Name: cn + "-la", KeyType: nftables.TypeIPAddr},
		&nftables.Set{Table: inet, Name: cn + "-ld", KeyType: nftables.TypeIPAddr}
}

// dnsSet holds the addresses of the sandboxes that may query torpor's
// resolver on the bridge's address (those with host name rules).
func (n *Network) dnsSet() *nftables.Set {
	inet, _ := n.tables()
	return &nftables.Set{Table: inet, Name: "dns", KeyType: nftables.TypeIPAddr}
}

// learnedElems are the elements of the learned allow and deny sets of
// eg: an address learned for a denied name is denied (deny wins), one
// learned for an allowed name allowed; one whose name the rules no
// longer cover is neither.
func learnedElems(eg *Egress) (allow, deny []nftables.SetElement) {
	seenA, seenD := map[netip.Addr]bool{}, map[netip.Addr]bool{}
	for _, l := range eg.Learned {
		if !l.Addr.Is4() {
			continue
		}
		switch eg.MatchName(l.Name) {
		case NameDenied:
			if !seenD[l.Addr] {
				seenD[l.Addr] = true
				deny = append(deny, nftables.SetElement{Key: l.Addr.AsSlice()})
			}
		case NameAllowed:
			if !seenA[l.Addr] {
				seenA[l.Addr] = true
				allow = append(allow, nftables.SetElement{Key: l.Addr.AsSlice()})
			}
		}
	}
	return allow, deny
}

// addEgress adds to the batch the chain and sets of addr's rules and
// its element of the egress map; with exists, the chain and sets are
// there already, and are emptied and filled again (in place, so that a
// change applies atomically to the packets of open connections too).
func (n *Network) addEgress(c *nftables.Conn, addr netip.Addr, eg *Egress, exists bool) error {
	inet, _ := n.tables()
	cn, an, dn := egressNames(addr)
	allowSet := &nftables.Set{Table: inet, Name: an, KeyType: nftables.TypeIPAddr, Interval: true}
	denySet := &nftables.Set{Table: inet, Name: dn, KeyType: nftables.TypeIPAddr, Interval: true}
	learnedAllow, learnedDeny := n.learnedSets(addr)
	la, ld := learnedElems(eg)
	inDNS := false
	if exists {
		// Read on a connection of its own, before the batch is queued.
		rc, err := nftables.New()
		if err != nil {
			return err
		}
		// A table made by a daemon that predates host names lacks the
		// resolver's sets: they are made here (an add of a set that
		// exists changes nothing), and a missing set holds nothing.
		inDNS, _ = hasElement(rc, n.dnsSet(), addr.AsSlice())
	}
	var ch *nftables.Chain
	if exists {
		for _, s := range []*nftables.Set{learnedAllow, learnedDeny, n.dnsSet()} {
			if err := c.AddSet(s, nil); err != nil {
				return err
			}
		}
		ch = &nftables.Chain{Name: cn, Table: inet}
		c.FlushChain(ch)
		for _, s := range []*nftables.Set{allowSet, denySet, learnedAllow, learnedDeny} {
			c.FlushSet(s)
		}
		for _, s := range []struct {
			set *nftables.Set
			els []nftables.SetElement
		}{{allowSet, intervalElems(eg.Allow)}, {denySet, intervalElems(eg.Deny)}, {learnedAllow, la}, {learnedDeny, ld}} {
			if len(s.els) == 0 {
				continue
			}
			if err := c.SetAddElements(s.set, s.els); err != nil {
				return err
			}
		}
	} else {
		if err := c.AddSet(allowSet, intervalElems(eg.Allow)); err != nil {
			return err
		}
		if err := c.AddSet(denySet, intervalElems(eg.Deny)); err != nil {
			return err
		}
		if err := c.AddSet(learnedAllow, la); err != nil {
			return err
		}
		if err := c.AddSet(learnedDeny, ld); err != nil {
			return err
		}
		ch = c.AddChain(&nftables.Chain{Name: cn, Table: inet})
	}
	rule := func(exprs ...[]expr.Any) {
		var all []expr.Any
		for _, e := range exprs {
			all = append(all, e...)
		}
		c.AddRule(&nftables.Rule{Table: inet, Chain: ch, Exprs: all})
	}
	reject := []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED}}
	resetTCP := []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_TCP_RST}}
	refuse := func(match ...[]expr.Any) {
		rule(append(append([]([]expr.Any){}, match...), l4proto(unix.IPPROTO_TCP), resetTCP)...)
		rule(append(append([]([]expr.Any){}, match...), reject)...)
	}
	refuse(ipv4(), ipInSet(16, denySet))
	refuse(ipv4(), ipInSet(16, learnedDeny))
	refuse(ipv4(), ipInPrefix(16, linkLocal, true))
	rule(ipv4(), ipInSet(16, allowSet), []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}})
	rule(ipv4(), ipInSet(16, learnedAllow), []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}})
	if eg.Closed {
		refuse()
	}
	// The resolver on the bridge's address answers the sandboxes with
	// host name rules only.
	dnsEl := []nftables.SetElement{{Key: addr.AsSlice()}}
	switch {
	case eg.HasNames() && !inDNS:
		if err := c.SetAddElements(n.dnsSet(), dnsEl); err != nil {
			return err
		}
	case !eg.HasNames() && inDNS:
		if err := c.SetDeleteElements(n.dnsSet(), dnsEl); err != nil {
			return err
		}
	}
	if !exists {
		return c.SetAddElements(n.egressMap(), []nftables.SetElement{{Key: addr.AsSlice(),
			VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: cn}}})
	}
	return nil
}

// delEgress adds to the batch the removal of addr's egress map element,
// chain and sets, when they exist.
func (n *Network) delEgress(c *nftables.Conn, addr netip.Addr) (bool, error) {
	inet, _ := n.tables()
	cn, an, dn := egressNames(addr)
	if _, err := c.GetSetByName(inet, an); err != nil {
		return false, nil // none
	}
	if err := c.SetDeleteElements(n.egressMap(), []nftables.SetElement{{Key: addr.AsSlice(),
		VerdictData: &expr.Verdict{Kind: expr.VerdictJump, Chain: cn}}}); err != nil {
		return false, err
	}
	if in, _ := hasElement(c, n.dnsSet(), addr.AsSlice()); in {
		if err := c.SetDeleteElements(n.dnsSet(), []nftables.SetElement{{Key: addr.AsSlice()}}); err != nil {
			return false, err
		}
	}
	ch := &nftables.Chain{Name: cn, Table: inet}
	c.FlushChain(ch)
	c.DelChain(ch)
	c.DelSet(&nftables.Set{Table: inet, Name: an})
	c.DelSet(&nftables.Set{Table: inet, Name: dn})
	la, ld := n.learnedSets(addr)
	for _, s := range []*nftables.Set{la, ld} {
		if err := c.AddSet(s, nil); err != nil { // made if missing, so that the delete cannot fail
			return false, err
		}
		c.DelSet(s)
	}
	return true, nil
}

// egressLookup jumps a sandbox's packets to its egress chain when it has
// one (ip saddr vmap @egress).
func egressLookup(m *nftables.Set) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Lookup{SourceRegister: reg1, DestRegister: 0, IsDestRegSet: true, SetName: m.Name, SetID: m.ID},
	}
}

// ErrNotAttached: SetEgress for an endpoint that holds no lease.
var ErrNotAttached = errors.New("network: the endpoint is not attached")

// SetEgress replaces the egress rules of the attached endpoint of netns
// (nil removes them), in the kernel at once and in its lease (so that
// they are there again after a restart of the daemon).
func (n *Network) SetEgress(ctx context.Context, netns string, eg *Egress) error {
	addr, ok := n.Addr(netns)
	if !ok {
		return ErrNotAttached
	}
	unlock, err := n.lock()
	if err != nil {
		return err
	}
	defer unlock()
	path := n.leasePath(addr)
	var l lease
	if b, err := os.ReadFile(path); err != nil {
		return fmt.Errorf("network: lease %s: %w", addr, err)
	} else if err := json.Unmarshal(b, &l); err != nil {
		return fmt.Errorf("network: lease %s: %w", addr, err)
	}
	if l.NetNS != netns {
		return ErrNotAttached
	}
	if eg != nil {
		if err := enableForwarding(n.log); err != nil {
			return fmt.Errorf("network: %w", err)
		}
		// What the resolver learned stays for the names still ruled on.
		cp := *eg
		cp.Learned = nil
		if l.Egress != nil {
			for _, ln := range l.Egress.Learned {
				if cp.MatchName(ln.Name) != NameUnruled {
					cp.Learned = append(cp.Learned, ln)
				}
			}
		}
		eg = &cp
	}
	l.Egress = eg
	body, err := json.Marshal(l)
	if err != nil {
		return err
	}
	if err := writeFileAtomic(path, body); err != nil {
		return fmt.Errorf("network: lease %s: %w", addr, err)
	}
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("network: nftables: %w", err)
	}
	inet, _ := n.tables()
	_, an, _ := egressNames(addr)
	_, serr := c.GetSetByName(inet, an)
	exists := serr == nil
	switch {
	case eg == nil && !exists:
		return nil
	case eg == nil:
		if _, err := n.delEgress(c, addr); err != nil {
			return fmt.Errorf("network: nftables: %w", err)
		}
	default:
		if err := n.addEgress(c, addr, eg, exists); err != nil {
			return fmt.Errorf("network: nftables: %w", err)
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("network: egress rules of %s: %w", addr, err)
	}
	return nil
}
