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
	return err
}
