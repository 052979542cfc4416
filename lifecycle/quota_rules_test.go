package lifecycle

import (
	"strings"
	"testing"

	"github.com/torpor-dev/torpor"
)

// The quota rule, case by case: a change is refused only when it grows a
// limited dimension past its limit, and the refusal names the quota, the
// limit and what the tenant holds.
func TestCheckQuota(t *testing.T) {
	full := func(n int64, vcpus, mem float64, disk int64) torpor.QuotaUsage {
		return torpor.QuotaUsage{Sandboxes: n, VCPUs: vcpus, MemoryMiB: mem, DiskMiB: disk}
	}
	one := full(1, 1, 512, 2048)
	none := torpor.QuotaUsage{}
	hibernated := full(1, 0, 0, 2048)
	halfPaused := full(1, 0.5, 256, 2048)
	cases := []struct {
		name            string
		limit           torpor.Quota
		used, old, want torpor.QuotaUsage
		refused         bool
		mentions        []string
	}{
		{"no quota", torpor.Quota{}, full(100, 100, 1e6, 1e6), none, one, false, nil},
		{"create under every limit", torpor.Quota{MaxSandboxes: 2, MaxVCPUs: 2, MaxMemoryMiB: 1024, MaxDiskMiB: 4096}, one, none, one, false, nil},
		{"create takes the last slot exactly", torpor.Quota{MaxSandboxes: 2}, one, none, one, false, nil},
		{"create past max_sandboxes", torpor.Quota{MaxSandboxes: 2}, full(2, 2, 1024, 4096), none, one, true,
			[]string{`tenant "acme"`, "max_sandboxes", "is 2 sandboxes", "has 2"}},
		{"create past max_vcpus", torpor.Quota{MaxVCPUs: 1.5}, one, none, one, true,
			[]string{"max_vcpus", "1.5 vCPUs", "hold 1 ", "needs 1 more"}},
		{"create past max_memory_mib", torpor.Quota{MaxMemoryMiB: 1000}, one, none, one, true,
			[]string{"max_memory_mib", "1000 MiB", "hold 512 MiB", "needs 512 MiB more"}},
		{"create past max_disk_mib", torpor.Quota{MaxDiskMiB: 4000}, one, none, one, true,
			[]string{"max_disk_mib", "4000 MiB", "hold 2048 MiB", "needs 2048 MiB more"}},
		// A start of a hibernated sandbox takes vCPUs and memory again,
		// but no new slot and no new disk.
		{"start of a hibernated one at max_sandboxes", torpor.Quota{MaxSandboxes: 1, MaxDiskMiB: 2048}, hibernated, hibernated, one, false, nil},
		{"start of a hibernated one past max_vcpus", torpor.Quota{MaxVCPUs: 1}, full(2, 1, 512, 4096), hibernated, one, true,
			[]string{"max_vcpus", "is 1 vCPUs", "hold 1 ", "needs 1 more"}},
		// A sandbox paused by freeze that gave half back takes that half
		// on resume.
		{"resume that fits", torpor.Quota{MaxVCPUs: 1}, halfPaused, halfPaused, one, false, nil},
		{"resume past max_memory_mib", torpor.Quota{MaxMemoryMiB: 700}, full(2, 1.5, 768, 4096), halfPaused, one, true,
			[]string{"max_memory_mib", "hold 768 MiB", "needs 256 MiB more"}},
		// A quota lowered below what the tenant holds refuses only what
		// grows: a restart (same charge), a pause, a delete go through.
		{"restart over a lowered quota", torpor.Quota{MaxSandboxes: 1, MaxVCPUs: 1}, full(3, 3, 1536, 6144), one, one, false, nil},
		{"pause over a lowered quota", torpor.Quota{MaxVCPUs: 1}, full(3, 3, 1536, 6144), one, halfPaused, false, nil},
		{"delete over a lowered quota", torpor.Quota{MaxSandboxes: 1}, full(3, 3, 1536, 6144), one, none, false, nil},
		{"rounding of fractional vCPUs", torpor.Quota{MaxVCPUs: 0.3}, full(2, 0.2, 0, 0), none, full(1, 0.1, 0, 0), false, nil},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			err := checkQuota("acme", c.limit, c.used, c.old, c.want)
			if !c.refused {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			te, ok := err.(*torpor.Error)
			if !ok || te.Code != torpor.EForbidden || te.Reason != torpor.ReasonQuota {
				t.Fatalf("got %v, want forbidden with reason quota", err)
			}
			for _, m := range c.mentions {
				if !strings.Contains(te.Message, m) {
					t.Errorf("message %q does not say %q", te.Message, m)
				}
			}
		})
	}
}

// The per-tenant sums follow what each sandbox holds, move with a
// sandbox's changes, never mix tenants, and drop a tenant that holds
// nothing.
func TestQuotaSums(t *testing.T) {
	q := newQuotas()
	a := torpor.QuotaUsage{Sandboxes: 1, VCPUs: 1, MemoryMiB: 512, DiskMiB: 100}
	q.set("sb1", "acme", a)
	q.set("sb2", "acme", a)
	q.set("sb3", "globex", a)
	if got := q.usage("acme"); got != (torpor.QuotaUsage{Sandboxes: 2, VCPUs: 2, MemoryMiB: 1024, DiskMiB: 200}) {
		t.Fatalf("acme holds %+v", got)
	}
	q.set("sb1", "acme", torpor.QuotaUsage{Sandboxes: 1, DiskMiB: 100}) // hibernated
	if got := q.usage("acme"); got != (torpor.QuotaUsage{Sandboxes: 2, VCPUs: 1, MemoryMiB: 512, DiskMiB: 200}) {
		t.Fatalf("acme after a hibernation holds %+v", got)
	}
	undo, err := q.admit("sb1", "acme", torpor.Quota{MaxVCPUs: 2}, a)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := q.admit("sb4", "acme", torpor.Quota{MaxVCPUs: 2}, a); err == nil {
		t.Fatal("a reservation did not count against the next admission")
	}
	undo()
	if got := q.usage("acme"); got.VCPUs != 1 || got.Sandboxes != 2 {
		t.Fatalf("after undo acme holds %+v", got)
	}
	q.set("sb1", "acme", torpor.QuotaUsage{})
	q.set("sb2", "acme", torpor.QuotaUsage{})
	if got, n := q.usage("acme"), len(q.used); got != (torpor.QuotaUsage{}) || n != 1 {
		t.Fatalf("acme without sandboxes holds %+v; %d tenants kept", got, n)
	}
	if got := q.usage("globex"); got != a {
		t.Fatalf("globex holds %+v", got)
	}
}
