package runc

import (
	"context"
	"errors"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/network"
)

var _ torpor.EgressEnforcer = (*Runtime)(nil)

// egressOf is what the sandbox network enforces of rules (nil: none).
func egressOf(rules *torpor.NetworkRules) *network.Egress {
	if rules.Empty() {
		return nil
	}
	return network.EgressOf(rules.AllowOut, rules.DenyOut)
}

// SetEgress replaces the egress rules of a booted sandbox in the kernel
// (docs/egress.md).
func (r *Runtime) SetEgress(ctx context.Context, ref torpor.InstanceRef, rules *torpor.NetworkRules) error {
	id, err := checkRef(ref)
	if err != nil {
		return err
	}
	if r.net == nil {
		return torpor.Invalid("network", "this server runs sandboxes without a sandbox network, so without egress rules")
	}
	err = r.net.SetEgress(ctx, r.netnsPath(id), egressOf(rules))
	if errors.Is(err, network.ErrNotAttached) {
		return nil // not booted: the next boot attaches with the rules
	}
	if err == nil && rules.HasNames() && r.namesResolvConf != "" {
		// Its lookups go to torpor's resolver from now on.
		if werr := writeResolvConf(r.rootfsDir(id), r.namesResolvConf); werr != nil {
			r.log.Warn("runc: writing the sandbox's /etc/resolv.conf", "sandbox", id, "err", werr)
		}
	}
	return err
}

// resolvConfOf is the /etc/resolv.conf a sandbox gets at boot ("": its
// own stays): torpor's resolver for a sandbox with host name rules, the
// sandboxes' nameservers for one allowed the internet.
func (r *Runtime) resolvConfOf(internet bool, rules *torpor.NetworkRules) string {
	if rules.HasNames() && r.namesResolvConf != "" {
		return r.namesResolvConf
	}
	if internet {
		return r.resolvConf
	}
	return ""
}
