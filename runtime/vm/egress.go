package vm

import (
	"context"
	"errors"
	"os"
	"strings"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/files"
	"github.com/torpor-dev/torpor/network"
	"github.com/torpor-dev/torpor/runtime/instances"
)

var _ torpor.EgressEnforcer = (*Runtime)(nil)

// rulesFile holds a sandbox's egress rules as its last boot or SetEgress
// had them, for Restore to attach the namespace with them (not in
// machine.json, whose fingerprint a snapshot must keep).
const rulesFile = "egress.json"

// egressOf is what the sandbox network enforces of rules (nil: none).
func egressOf(rules *torpor.NetworkRules) *network.Egress {
	if rules.Empty() {
		return nil
	}
	return network.EgressOf(rules.AllowOut, rules.DenyOut)
}

// saveRules records rules (nil: none) for Restore.
func (r *Runtime) saveRules(id string, rules *torpor.NetworkRules) error {
	if rules.Empty() {
		if err := os.Remove(r.sandboxPath(id, rulesFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
			return err
		}
		return nil
	}
	return r.saveJSON(id, rulesFile, rules)
}

// loadRules returns the recorded rules (nil: none, or unreadable, which
// is logged: the lifecycle gives them again after a restore).
func (r *Runtime) loadRules(id string) *torpor.NetworkRules {
	var rules torpor.NetworkRules
	ok, err := r.loadJSON(id, rulesFile, &rules)
	if err != nil {
		r.log.Warn("vm: reading the sandbox's egress rules", "sandbox", id, "err", err)
	}
	if !ok || err != nil {
		return nil
	}
	return rules.Clone()
}

// resolvConfOf is the /etc/resolv.conf the guest's agent writes at boot
// ("": its own stays): torpor's resolver for a sandbox with host name
// rules, the sandboxes' nameservers for one allowed the internet.
func (r *Runtime) resolvConfOf(internet bool, rules *torpor.NetworkRules) string {
	if rules.HasNames() && r.namesResolvConf != "" {
		return r.namesResolvConf
	}
	if internet {
		return r.resolvConf
	}
	return ""
}

// SetEgress replaces the egress rules of a sandbox (docs/egress.md): in
// the kernel at once while its VM runs or is frozen (the sets keyed by
// its address, as for a container: its tap's namespace is on the
// sandbox network like a container's), and in its record, which a
// restore from its snapshot attaches with.
func (r *Runtime) SetEgress(ctx context.Context, ref torpor.InstanceRef, rules *torpor.NetworkRules) error {
	id, err := checkRef(ref)
	if err != nil {
		return err
	}
	if r.net == nil {
		return torpor.Invalid("network", "this server runs VMs without a sandbox network, so without egress rules")
	}
	live, err := r.setEgress(ctx, id, rules)
	if err != nil || !live || !rules.HasNames() || r.namesResolvConf == "" {
		return err
	}
	// Its lookups go to torpor's resolver from now on; a frozen guest
	// cannot be written to (its next boot writes the file).
	fsys, err := r.SandboxFS(ctx, ref)
	if err == nil {
		mode := files.Mode(0o644)
		_, err = fsys.Write("/etc/resolv.conf", strings.NewReader(r.namesResolvConf), files.WriteOptions{Mode: &mode})
		fsys.Close()
	}
	if err != nil {
		r.log.Warn("vm: writing the guest's /etc/resolv.conf", "sandbox", id, "err", err)
	}
	return nil
}

// setEgress records rules and, with a live VM, has the kernel enforce
// them; it reports whether the VM was live.
func (r *Runtime) setEgress(ctx context.Context, id string, rules *torpor.NetworkRules) (bool, error) {
	defer r.locks.Lock(id)()
	if err := r.saveRules(id, rules); err != nil {
		return false, err
	}
	st, _, err := r.inspect(ctx, id)
	if err != nil {
		return false, err
	}
	if !instances.Live(st) {
		return false, nil // its restore or next boot attaches with them
	}
	err = r.net.SetEgress(ctx, r.netnsPath(id), egressOf(rules))
	if errors.Is(err, network.ErrNotAttached) {
		return false, nil
	}
	return err == nil, err
}
