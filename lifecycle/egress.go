package lifecycle

import (
	"context"

	"github.com/torpor-dev/torpor"
)

// checkEgress refuses egress rules for a runtime that cannot enforce
// them, or that has no sandbox network.
func checkEgress(rt torpor.Runtime, rules *torpor.NetworkRules) error {
	if rules.Empty() {
		return nil
	}
	if _, ok := rt.(torpor.EgressEnforcer); !ok {
		return torpor.Invalid("network", "sandboxes of the %s runtime cannot have egress rules yet; use a container (runc) sandbox (docs/egress.md)", rt.Kind())
	}
	if a, ok := rt.(torpor.Addresser); !ok || !a.Networked() {
		return torpor.Invalid("network", "sandboxes of the %s runtime have no sandbox network on this server, so no egress rules", rt.Kind())
	}
	return nil
}

// updateEgress replaces sb's egress rules: checked, then enforced at once
// on an instance that exists (running or frozen); a stopped sandbox gets
// them at its next boot. The caller holds the sandbox's lock and saves
// it.
func (e *Engine) updateEgress(ctx context.Context, sb *torpor.Sandbox, rules *torpor.NetworkRules) error {
	rules = &torpor.NetworkRules{AllowOut: append([]string(nil), rules.AllowOut...), DenyOut: append([]string(nil), rules.DenyOut...)}
	if err := torpor.ValidateNetworkRules("network", rules); err != nil {
		return err
	}
	rt, err := e.runtime(sb.Runtime.Kind)
	if err != nil {
		return err
	}
	if err := checkEgress(rt, rules); err != nil {
		return err
	}
	if sb.Handle != "" && (sb.State == torpor.StateRunning || sb.State == torpor.StatePaused) {
		if en, ok := rt.(torpor.EgressEnforcer); ok {
			if err := en.SetEgress(ctx, ref(sb), rules.Clone()); err != nil {
				return err
			}
		}
	}
	sb.Network = rules.Clone()
	return nil
}
