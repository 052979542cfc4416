package vm

import (
	"context"
	"errors"
	"fmt"
	"net/netip"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/network"
	"github.com/torpor-dev/torpor/runtime/vm/proto"
)

// Network is what the runtime needs of the host's sandbox network
// (*network.Network): a sandbox's namespace with a tap device for its
// QEMU, made at boot and restore, gone when QEMU ends; its address, kept
// until the sandbox is destroyed; and what the guest is told (gateway
// and MTU).
type Network interface {
	Attach(ctx context.Context, ep network.Endpoint) (netip.Addr, error)
	Detach(ctx context.Context, netns string) error
	Release(ctx context.Context, netns string) error
	Addr(netns string) (netip.Addr, bool)
	SetEgress(ctx context.Context, netns string, eg *network.Egress) error
	Gateway() netip.Addr
	MTU() int
}

// tapName is the tap device in a sandbox's namespace that its QEMU opens.
const tapName = "tap0"

// machineNet is the network part of a machine: where its QEMU runs and
// what its guest is told.
type machineNet struct {
	// NetNS is the sandbox's namespace file; QEMU runs in it and opens
	// Tap there.
	NetNS string `json:"netns"`
	Tap   string `json:"tap"`
	// MAC is the guest card's address (network.GuestMAC of its address).
	MAC string `json:"mac"`
	// Internet is the sandbox's allow_internet, for Restore to attach the
	// namespace again as Boot did.
	Internet bool           `json:"internet,omitempty"`
	Guest    proto.GuestNet `json:"guest"`
}

// netnsPath is where the sandbox's network namespace is bind-mounted
// while its QEMU runs (with a Network only).
func (r *Runtime) netnsPath(id string) string { return r.sandboxPath(id, "netns") }

// attach puts the sandbox on the sandbox network (a namespace with the
// tap its QEMU opens) and returns the machine's network. want, when
// valid, is the address the guest already has (a restore).
func (r *Runtime) attach(ctx context.Context, id string, internet bool, rules *torpor.NetworkRules, want netip.Addr) (*machineNet, error) {
	ns := r.netnsPath(id)
	if rules.Empty() {
		rules = nil
	}
	addr, err := r.net.Attach(ctx, network.Endpoint{NetNS: ns, Internet: internet, Egress: egressOf(rules), Tap: tapName, Addr: want})
	if err != nil {
		return nil, err
	}
	if want.IsValid() && addr != want {
		r.detach(ctx, id)
		return nil, fmt.Errorf("%w: the sandbox holds %s, its guest %s", network.ErrAddrTaken, addr, want)
	}
	return &machineNet{
		NetNS:    ns,
		Tap:      tapName,
		MAC:      network.GuestMAC(addr).String(),
		Internet: internet,
		Guest:    proto.GuestNet{Addr: addr, Gateway: r.net.Gateway(), MTU: r.net.MTU()},
	}, nil
}

// reattach attaches a snapshotted sandbox again, as its guest remembers
// the network; a network that has changed since is a
// snapshot_unrestorable error.
func (r *Runtime) reattach(ctx context.Context, id string, m machine) error {
	switch {
	case m.Net == nil:
		return nil
	case r.net == nil:
		return snapshotError("it was made on the sandbox network, which this server does not run")
	case m.Net.Guest.Gateway != r.net.Gateway() || m.Net.Guest.MTU != r.net.MTU():
		return snapshotError("the sandbox network has changed since (gateway %s, MTU %d; the guest has %s, %d)",
			r.net.Gateway(), r.net.MTU(), m.Net.Guest.Gateway, m.Net.Guest.MTU)
	}
	if _, err := r.attach(ctx, id, m.Net.Internet, r.loadRules(id), m.Net.Guest.Addr); err != nil {
		if errors.Is(err, network.ErrAddrTaken) {
			return snapshotError("its address %s is another sandbox's now", m.Net.Guest.Addr)
		}
		return err
	}
	return nil
}

// detach takes the sandbox off the network (its namespace and tap go;
// its address stays leased). Failures are logged: the next attach
// removes leftovers.
func (r *Runtime) detach(ctx context.Context, id string) {
	if r.net == nil {
		return
	}
	if err := r.net.Detach(context.WithoutCancel(ctx), r.netnsPath(id)); err != nil {
		r.log.Warn("vm: detach from the sandbox network", "sandbox", id, "err", err)
	}
}

// Address returns the sandbox's address on the sandbox network, kept
// from its first boot until it is destroyed (across stops, snapshots and
// restarts of the daemon).
func (r *Runtime) Address(ctx context.Context, ref torpor.InstanceRef) (netip.Addr, bool) {
	id, err := checkRef(ref)
	if err != nil || r.net == nil {
		return netip.Addr{}, false
	}
	return r.net.Addr(r.netnsPath(id))
}

// Networked reports whether sandboxes get the host's sandbox network.
func (r *Runtime) Networked() bool { return r.net != nil }
