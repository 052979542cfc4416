package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/torpor-dev/torpor"
)

// The tenants table shows each quota as use/limit, "-" for none, with
// sums of fractional vCPUs rounded to a hundredth.
func TestPrintTenants(t *testing.T) {
	var out bytes.Buffer
	c := &cli{stdout: &out}
	err := c.printTenants([]torpor.Tenant{
		{Name: "acme", Quota: torpor.Quota{MaxSandboxes: 10, MaxVCPUs: 8, MaxMemoryMiB: 16384, MaxDiskMiB: 102400},
			Usage: &torpor.QuotaUsage{Sandboxes: 3, VCPUs: 0.1 + 0.2, MemoryMiB: 1024, DiskMiB: 6144}},
		{Name: "default", Usage: &torpor.QuotaUsage{Sandboxes: 1, VCPUs: 1, MemoryMiB: 512, DiskMiB: 2048}},
		{Name: "new"},
	})
	if err != nil {
		t.Fatal(err)
	}
	want := `NAME     SANDBOXES  VCPUS  MEMORY MIB  DISK MIB
acme     3/10       0.3/8  1024/16384  6144/102400
default  1/-        1/-    512/-       2048/-
new      0/-        0/-    0/-         0/-
`
	if out.String() != want {
		t.Fatalf("got\n%s\nwant\n%s", out.String(), want)
	}
}

// tenants set without a quota flag sends nothing and says what to give.
func TestTenantsSetNeedsAFlag(t *testing.T) {
	var stdout, stderr bytes.Buffer
	code := Run(context.Background(), []string{"tenants", "set", "acme"}, strings.NewReader(""), &stdout, &stderr, func(string) string { return "" })
	if code != 1 || !strings.Contains(stderr.String(), "nothing to set: give --max-sandboxes") {
		t.Fatalf("exit %d, stderr %q", code, stderr.String())
	}
}
