package torpor

import "math"

// ReasonQuota refines the forbidden error of a create, start or resume
// that would take a tenant's sandboxes past one of its quotas.
const ReasonQuota = "quota"

// Quota bounds what one tenant's sandboxes hold together; a zero field is
// no limit. What a sandbox holds follows the node's capacity accounting
// (docs/limits.md): every sandbox that is not terminated counts as one
// and holds its disk; it holds its vCPUs and memory in full while running
// (and on the way there or to paused), while paused by freeze less the
// node's paused_resource_release_ratio, and none while paused to a
// snapshot, hibernated or failed.
type Quota struct {
	MaxSandboxes int64   `json:"max_sandboxes,omitempty"`
	MaxVCPUs     float64 `json:"max_vcpus,omitempty"`
	MaxMemoryMiB int64   `json:"max_memory_mib,omitempty"`
	MaxDiskMiB   int64   `json:"max_disk_mib,omitempty"`
}

// QuotaUsage is what a tenant's sandboxes hold, in the units of Quota.
// Memory is fractional when paused sandboxes give part of theirs back.
type QuotaUsage struct {
	Sandboxes int64   `json:"sandboxes"`
	VCPUs     float64 `json:"vcpus"`
	MemoryMiB float64 `json:"memory_mib"`
	DiskMiB   int64   `json:"disk_mib"`
}

// The largest quotas accepted: far above any node, small enough that sums
// of them stay exact.
const (
	maxQuotaCount = 1 << 20
	maxQuotaVCPUs = 1 << 20
	maxQuotaMiB   = 1 << 40
)

// Validate checks every field: zero (no limit) or a positive amount, whole
// for the counts and MiB. A bad one is invalid_argument naming
// quota.<field>.
func (q Quota) Validate() error {
	for _, f := range []struct {
		param string
		v     int64
		max   int64
	}{{"quota.max_sandboxes", q.MaxSandboxes, maxQuotaCount}, {"quota.max_memory_mib", q.MaxMemoryMiB, maxQuotaMiB}, {"quota.max_disk_mib", q.MaxDiskMiB, maxQuotaMiB}} {
		if f.v < 0 || f.v > f.max {
			return Invalid(f.param, "must be 0 (no limit) or a whole number up to %d", f.max)
		}
	}
	if math.IsNaN(q.MaxVCPUs) || q.MaxVCPUs < 0 || q.MaxVCPUs > maxQuotaVCPUs {
		return Invalid("quota.max_vcpus", "must be 0 (no limit) or a positive number up to %d", maxQuotaVCPUs)
	}
	return nil
}
