package network

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"net/netip"
	"os"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// The rules, as nft would print them (bridge torpor0, range 10.213.0.0/16):
//
//	table inet torpor0 {
//	  set internet { type ipv4_addr }   # sandboxes allowed the internet
//	  chain input {                     # to the host itself
//	    type filter hook input priority filter; policy accept;
//	    iifname "torpor0" ct state established,related accept
//	    iifname "torpor0" meta l4proto tcp reject with tcp reset
//	    iifname "torpor0" reject with icmpx admin-prohibited
//	  }
//	  chain forward {
//	    type filter hook forward priority filter; policy accept;
//	    iifname "torpor0" oifname "torpor0" meta l4proto tcp reject with tcp reset
//	    iifname "torpor0" oifname "torpor0" reject with icmpx admin-prohibited
//	    oifname "torpor0" ct state established,related accept
//	    oifname "torpor0" drop
//	    iifname "torpor0" ip saddr @internet ip daddr != 169.254.0.0/16 accept
//	    iifname "torpor0" meta l4proto tcp reject with tcp reset
//	    iifname "torpor0" reject with icmpx admin-prohibited
//	  }
//	  chain output {
//	    type filter hook output priority filter; policy accept;
//	    oifname "torpor0" icmp type redirect drop
//	  }
//	  chain postrouting {
//	    type nat hook postrouting priority srcnat; policy accept;
//	    ip saddr 10.213.0.0/16 oifname != "torpor0" masquerade
//	  }
//	}
//	table bridge torpor0 {
//	  set ports { type ifname . ipv4_addr }   # host veth . sandbox address
//	  chain forward {                          # port to port
//	    type filter hook forward priority filter; policy accept;
//	    iifgroup G drop
//	  }
//	  chain input {                            # port up to the host
//	    type filter hook input priority filter; policy accept;
//	    iifgroup G ether type ip iifname . ip saddr != @ports drop
//	    iifgroup G ether type arp iifname . arp saddr ip != @ports drop
//	    iifgroup G ether type ip accept
//	    iifgroup G ether type arp accept
//	    iifgroup G drop
//	  }
//	}
//
// G is the interface group of the bridge's ports (see linkGroup): bridge
// tables see the frames of every bridge, and kernels often lack `meta
// ibrname`.

// Registers: NFT_REG_1 holds 16 bytes (an interface name); NFT_REG32_04
// is the 32-bit register right after it, for a concatenated key.
const (
	reg1     = 1
	reg32_04 = 12
)

const (
	etherTypeIPv4 = 0x0800
	etherTypeARP  = 0x0806
)

// linkLocal is never forwarded to: it holds cloud metadata services.
var linkLocal = netip.MustParsePrefix("169.254.0.0/16")

func (n *Network) tables() (inet, bridge *nftables.Table) {
	return &nftables.Table{Name: n.bridge, Family: nftables.TableFamilyINet},
		&nftables.Table{Name: n.bridge, Family: nftables.TableFamilyBridge}
}

func (n *Network) sets() (internet, ports *nftables.Set) {
	inet, br := n.tables()
	return &nftables.Set{Table: inet, Name: "internet", KeyType: nftables.TypeIPAddr},
		&nftables.Set{Table: br, Name: "ports", KeyType: nftables.MustConcatSetType(nftables.TypeIFName, nftables.TypeIPAddr), Concatenation: true}
}

// writeRules replaces both tables, in one atomic batch, with the rules and
// the sets of the given leases whose veth exists.
func (n *Network) writeRules(leases []lease) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("network: nftables: %w", err)
	}
	inet, br := n.tables()
	internet, ports := n.sets()
	var inetElems, portElems []nftables.SetElement
	var egress []lease
	for _, l := range leases {
		name := hostLinkName(l.Addr)
		if _, err := os.Stat("/sys/class/net/" + name); err != nil {
			continue
		}
		portElems = append(portElems, portElem(name, l.Addr))
		if l.Internet {
			inetElems = append(inetElems, nftables.SetElement{Key: l.Addr.AsSlice()})
		}
		if l.Egress != nil {
			egress = append(egress, l)
		}
	}

	// Add, delete and add again: the delete cannot fail for a missing
	// table, and nothing is ever left without rules.
	for _, t := range []*nftables.Table{inet, br} {
		c.AddTable(t)
		c.DelTable(t)
		c.AddTable(t)
	}
	if err := c.AddSet(internet, inetElems); err != nil {
		return fmt.Errorf("network: nftables: %w", err)
	}
	if err := c.AddSet(ports, portElems); err != nil {
		return fmt.Errorf("network: nftables: %w", err)
	}
	egressMap := n.egressMap()
	if err := c.AddSet(egressMap, nil); err != nil {
		return fmt.Errorf("network: nftables: %w", err)
	}
	dnsSet := n.dnsSet()
	if err := c.AddSet(dnsSet, nil); err != nil {
		return fmt.Errorf("network: nftables: %w", err)
	}
	for _, l := range egress {
		if err := n.addEgress(c, l.Addr, l.Egress, false); err != nil {
			return fmt.Errorf("network: nftables: %w", err)
		}
	}
	accept := nftables.ChainPolicyAccept
	chain := func(t *nftables.Table, name string, hook *nftables.ChainHook, typ nftables.ChainType, prio *nftables.ChainPriority) *nftables.Chain {
		return c.AddChain(&nftables.Chain{Name: name, Table: t, Hooknum: hook, Type: typ, Priority: prio, Policy: &accept})
	}
	rule := func(ch *nftables.Chain, exprs ...[]expr.Any) {
		var all []expr.Any
		for _, e := range exprs {
			all = append(all, e...)
		}
		c.AddRule(&nftables.Rule{Table: ch.Table, Chain: ch, Exprs: all})
	}
	b := n.bridge
	reject := []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_ICMPX_UNREACH, Code: unix.NFT_REJECT_ICMPX_ADMIN_PROHIBITED}}
	resetTCP := []expr.Any{&expr.Reject{Type: unix.NFT_REJECT_TCP_RST}}
	accepted := []expr.Any{&expr.Verdict{Kind: expr.VerdictAccept}}
	dropped := []expr.Any{&expr.Verdict{Kind: expr.VerdictDrop}}

	// A refused TCP connection is reset (not rate-limited as ICMP
	// errors are, so it always fails at once); anything else gets an
	// ICMP error.
	refuse := func(ch *nftables.Chain, match ...[]expr.Any) {
		rule(ch, append(append([]([]expr.Any){}, match...), l4proto(unix.IPPROTO_TCP), resetTCP)...)
		rule(ch, append(append([]([]expr.Any){}, match...), reject)...)
	}

	in := chain(inet, "input", nftables.ChainHookInput, nftables.ChainTypeFilter, nftables.ChainPriorityFilter)
	rule(in, ifname(expr.MetaKeyIIFNAME, b, true), ctReplies(), accepted)
	// torpor's resolver (resolver.go), for the sandboxes with host name
	// rules: ip saddr @dns ip daddr GW udp dport 53 accept.
	rule(in, ifname(expr.MetaKeyIIFNAME, b, true), ipv4(), ipInSet(12, dnsSet),
		ipInPrefix(16, netip.PrefixFrom(n.gw, 32), true), l4proto(unix.IPPROTO_UDP), dport(53), accepted)
	refuse(in, ifname(expr.MetaKeyIIFNAME, b, true))

	fw := chain(inet, "forward", nftables.ChainHookForward, nftables.ChainTypeFilter, nftables.ChainPriorityFilter)
	refuse(fw, ifname(expr.MetaKeyIIFNAME, b, true), ifname(expr.MetaKeyOIFNAME, b, true))
	rule(fw, ifname(expr.MetaKeyOIFNAME, b, true), ctReplies(), accepted)
	rule(fw, ifname(expr.MetaKeyOIFNAME, b, true), dropped)
	rule(fw, ifname(expr.MetaKeyIIFNAME, b, true), ipv4(), egressLookup(egressMap))
	rule(fw, ifname(expr.MetaKeyIIFNAME, b, true), ipv4(), ipInSet(12, internet), ipInPrefix(16, linkLocal, false), accepted)
	refuse(fw, ifname(expr.MetaKeyIIFNAME, b, true))

	// The host would tell a sandbox that another one is on its link (it
	// is not reachable there either); say nothing.
	out := chain(inet, "output", nftables.ChainHookOutput, nftables.ChainTypeFilter, nftables.ChainPriorityFilter)
	rule(out, ifname(expr.MetaKeyOIFNAME, b, true), ipv4(), l4proto(unix.IPPROTO_ICMP), icmpType(icmpRedirect), dropped)

	nat := chain(inet, "postrouting", nftables.ChainHookPostrouting, nftables.ChainTypeNAT, nftables.ChainPriorityNATSource)
	rule(nat, ipv4(), ipInPrefix(12, n.prefix, true), ifname(expr.MetaKeyOIFNAME, b, false), []expr.Any{&expr.Masq{}})

	port := fromGroup(linkGroup(b))
	bfw := chain(br, "forward", nftables.ChainHookForward, nftables.ChainTypeFilter, nftables.ChainPriorityFilter)
	rule(bfw, port, dropped)

	bin := chain(br, "input", nftables.ChainHookInput, nftables.ChainTypeFilter, nftables.ChainPriorityFilter)
	rule(bin, port, etherType(etherTypeIPv4), portSource(12, ports), dropped)
	rule(bin, port, etherType(etherTypeARP), portSource(14, ports), dropped)
	rule(bin, port, etherType(etherTypeIPv4), accepted)
	rule(bin, port, etherType(etherTypeARP), accepted)
	rule(bin, port, dropped)

	if err := c.Flush(); err != nil {
		return fmt.Errorf("network: nftables rules: %w", err)
	}
	return nil
}

// allow adds a plugged sandbox to the sets: its port and address, and
// its address to the internet set when it may go out. Only additions: the
// detach that comes before every plug (Attach) took out whatever elements
// of the address were left, under the lock that the caller holds again.
func (n *Network) allow(link string, addr netip.Addr, internet bool, eg *Egress) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("network: nftables: %w", err)
	}
	inetSet, ports := n.sets()
	if err := c.SetAddElements(ports, []nftables.SetElement{portElem(link, addr)}); err != nil {
		return fmt.Errorf("network: nftables: %w", err)
	}
	if internet {
		if err := c.SetAddElements(inetSet, []nftables.SetElement{{Key: addr.AsSlice()}}); err != nil {
			return fmt.Errorf("network: nftables: %w", err)
		}
	}
	if eg != nil {
		if err := n.addEgress(c, addr, eg, false); err != nil {
			return fmt.Errorf("network: nftables: %w", err)
		}
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("network: allow %s: %w", addr, err)
	}
	return nil
}

// disallow removes an unplugged sandbox from the sets (the caller holds
// the lock). It deletes only the elements that are there: a commit that
// deletes one waits for the kernel's RCU grace period (15 ms on a busy
// host, three times an addition), and the address of a new sandbox, or of
// one stopped cleanly, has none. Under the lock, only this endpoint's
// Attach adds them, so what the sets hold stays as read until the delete.
func (n *Network) disallow(link string, addr netip.Addr) error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("network: nftables: %w", err)
	}
	inetSet, ports := n.sets()
	deletes := 0
	for _, s := range []struct {
		set *nftables.Set
		el  nftables.SetElement
	}{{ports, portElem(link, addr)}, {inetSet, nftables.SetElement{Key: addr.AsSlice()}}} {
		have, err := hasElement(c, s.set, s.el.Key)
		if err != nil {
			return fmt.Errorf("network: nftables: %w", err)
		}
		if !have {
			continue
		}
		if err := c.SetDeleteElements(s.set, []nftables.SetElement{s.el}); err != nil {
			return fmt.Errorf("network: nftables: %w", err)
		}
		deletes++
	}
	if had, err := n.delEgress(c, addr); err != nil {
		return fmt.Errorf("network: nftables: %w", err)
	} else if had {
		deletes++
	}
	if deletes == 0 {
		return nil
	}
	if err := c.Flush(); err != nil {
		return fmt.Errorf("network: disallow %s: %w", addr, err)
	}
	return nil
}

// hasElement reports whether the set holds an element of key.
func hasElement(c *nftables.Conn, set *nftables.Set, key []byte) (bool, error) {
	elems, err := c.GetSetElements(set)
	if err != nil {
		return false, err
	}
	for _, e := range elems {
		if bytes.Equal(e.Key, key) {
			return true, nil
		}
	}
	return false, nil
}

// deleteRules deletes both tables; missing ones are fine.
func (n *Network) deleteRules() error {
	c, err := nftables.New()
	if err != nil {
		return fmt.Errorf("network: nftables: %w", err)
	}
	inet, br := n.tables()
	for _, t := range []*nftables.Table{inet, br} {
		c.AddTable(t)
		c.DelTable(t)
	}
	if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("network: delete rules: %w", err)
	}
	return nil
}

// portElem is the key of a bridge port and the one source address it may
// send from.
func portElem(link string, addr netip.Addr) nftables.SetElement {
	key := make([]byte, unix.IFNAMSIZ, unix.IFNAMSIZ+4)
	copy(key, link)
	key = append(key, addr.AsSlice()...)
	return nftables.SetElement{Key: key}
}

// ifname matches (or, with eq false, excludes) an interface name.
func ifname(key expr.MetaKey, name string, eq bool) []expr.Any {
	op := expr.CmpOpEq
	if !eq {
		op = expr.CmpOpNeq
	}
	return []expr.Any{
		&expr.Meta{Key: key, Register: reg1},
		&expr.Cmp{Op: op, Register: reg1, Data: []byte(name + "\x00")},
	}
}

// fromGroup matches frames from an interface of a group.
func fromGroup(g uint32) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFGROUP, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: nativeU32(g)},
	}
}

// linkGroup is the interface group of a bridge's sandbox ports, made from
// its name (never 0, the group of every other link).
func linkGroup(bridge string) uint32 {
	h := fnv.New32a()
	h.Write([]byte("torpor:" + bridge))
	if g := h.Sum32(); g != 0 {
		return g
	}
	return 1
}

// l4proto matches the transport protocol.
func l4proto(p byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{p}},
	}
}

const icmpRedirect = 5

// icmpType matches an ICMP message type.
func icmpType(t byte) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseTransportHeader, Offset: 0, Len: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{t}},
	}
}

// ctReplies matches packets of connections already established (or
// related to one, such as ICMP errors).
func ctReplies() []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: reg1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4,
			Mask: nativeU32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED), Xor: nativeU32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: reg1, Data: nativeU32(0)},
	}
}

func ipv4() []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: reg1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{unix.NFPROTO_IPV4}},
	}
}

// ipInSet matches the IPv4 address at offset (12: source, 16:
// destination) in a set.
func ipInSet(offset uint32, s *nftables.Set) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
		&expr.Lookup{SourceRegister: reg1, SetName: s.Name, SetID: s.ID},
	}
}

// ipInPrefix matches (in true) or excludes the IPv4 address at offset.
func ipInPrefix(offset uint32, p netip.Prefix, in bool) []expr.Any {
	op := expr.CmpOpEq
	if !in {
		op = expr.CmpOpNeq
	}
	mask := ipNet(p).Mask
	return []expr.Any{
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
		&expr.Bitwise{SourceRegister: reg1, DestRegister: reg1, Len: 4, Mask: []byte(mask), Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: op, Register: reg1, Data: p.Masked().Addr().AsSlice()},
	}
}

// etherType matches a frame's ether type (bridge family).
func etherType(t uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseLLHeader, Offset: 12, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: []byte{byte(t >> 8), byte(t)}},
	}
}

// portSource matches a frame from a bridge port whose IPv4 source address
// (at offset in the network header: 12 for IP, 14 for ARP) is not the
// one the port may send from.
func portSource(offset uint32, ports *nftables.Set) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: reg1},
		&expr.Payload{DestRegister: reg32_04, Base: expr.PayloadBaseNetworkHeader, Offset: offset, Len: 4},
		&expr.Lookup{SourceRegister: reg1, SetName: ports.Name, SetID: ports.ID, Invert: true},
	}
}

func nativeU32(v uint32) []byte {
	b := make([]byte, 4)
	binary.NativeEndian.PutUint32(b, v)
	return b
}

// dport matches a UDP or TCP destination port (after l4proto).
func dport(p uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: reg1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: reg1, Data: binary.BigEndian.AppendUint16(nil, p)},
	}
}
