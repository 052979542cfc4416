package runc

import (
	"context"
	"fmt"
	"net"
	"net/netip"
	"os"
	goruntime "runtime"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor"
)

// DialContext connects to addr inside the sandbox's network namespace
// (its loopback included): the socket is made on an OS thread that has
// entered that namespace, and it stays there after the thread returns to
// the daemon's.
//
// With a sandbox network the runtime could dial the sandbox's address
// instead, and a dial would cost less (no namespace switch), but every
// byte would then cross the veth pair, the bridge and the host's
// connection tracking; the proxy keeps its connections alive, so bytes
// matter more than dials (docs/network.md has the figures). The loopback
// also reaches services bound to 127.0.0.1 only.
func (r *Runtime) DialContext(ctx context.Context, ref torpor.InstanceRef, network, addr string) (net.Conn, error) {
	id, err := checkRef(ref)
	if err != nil {
		return nil, err
	}
	in, alive, err := r.lookup(ctx, id)
	if err != nil {
		return nil, err
	}
	if !alive || in == nil {
		return nil, torpor.Errorf(torpor.EConflict, "sandbox %s has no running instance", id)
	}
	ns, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", in.PID))
	if err != nil {
		return nil, fmt.Errorf("runc: network namespace of %s: %w", id, err)
	}
	defer ns.Close()
	if !in.Alive() { // the pid was recycled between lookup and open
		return nil, torpor.Errorf(torpor.EConflict, "sandbox %s has no running instance", id)
	}
	return dialIn(ctx, ns, network, addr)
}

// dialIn dials from inside the network namespace ns.
func dialIn(ctx context.Context, ns *os.File, network, addr string) (net.Conn, error) {
	type result struct {
		c   net.Conn
		err error
	}
	ch := make(chan result, 1)
	go func() {
		goruntime.LockOSThread()
		home, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			goruntime.UnlockOSThread()
			ch <- result{nil, err}
			return
		}
		defer home.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			goruntime.UnlockOSThread()
			ch <- result{nil, fmt.Errorf("runc: enter network namespace: %w", err)}
			return
		}
		var d net.Dialer
		c, err := d.DialContext(ctx, network, addr)
		if serr := unix.Setns(int(home.Fd()), unix.CLONE_NEWNET); serr != nil {
			// Leave the thread locked: it ends with this goroutine rather
			// than run other goroutines in the sandbox's network.
			ch <- result{c, err}
			return
		}
		goruntime.UnlockOSThread()
		ch <- result{c, err}
	}()
	res := <-ch
	return res.c, res.err
}

var _ torpor.Dialer = (*Runtime)(nil)

// Address returns the sandbox's address on the sandbox network, kept from
// its first boot until it is destroyed.
func (r *Runtime) Address(ctx context.Context, ref torpor.InstanceRef) (netip.Addr, bool) {
	id, err := checkRef(ref)
	if err != nil || r.net == nil {
		return netip.Addr{}, false
	}
	return r.net.Addr(r.netnsPath(id))
}

var _ torpor.Addresser = (*Runtime)(nil)

// Networked reports whether sandboxes get the host's sandbox network.
func (r *Runtime) Networked() bool { return r.net != nil }
