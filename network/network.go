// Package network gives each sandbox an address of its own on a host
// bridge. A sandbox's network namespace holds one end of a veth pair
// (eth0, with an IPv4 address from a configured range and a default route
// through the bridge); the other end is an isolated port of the bridge,
// which holds the range's first address. A virtual machine's namespace
// (Endpoint.Tap) bridges its eth0 to a tap device for the VM's QEMU
// instead, and the VM's own card takes the address.
//
// nftables rules (tables `inet <bridge>` and `bridge <bridge>`) make the
// policy: the host reaches every sandbox; no sandbox reaches another one,
// nor a service of the host (only replies to connections the host opened
// pass); a sandbox sends only from its own address; and only sandboxes
// attached with Internet reach beyond the host, masqueraded behind it.
//
// An address is leased to an endpoint, named by the path of its network
// namespace file, until Release: it survives Detach (a hibernated
// sandbox keeps its address) and a restart of the daemon. Leases live in
// files under Config.StateDir, one per address, shared by every process
// that uses the same bridge and guarded by a file lock, so two daemons on
// one host never hand out the same address.
package network

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"regexp"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Defaults of Config.
const (
	DefaultBridge   = "torpor0"
	DefaultStateDir = "/run/torpor/network"
)

// DefaultPrefix is the default address range: private, and rarely used by
// anything else.
var DefaultPrefix = netip.MustParsePrefix("10.213.0.0/16")

// Config configures a Network.
type Config struct {
	// Bridge names the host bridge (and the nftables tables); it is made
	// when missing. Default DefaultBridge.
	Bridge string
	// Prefix is the IPv4 range of sandbox addresses; the bridge holds its
	// first address. Default DefaultPrefix.
	Prefix netip.Prefix
	// StateDir holds the leases, under a directory per bridge. Default
	// DefaultStateDir (on tmpfs: leases end with the host's uptime, as
	// the namespaces and links they describe do).
	StateDir string
	// MTU of the veth pairs; 0: that of the host's default route's
	// interface, else 1500.
	MTU int
	// Logger receives diagnostics; default slog.Default().
	Logger *slog.Logger
}

// Endpoint is one sandbox's attachment.
type Endpoint struct {
	// NetNS is the path of the sandbox's network namespace file: Attach
	// makes the namespace and bind-mounts it there. It names the lease,
	// so it must be unique on the host and its directory must exist for
	// as long as the lease is held (a lease whose directory has gone is
	// reclaimed).
	NetNS string
	// Internet lets the sandbox reach addresses beyond the host.
	Internet bool
	// Egress holds its egress rules (nil: none); SetEgress changes them.
	Egress *Egress
	// Tap, when set, attaches a virtual machine rather than the
	// namespace itself: the namespace gets a tap device of this name
	// (for the VM's QEMU, which must run in the namespace) bridged to
	// its eth0, and no address of its own; the VM's network card, whose
	// MAC address must be GuestMAC(addr), takes the address, with the
	// routes a container's eth0 has (a /32, a default route through
	// Gateway) and an MTU of MTU(). The host's bridge port forwards only
	// that MAC address to it and learns no other from it (a VM's root
	// can change its card's address, which a container cannot).
	Tap string
	// Addr, when valid, is the address wanted if the endpoint holds no
	// lease yet (a VM restored from a snapshot after the leases were
	// lost keeps the address it had in its memory). Attach fails with
	// ErrAddrTaken when another endpoint holds it, and leases nothing.
	Addr netip.Addr
}

// ErrAddrTaken: the address an Endpoint asked for is leased to another.
var ErrAddrTaken = errors.New("network: the address is leased to another sandbox")

// Network is a bridge, its rules and its leases.
type Network struct {
	bridge string
	prefix netip.Prefix
	gw     netip.Addr
	dir    string
	mtu    int
	log    *slog.Logger

	mu     sync.Mutex
	leases map[string]netip.Addr // netns path → address, as this process knows them
	next   netip.Addr            // where the next allocation starts looking
	// users holds a shared lock on the bridge's users file for as long as
	// the Network is open: Close removes the bridge only when it can take
	// that lock exclusively, that is when no other Network holds it.
	users *os.File
	// resolver is the socket of torpor's resolver (StartResolver).
	resolver net.PacketConn
}

var (
	bridgeNameRE = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,15}$`)
	linkNameRE   = regexp.MustCompile(`^[A-Za-z0-9_-]{1,15}$`)
)

// New makes (or adopts) the bridge, its address and its rules, and loads
// the leases, reclaiming those whose namespace's directory has gone.
func New(ctx context.Context, cfg Config) (*Network, error) {
	if cfg.Bridge == "" {
		cfg.Bridge = DefaultBridge
	}
	if !cfg.Prefix.IsValid() {
		cfg.Prefix = DefaultPrefix
	}
	if cfg.StateDir == "" {
		cfg.StateDir = DefaultStateDir
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if !bridgeNameRE.MatchString(cfg.Bridge) || cfg.Bridge == "." || cfg.Bridge == ".." {
		return nil, fmt.Errorf("network: bad bridge name %q (1-15 letters, digits, '_', '.', '-')", cfg.Bridge)
	}
	p := cfg.Prefix.Masked()
	if !p.Addr().Is4() || p.Bits() < 8 || p.Bits() > 29 {
		return nil, fmt.Errorf("network: the sandbox range must be an IPv4 prefix from /8 to /29, got %s", cfg.Prefix)
	}
	n := &Network{
		bridge: cfg.Bridge,
		prefix: p,
		gw:     p.Addr().Next(),
		dir:    filepath.Join(cfg.StateDir, cfg.Bridge),
		mtu:    cfg.MTU,
		log:    cfg.Logger,
		leases: map[string]netip.Addr{},
	}
	n.next = n.gw.Next()
	if n.mtu <= 0 {
		n.mtu = defaultMTU()
	}
	if err := os.MkdirAll(n.leaseDir(), 0o700); err != nil {
		return nil, fmt.Errorf("network: %w", err)
	}
	// The users lock comes first: a Close that is removing the bridge
	// holds it exclusively, and the bridge is made again once it is done.
	users, err := flockFile(n.usersPath(), unix.LOCK_SH)
	if err != nil {
		return nil, err
	}
	n.users = users
	unlock, err := n.lock()
	if err != nil {
		n.users.Close()
		return nil, err
	}
	defer unlock()
	if err := n.ensureBridge(); err != nil {
		n.users.Close()
		return nil, err
	}
	all, err := n.readLeases()
	if err != nil {
		return nil, err
	}
	var live []lease
	for _, l := range all {
		if _, err := os.Stat(filepath.Dir(l.NetNS)); errors.Is(err, fs.ErrNotExist) {
			n.log.Info("network: reclaiming the address of a vanished sandbox", "addr", l.Addr, "netns", l.NetNS)
			_ = deleteLink(hostLinkName(l.Addr))
			_ = n.forgetNeighbor(l.Addr)
			_ = os.Remove(n.leasePath(l.Addr))
			continue
		}
		n.leases[l.NetNS] = l.Addr
		live = append(live, l)
	}
	if err := n.writeRules(live); err != nil {
		n.users.Close()
		return nil, err
	}
	return n, nil
}

// Bridge returns the bridge's name.
func (n *Network) Bridge() string { return n.bridge }

// Gateway returns the bridge's address, the sandboxes' default route.
func (n *Network) Gateway() netip.Addr { return n.gw }

// Prefix returns the range of sandbox addresses.
func (n *Network) Prefix() netip.Prefix { return n.prefix }

// MTU returns the MTU of the sandboxes' links.
func (n *Network) MTU() int { return n.mtu }

// Addr returns the address leased to the endpoint with namespace path
// netns.
func (n *Network) Addr(netns string) (netip.Addr, bool) {
	n.mu.Lock()
	defer n.mu.Unlock()
	a, ok := n.leases[netns]
	return a, ok
}

// Attach makes the endpoint's network namespace at ep.NetNS (replacing
// whatever is there) with eth0 on the bridge, using the address already
// leased to it or a new one, and returns the address.
func (n *Network) Attach(ctx context.Context, ep Endpoint) (netip.Addr, error) {
	if !filepath.IsAbs(ep.NetNS) || filepath.Clean(ep.NetNS) != ep.NetNS {
		return netip.Addr{}, fmt.Errorf("network: the namespace path must be clean and absolute, got %q", ep.NetNS)
	}
	if ep.Tap != "" && (!linkNameRE.MatchString(ep.Tap) || ep.Tap == sandboxLink || ep.Tap == nsBridge || ep.Tap == "lo") {
		return netip.Addr{}, fmt.Errorf("network: bad tap name %q", ep.Tap)
	}
	if ep.Addr.IsValid() && !n.inRange(ep.Addr) {
		return netip.Addr{}, fmt.Errorf("network: %s is not a sandbox address of %s", ep.Addr, n.prefix)
	}
	var took attachSteps
	t := time.Now()
	addr, err := n.acquire(ep)
	if err != nil {
		return netip.Addr{}, err
	}
	t = took.since(&took.lease, t)
	// Leftovers of an earlier attachment (a crash mid-boot) go first.
	if err := n.detach(addr, ep.NetNS); err != nil {
		return netip.Addr{}, err
	}
	took.since(&took.clean, t)
	if err := n.plug(ctx, ep, addr, &took); err != nil {
		if derr := n.detach(addr, ep.NetNS); derr != nil {
			n.log.Warn("network: cleanup after a failed attach", "netns", ep.NetNS, "err", derr)
		}
		return netip.Addr{}, err
	}
	n.log.Debug("network: attach steps", "netns", ep.NetNS, "lease_ms", ms(took.lease), "clean_ms", ms(took.clean),
		"netns_ms", ms(took.netns), "veth_ms", ms(took.veth), "rules_ms", ms(took.rules))
	return addr, nil
}

// attachSteps are how long the steps of an Attach took, for its debug
// line (which the create benchmark reads, see BENCHMARKS.md).
type attachSteps struct{ lease, clean, netns, veth, rules time.Duration }

// since sets *step to the time from t0 until now, and returns now.
func (attachSteps) since(step *time.Duration, t0 time.Time) time.Time {
	now := time.Now()
	*step = now.Sub(t0)
	return now
}

// ms is d in milliseconds, for a log line.
func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// plug makes the namespace and the veth pair, and lets the address in.
func (n *Network) plug(ctx context.Context, ep Endpoint, addr netip.Addr, took *attachSteps) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	t := time.Now()
	if err := createNetNS(ep.NetNS); err != nil {
		return fmt.Errorf("network: %w", err)
	}
	t = took.since(&took.netns, t)
	if err := n.addVeth(ep.NetNS, addr, ep.Tap); err != nil {
		return fmt.Errorf("network: %w", err)
	}
	t = took.since(&took.veth, t)
	unlock, err := n.lock()
	if err != nil {
		return err
	}
	defer unlock()
	if ep.Internet || ep.Egress != nil {
		if err := enableForwarding(n.log); err != nil {
			return fmt.Errorf("network: %w", err)
		}
	}
	defer took.since(&took.rules, t)
	return n.allow(hostLinkName(addr), addr, ep.Internet, ep.Egress)
}

// Detach removes the endpoint's veth pair and network namespace; its
// address stays leased to it. Detaching what is not attached succeeds.
func (n *Network) Detach(ctx context.Context, netns string) error {
	addr, _ := n.Addr(netns)
	return n.detach(addr, netns)
}

func (n *Network) detach(addr netip.Addr, netns string) error {
	if addr.IsValid() {
		if err := deleteLink(hostLinkName(addr)); err != nil {
			return fmt.Errorf("network: %w", err)
		}
		if err := n.forgetNeighbor(addr); err != nil {
			return fmt.Errorf("network: %w", err)
		}
		unlock, err := n.lock()
		if err != nil {
			return err
		}
		err = n.disallow(hostLinkName(addr), addr)
		unlock()
		if err != nil {
			return err
		}
	}
	if err := removeNetNS(netns); err != nil {
		return fmt.Errorf("network: %w", err)
	}
	return nil
}

// Release detaches the endpoint and gives its address back. Releasing
// what holds no address succeeds.
func (n *Network) Release(ctx context.Context, netns string) error {
	if err := n.Detach(ctx, netns); err != nil {
		return err
	}
	n.mu.Lock()
	addr, ok := n.leases[netns]
	n.mu.Unlock()
	if !ok {
		return nil
	}
	unlock, err := n.lock()
	if err != nil {
		return err
	}
	defer unlock()
	if err := os.Remove(n.leasePath(addr)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("network: release %s: %w", addr, err)
	}
	n.mu.Lock()
	delete(n.leases, netns)
	n.mu.Unlock()
	return nil
}

// Remove deletes the bridge, its rules and its lease directory. Every
// endpoint should have been released; the veths of any left are deleted.
func (n *Network) Remove(ctx context.Context) error {
	unlock, err := n.lock()
	if err != nil {
		return err
	}
	defer unlock()
	all, _ := n.readLeases()
	for _, l := range all {
		_ = deleteLink(hostLinkName(l.Addr))
	}
	n.closeUsers()
	if err := n.deleteRules(); err != nil {
		return err
	}
	if err := deleteLink(n.bridge); err != nil {
		return fmt.Errorf("network: %w", err)
	}
	return os.RemoveAll(n.dir)
}

// Close ends this Network's use of the bridge. When nothing else uses the
// bridge then (no link is plugged into it: a running or frozen sandbox's
// port, a VM's; and no other Network, of this process or another, holds
// it), Close also deletes the bridge and its nftables tables, so that a
// daemon that stops with no sandbox running leaves the host's network as
// it found it. The leases stay (files under Config.StateDir): a hibernated
// sandbox boots again with its address, and the next New makes the bridge
// and its rules again. The Network must not be used after Close.
func (n *Network) Close(ctx context.Context) error {
	n.stopResolver()
	unlock, err := n.lock()
	if err != nil {
		return err
	}
	defer unlock()
	n.closeUsers()
	ports, err := n.ports()
	if err != nil {
		return err
	}
	if len(ports) > 0 {
		n.log.Debug("network: the bridge stays: links are plugged into it", "bridge", n.bridge, "ports", len(ports))
		return nil
	}
	only, err := flockFile(n.usersPath(), unix.LOCK_EX|unix.LOCK_NB)
	if errors.Is(err, unix.EWOULDBLOCK) {
		n.log.Debug("network: the bridge stays: another torpor uses it", "bridge", n.bridge)
		return nil
	}
	if err != nil {
		return err
	}
	defer only.Close()
	if err := n.deleteRules(); err != nil {
		return err
	}
	if err := deleteLink(n.bridge); err != nil {
		return fmt.Errorf("network: %w", err)
	}
	n.log.Info("network: removed the bridge and its nftables tables, which no sandbox uses", "bridge", n.bridge)
	return nil
}

// closeUsers gives up this Network's hold on the bridge.
func (n *Network) closeUsers() {
	if n.users != nil {
		n.users.Close()
		n.users = nil
	}
}

// lease is one address's file.
type lease struct {
	Addr     netip.Addr `json:"-"`
	NetNS    string     `json:"netns"`
	Internet bool       `json:"internet"`
	Egress   *Egress    `json:"egress,omitempty"`
}

func (n *Network) leaseDir() string              { return filepath.Join(n.dir, "leases") }
func (n *Network) leasePath(a netip.Addr) string { return filepath.Join(n.leaseDir(), a.String()) }
func (n *Network) lockPath() string              { return filepath.Join(n.dir, "lock") }
func (n *Network) usersPath() string             { return filepath.Join(n.dir, "users") }
func (n *Network) inRange(a netip.Addr) bool {
	return n.prefix.Contains(a) && a != n.gw && a != n.prefix.Addr() && a != n.broadcast()
}
func (n *Network) broadcast() netip.Addr               { return lastAddr(n.prefix) }
func (n *Network) hostAddrs() (netip.Addr, netip.Addr) { return n.gw.Next(), n.broadcast().Prev() }

// lock takes the lock on the bridge's leases and rules, shared by every
// process on the host; the returned func releases it.
func (n *Network) lock() (func(), error) {
	f, err := flockFile(n.lockPath(), unix.LOCK_EX)
	if err != nil {
		return nil, err
	}
	return func() { f.Close() }, nil
}

// flockFile opens (making it when missing) the file at path and locks it
// with flock(2) as how says; closing the file unlocks it. A lock that
// LOCK_NB refuses is an error that wraps unix.EWOULDBLOCK.
func flockFile(path string, how int) (*os.File, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, fmt.Errorf("network: lock: %w", err)
	}
	for {
		err = unix.Flock(int(f.Fd()), how)
		if !errors.Is(err, unix.EINTR) {
			break
		}
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("network: lock %s: %w", filepath.Base(path), err)
	}
	return f, nil
}

// readLeases reads every lease of the bridge (any process's).
func (n *Network) readLeases() ([]lease, error) {
	entries, err := os.ReadDir(n.leaseDir())
	if err != nil {
		return nil, fmt.Errorf("network: leases: %w", err)
	}
	var out []lease
	for _, e := range entries {
		a, err := netip.ParseAddr(e.Name())
		if err != nil || !n.inRange(a) {
			continue // a temporary file, or a lease of another range
		}
		b, err := os.ReadFile(filepath.Join(n.leaseDir(), e.Name()))
		if err != nil {
			return nil, fmt.Errorf("network: leases: %w", err)
		}
		var l lease
		if err := json.Unmarshal(b, &l); err != nil || !filepath.IsAbs(l.NetNS) {
			// Torn by a crash between create and write: nobody uses it.
			n.log.Warn("network: removing an unreadable lease", "addr", a)
			_ = os.Remove(filepath.Join(n.leaseDir(), e.Name()))
			continue
		}
		l.Addr = a
		out = append(out, l)
	}
	return out, nil
}

// acquire returns the address leased to ep, leasing a free one when it
// has none, and records ep.Internet in the lease.
func (n *Network) acquire(ep Endpoint) (netip.Addr, error) {
	unlock, err := n.lock()
	if err != nil {
		return netip.Addr{}, err
	}
	defer unlock()
	l := lease{NetNS: ep.NetNS, Internet: ep.Internet, Egress: ep.Egress}
	body, err := json.Marshal(l)
	if err != nil {
		return netip.Addr{}, err
	}
	n.mu.Lock()
	addr, ok := n.leases[ep.NetNS]
	start := n.next
	n.mu.Unlock()
	if ok {
		if err := writeFileAtomic(n.leasePath(addr), body); err != nil {
			return netip.Addr{}, fmt.Errorf("network: lease %s: %w", addr, err)
		}
		return addr, nil
	}
	if ep.Addr.IsValid() {
		return n.take(ep, ep.Addr, body)
	}
	first, last := n.hostAddrs()
	if !n.inRange(start) {
		start = first
	}
	a := start
	for {
		f, err := os.OpenFile(n.leasePath(a), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err == nil {
			_, werr := f.Write(body)
			if cerr := f.Close(); werr == nil {
				werr = cerr
			}
			if werr != nil {
				_ = os.Remove(n.leasePath(a))
				return netip.Addr{}, fmt.Errorf("network: lease %s: %w", a, werr)
			}
			n.mu.Lock()
			n.leases[ep.NetNS] = a
			n.next = a.Next()
			n.mu.Unlock()
			return a, nil
		}
		if !errors.Is(err, fs.ErrExist) {
			return netip.Addr{}, fmt.Errorf("network: lease %s: %w", a, err)
		}
		if a == last {
			a = first
		} else {
			a = a.Next()
		}
		if a == start {
			return netip.Addr{}, fmt.Errorf("network: every address of %s is leased", n.prefix)
		}
	}
}

// take leases the address a to ep (the lock is held), failing with
// ErrAddrTaken when it is another's.
func (n *Network) take(ep Endpoint, a netip.Addr, body []byte) (netip.Addr, error) {
	f, err := os.OpenFile(n.leasePath(a), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return netip.Addr{}, fmt.Errorf("%w: %s", ErrAddrTaken, a)
	}
	if err != nil {
		return netip.Addr{}, fmt.Errorf("network: lease %s: %w", a, err)
	}
	_, werr := f.Write(body)
	if cerr := f.Close(); werr == nil {
		werr = cerr
	}
	if werr != nil {
		_ = os.Remove(n.leasePath(a))
		return netip.Addr{}, fmt.Errorf("network: lease %s: %w", a, werr)
	}
	n.mu.Lock()
	n.leases[ep.NetNS] = a
	n.mu.Unlock()
	return a, nil
}

// lastAddr is the last address of p (its broadcast address).
func lastAddr(p netip.Prefix) netip.Addr {
	b := p.Masked().Addr().As4()
	host := uint32(1)<<(32-p.Bits()) - 1
	v := uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
	v |= host
	return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
}

// writeFileAtomic writes a file through a temporary file and a rename.
func writeFileAtomic(name string, b []byte) error {
	tmp := name + ".tmp"
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, name)
}
