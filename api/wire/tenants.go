package wire

import "github.com/torpor-dev/torpor"

// TenantUpdate is the body of PATCH /v1/tenants/{name}.
type TenantUpdate struct {
	Quota *QuotaUpdate `json:"quota,omitempty"`
}

// QuotaUpdate changes the quota fields it names; a field left out keeps
// its value, and 0 removes that limit.
type QuotaUpdate struct {
	MaxSandboxes *int64   `json:"max_sandboxes,omitempty"`
	MaxVCPUs     *float64 `json:"max_vcpus,omitempty"`
	MaxMemoryMiB *int64   `json:"max_memory_mib,omitempty"`
	MaxDiskMiB   *int64   `json:"max_disk_mib,omitempty"`
}

// Apply returns q with the update's fields in it.
func (u QuotaUpdate) Apply(q torpor.Quota) torpor.Quota {
	if u.MaxSandboxes != nil {
		q.MaxSandboxes = *u.MaxSandboxes
	}
	if u.MaxVCPUs != nil {
		q.MaxVCPUs = *u.MaxVCPUs
	}
	if u.MaxMemoryMiB != nil {
		q.MaxMemoryMiB = *u.MaxMemoryMiB
	}
	if u.MaxDiskMiB != nil {
		q.MaxDiskMiB = *u.MaxDiskMiB
	}
	return q
}
