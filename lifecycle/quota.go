package lifecycle

import (
	"context"
	"fmt"
	"strconv"
	"sync"

	"github.com/torpor-dev/torpor"
)

// quotas tracks what each tenant's sandboxes hold against the tenant's
// quota (torpor.Quota). vCPUs and memory are charged as the node's ledger
// charges them (chargeFor), so a tenant's quota and the node's capacity
// agree on what a paused or hibernated sandbox holds; on top of that every
// sandbox that is not terminated counts as one and holds its disk.
// A check and the reservation it allows happen under one lock, so two
// creates cannot both take a tenant's last slot.
type quotas struct {
	mu   sync.Mutex
	held map[string]quotaCharge // by sandbox id
	// used sums held by tenant; a tenant that holds nothing has no entry.
	used map[string]torpor.QuotaUsage
}

// quotaCharge is what one sandbox holds of its tenant's quota.
type quotaCharge struct {
	tenant string
	use    torpor.QuotaUsage
}

func newQuotas() *quotas {
	return &quotas{held: map[string]quotaCharge{}, used: map[string]torpor.QuotaUsage{}}
}

// set records that sandbox id of tenant holds use.
func (q *quotas) set(id, tenant string, use torpor.QuotaUsage) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.setLocked(id, tenant, use)
}

func (q *quotas) setLocked(id, tenant string, use torpor.QuotaUsage) {
	if old, ok := q.held[id]; ok {
		q.addLocked(old.tenant, old.use, -1)
		delete(q.held, id)
	}
	if use != (torpor.QuotaUsage{}) {
		q.held[id] = quotaCharge{tenant: tenant, use: use}
		q.addLocked(tenant, use, 1)
	}
}

// addLocked adds sign times use to tenant's sum. The entry goes when the
// tenant's last sandbox does, which also drops any rounding error the
// fractional vCPUs and memory left in it.
func (q *quotas) addLocked(tenant string, use torpor.QuotaUsage, sign int64) {
	u := q.used[tenant]
	u.Sandboxes += sign * use.Sandboxes
	u.VCPUs += float64(sign) * use.VCPUs
	u.MemoryMiB += float64(sign) * use.MemoryMiB
	u.DiskMiB += sign * use.DiskMiB
	if u.Sandboxes <= 0 {
		delete(q.used, tenant)
		return
	}
	q.used[tenant] = u
}

// admit reserves use for sandbox id of tenant, or refuses with the quota
// error when that takes the tenant past limit. undo puts back what the
// sandbox held before, for a transition that goes no further.
func (q *quotas) admit(id, tenant string, limit torpor.Quota, use torpor.QuotaUsage) (undo func(), err error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	old := q.held[id].use
	if err := checkQuota(tenant, limit, q.used[tenant], old, use); err != nil {
		return nil, err
	}
	q.setLocked(id, tenant, use)
	return func() { q.set(id, tenant, old) }, nil
}

// usage returns what tenant's sandboxes hold.
func (q *quotas) usage(tenant string) torpor.QuotaUsage {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.used[tenant]
}

// checkQuota decides whether one sandbox of tenant may go from holding old
// to holding want, when the tenant's sandboxes hold used in all (old
// included). Only what the change grows is checked: a tenant whose quota
// was lowered below what it holds may still do everything that takes
// nothing more (pause, hibernate, delete, restart, resume a sandbox whose
// pause kept its resources), but nothing that takes more.
func checkQuota(tenant string, limit torpor.Quota, used, old, want torpor.QuotaUsage) error {
	const eps = 1e-9
	over := func(max, used, old, want float64) bool {
		return max > 0 && want > old+eps && used-old+want > max+eps
	}
	refuse := func(hint, format string, args ...any) error {
		return &torpor.Error{Code: torpor.EForbidden, Reason: torpor.ReasonQuota,
			Message: fmt.Sprintf("tenant %q: ", tenant) + fmt.Sprintf(format, args...) + "; " + hint + ", or ask an admin to raise the quota"}
	}
	const (
		deleteSome = "delete sandboxes"
		freeSome   = "pause, hibernate or delete sandboxes"
	)
	switch {
	case over(float64(limit.MaxSandboxes), float64(used.Sandboxes), float64(old.Sandboxes), float64(want.Sandboxes)):
		return refuse(deleteSome, "quota max_sandboxes is %d sandboxes and it has %d that are not terminated (hibernated and failed ones count)",
			limit.MaxSandboxes, used.Sandboxes)
	case over(limit.MaxVCPUs, used.VCPUs, old.VCPUs, want.VCPUs):
		return refuse(freeSome, "quota max_vcpus is %s vCPUs; its sandboxes hold %s and this needs %s more",
			num(limit.MaxVCPUs), num(used.VCPUs), num(want.VCPUs-old.VCPUs))
	case over(float64(limit.MaxMemoryMiB), used.MemoryMiB, old.MemoryMiB, want.MemoryMiB):
		return refuse(freeSome, "quota max_memory_mib is %d MiB; its sandboxes hold %s MiB and this needs %s MiB more",
			limit.MaxMemoryMiB, num(used.MemoryMiB), num(want.MemoryMiB-old.MemoryMiB))
	case over(float64(limit.MaxDiskMiB), float64(used.DiskMiB), float64(old.DiskMiB), float64(want.DiskMiB)):
		return refuse(deleteSome, "quota max_disk_mib is %d MiB; its sandboxes hold %d MiB of disk (hibernated ones too) and this needs %d MiB more",
			limit.MaxDiskMiB, used.DiskMiB, want.DiskMiB-old.DiskMiB)
	}
	return nil
}

// num formats a quantity without an exponent and without trailing zeros.
func num(v float64) string { return strconv.FormatFloat(v, 'f', -1, 64) }

// heldState is the state whose charge a sandbox in state s holds: one
// paused to a snapshot holds no CPU and no memory, as a hibernated one.
func heldState(s torpor.State, mode torpor.PauseMode) torpor.State {
	if s == torpor.StatePaused && mode == torpor.PauseSnapshot || s == torpor.StateArchiving || s == torpor.StateArchived {
		return torpor.StateHibernated
	}
	return s
}

// quotaUse is what a sandbox with resources r holds of its tenant's
// quota in state s (as heldState gives it).
func (e *Engine) quotaUse(s torpor.State, r torpor.Resources) torpor.QuotaUsage {
	if s == torpor.StateTerminated {
		return torpor.QuotaUsage{}
	}
	c := e.ledger.chargeFor(s, r)
	return torpor.QuotaUsage{Sandboxes: 1, VCPUs: c.vcpus, MemoryMiB: c.memory, DiskMiB: r.DiskMiB}
}

// reserve admits sb into state s: within its tenant's quota (forbidden,
// reason quota, otherwise), then within the node's capacity (a retriable
// capacity conflict otherwise). What it reserves stands until the next
// hold of sb; a refusal reserves nothing.
func (e *Engine) reserve(ctx context.Context, sb *torpor.Sandbox, s torpor.State) error {
	limit, err := e.tenantQuota(ctx, sb.Tenant)
	if err != nil {
		return err
	}
	undo, err := e.quotas.admit(sb.ID, sb.Tenant, limit, e.quotaUse(s, sb.Resources))
	if err != nil {
		return err
	}
	if err := e.ledger.admit(sb.ID, s, sb.Resources); err != nil {
		undo()
		return err
	}
	return nil
}

// hold records what sb holds, of the node and of its tenant's quota, in
// state s: its stored state, or the one a transition that went no further
// leaves it in.
func (e *Engine) hold(sb *torpor.Sandbox, s torpor.State) {
	held := heldState(s, sb.PauseMode)
	e.ledger.record(sb.ID, held, sb.Resources)
	e.quotas.set(sb.ID, sb.Tenant, e.quotaUse(held, sb.Resources))
}

// tenantQuota reads tenant's quota. A tenant the store does not know (the
// engine's own tests make sandboxes for any name) has none.
func (e *Engine) tenantQuota(ctx context.Context, tenant string) (torpor.Quota, error) {
	t, err := e.store.GetTenant(ctx, tenant)
	switch {
	case torpor.IsCode(err, torpor.ENotFound):
		return torpor.Quota{}, nil
	case err != nil:
		return torpor.Quota{}, fmt.Errorf("read the quota of tenant %s: %w", tenant, err)
	}
	return t.Quota, nil
}

// TenantUsage returns what tenant's sandboxes hold, in the units of its
// quota.
func (e *Engine) TenantUsage(tenant string) torpor.QuotaUsage { return e.quotas.usage(tenant) }
