package api_test

import (
	"errors"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api"
	"github.com/torpor-dev/torpor/api/ratelimit"
	"github.com/torpor-dev/torpor/api/wire"
	"github.com/torpor-dev/torpor/client"
	"github.com/torpor-dev/torpor/clocktest"
)

// limited is a fixture whose tenant keys may send burst requests, then one
// a second, on clock.
func limited(t *testing.T, burst int) (*fixture, *clocktest.Clock) {
	clock := clocktest.New(time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC))
	lim := ratelimit.New(ratelimit.Config{PerSecond: 1, Burst: burst, Clock: clock})
	return newFixture(t, func(c *api.Config) { c.RateLimit = lim }), clock
}

// A tenant key past its burst is 429 rate_limited with Retry-After in
// whole seconds (rounded up), in the one error shape; the client reads it
// back. Another key has its own bucket, admin keys none, and the key is
// let through again once a token came back.
func TestRateLimitAnswers429(t *testing.T) {
	f, clock := limited(t, 3)
	for i := range 3 {
		if code, eb := f.raw(t, "GET", "/v1/sandboxes", f.acmeKey, "", ""); code != http.StatusOK {
			t.Fatalf("request %d within the burst: %d %+v", i+1, code, eb)
		}
	}
	req, _ := http.NewRequest("GET", f.url+"/v1/sandboxes", nil)
	req.Header.Set("Authorization", "Bearer "+f.acmeKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") != "1" {
		t.Fatalf("past the burst: %d Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
	code, eb := f.raw(t, "POST", "/v1/sandboxes", f.acmeKey, "application/json", `{"template":"base"}`)
	if code != http.StatusTooManyRequests || eb.Error.Code != torpor.ERateLimited || !strings.Contains(eb.Error.Message, "at most 1 a second, in bursts of up to 3") {
		t.Fatalf("a create past the rate: %d %+v", code, eb)
	}
	_, err = f.tenantCl.List(ctx, client.ListOptions{})
	var te *torpor.Error
	if !client.IsRateLimited(err) || !errors.As(err, &te) || te.RetryAfter != time.Second {
		t.Fatalf("the client's error: %#v", err)
	}
	for i := range 20 {
		if _, err := f.adminCl.List(ctx, client.ListOptions{}); err != nil {
			t.Fatalf("admin request %d: %v", i+1, err)
		}
	}
	other, err := f.adminCl.CreateKey(ctx, wire.KeyRequest{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	if code, eb := f.raw(t, "GET", "/v1/sandboxes", other.Key, "", ""); code != http.StatusOK {
		t.Fatalf("another key of the same tenant: %d %+v", code, eb)
	}
	clock.Advance(time.Second)
	if code, eb := f.raw(t, "GET", "/v1/sandboxes", f.acmeKey, "", ""); code != http.StatusOK {
		t.Fatalf("a second later: %d %+v", code, eb)
	}
	if code, _ := f.raw(t, "GET", "/v1/sandboxes", f.acmeKey, "", ""); code != http.StatusTooManyRequests {
		t.Fatalf("the second request of that second: %d, want 429", code)
	}
}

// A stream takes one token when it starts, however long it stays open.
func TestRateLimitCountsAStreamOnce(t *testing.T) {
	f, _ := limited(t, 2)
	req, _ := http.NewRequest("GET", f.url+"/v1/events", nil)
	req.Header.Set("Authorization", "Bearer "+f.acmeKey)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("stream: %d", resp.StatusCode)
	}
	// Events flow on the stream meanwhile (an admin key's, unlimited).
	for range 3 {
		if _, err := f.adminCl.Create(ctx, torpor.CreateRequest{Template: "base"}); err != nil {
			t.Fatal(err)
		}
	}
	if code, eb := f.raw(t, "GET", "/v1/sandboxes", f.acmeKey, "", ""); code != http.StatusOK {
		t.Fatalf("the second token while the stream is open: %d %+v", code, eb)
	}
	if code, _ := f.raw(t, "GET", "/v1/sandboxes", f.acmeKey, "", ""); code != http.StatusTooManyRequests {
		t.Fatalf("a third request: %d, want 429", code)
	}
}

// Quotas set through PATCH /v1/tenants/{name}: each one refuses the create
// (or start) that would pass it with 403 reason quota, naming the quota,
// its limit and what the tenant holds; the tenant object shows quota and
// use; a PATCH keeps the fields it does not name.
func TestTenantQuotasThroughTheAPI(t *testing.T) {
	f := newFixture(t)
	n := func(v int64) *int64 { return &v }
	v := func(f float64) *float64 { return &f }
	tn, err := f.adminCl.SetTenantQuota(ctx, "acme", wire.QuotaUpdate{MaxSandboxes: n(2), MaxVCPUs: v(1.5), MaxMemoryMiB: n(1024), MaxDiskMiB: n(4096)})
	if err != nil {
		t.Fatal(err)
	}
	if tn.Quota != (torpor.Quota{MaxSandboxes: 2, MaxVCPUs: 1.5, MaxMemoryMiB: 1024, MaxDiskMiB: 4096}) || tn.Usage == nil || *tn.Usage != (torpor.QuotaUsage{}) {
		t.Fatalf("PATCH answered %+v (usage %+v)", tn, tn.Usage)
	}
	res := func(vcpus float64, mem, disk int64) *torpor.Resources {
		return &torpor.Resources{VCPUs: vcpus, MemoryMiB: mem, DiskMiB: disk}
	}
	first, err := f.tenantCl.Create(ctx, torpor.CreateRequest{Template: "base", Resources: res(1, 512, 2048)})
	if err != nil {
		t.Fatal(err)
	}
	refused := func(what string, r *torpor.Resources, mentions ...string) {
		t.Helper()
		_, err := f.tenantCl.Create(ctx, torpor.CreateRequest{Template: "base", Resources: r})
		if !client.IsQuota(err) {
			t.Fatalf("%s: %v, want 403 reason quota", what, err)
		}
		for _, m := range mentions {
			if !strings.Contains(err.Error(), m) {
				t.Errorf("%s: %q does not say %q", what, err, m)
			}
		}
	}
	refused("past max_vcpus", res(1, 256, 1024), "max_vcpus is 1.5 vCPUs", "hold 1 and this needs 1 more")
	refused("past max_memory_mib", res(0.5, 1024, 1024), "max_memory_mib is 1024 MiB", "hold 512 MiB and this needs 1024 MiB more")
	refused("past max_disk_mib", res(0.5, 256, 4096), "max_disk_mib is 4096 MiB", "hold 2048 MiB of disk")
	if _, err := f.tenantCl.Create(ctx, torpor.CreateRequest{Template: "base", Resources: res(0.5, 256, 1024)}); err != nil {
		t.Fatalf("a create within every quota: %v", err)
	}
	refused("past max_sandboxes", res(0.1, 64, 64), "max_sandboxes is 2 sandboxes", "has 2")
	code, eb := f.raw(t, "POST", "/v1/sandboxes", f.acmeKey, "application/json", `{"template":"base"}`)
	if code != http.StatusForbidden || eb.Error.Code != torpor.EForbidden || eb.Error.Reason != torpor.ReasonQuota {
		t.Fatalf("the quota refusal on the wire: %d %+v", code, eb)
	}

	// A hibernated sandbox gives its vCPUs back; starting it takes them
	// again, which a lowered max_vcpus refuses. The other quotas stay.
	if _, err := f.tenantCl.Hibernate(ctx, first.ID); err != nil {
		t.Fatal(err)
	}
	if tn, err = f.adminCl.SetTenantQuota(ctx, "acme", wire.QuotaUpdate{MaxVCPUs: v(1)}); err != nil {
		t.Fatal(err)
	}
	if tn.Quota != (torpor.Quota{MaxSandboxes: 2, MaxVCPUs: 1, MaxMemoryMiB: 1024, MaxDiskMiB: 4096}) {
		t.Fatalf("a PATCH of max_vcpus changed the rest: %+v", tn.Quota)
	}
	if *tn.Usage != (torpor.QuotaUsage{Sandboxes: 2, VCPUs: 0.5, MemoryMiB: 256, DiskMiB: 3072}) {
		t.Fatalf("acme holds %+v", *tn.Usage)
	}
	if _, err := f.tenantCl.Start(ctx, first.ID); !client.IsQuota(err) || !strings.Contains(err.Error(), "max_vcpus is 1 vCPUs") {
		t.Fatalf("a start past max_vcpus: %v", err)
	}
	if sb, _ := f.tenantCl.Get(ctx, first.ID); sb.State != torpor.StateHibernated {
		t.Fatalf("a refused start left the sandbox %s", sb.State)
	}
	// 0 removes a limit.
	if _, err = f.adminCl.SetTenantQuota(ctx, "acme", wire.QuotaUpdate{MaxVCPUs: v(0)}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.tenantCl.Start(ctx, first.ID); err != nil {
		t.Fatalf("a start once max_vcpus is gone: %v", err)
	}
	ts, err := f.adminCl.Tenants(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, tn := range ts {
		if tn.Name == "acme" && (tn.Usage == nil || tn.Usage.VCPUs != 1.5 || tn.Quota.MaxVCPUs != 0) {
			t.Fatalf("GET /v1/tenants shows acme as %+v (usage %+v)", tn, tn.Usage)
		}
	}
}

// Bad quota requests are 4xx and change nothing.
func TestTenantQuotaRefusals(t *testing.T) {
	f := newFixture(t)
	cases := []struct {
		name, key, path, body string
		status                int
		param                 string
	}{
		{"a tenant key", f.acmeKey, "/v1/tenants/acme", `{"quota":{"max_sandboxes":100}}`, 403, ""},
		{"an unknown tenant", f.admin, "/v1/tenants/nobody", `{"quota":{"max_sandboxes":1}}`, 404, ""},
		{"a negative quota", f.admin, "/v1/tenants/acme", `{"quota":{"max_vcpus":-1}}`, 400, "quota.max_vcpus"},
		{"a fractional count", f.admin, "/v1/tenants/acme", `{"quota":{"max_sandboxes":1.5}}`, 400, "quota.max_sandboxes"},
		{"an unknown field", f.admin, "/v1/tenants/acme", `{"quota":{"max_gpus":1}}`, 400, ""},
		{"no body", f.admin, "/v1/tenants/acme", ``, 400, "body"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			ctype := "application/json"
			if c.body == "" {
				ctype = ""
			}
			code, eb := f.raw(t, "PATCH", c.path, c.key, ctype, c.body)
			if code != c.status || (c.param != "" && eb.Error.Param != c.param) {
				t.Fatalf("got %d %+v, want %d on %q", code, eb, c.status, c.param)
			}
		})
	}
	if tn, err := f.store.GetTenant(ctx, "acme"); err != nil || tn.Quota != (torpor.Quota{}) {
		t.Fatalf("refused PATCHes changed acme: %+v %v", tn, err)
	}
	// POST /v1/tenants takes a quota too, checked the same way.
	code, eb := f.raw(t, "POST", "/v1/tenants", f.admin, "application/json", `{"name":"globex","quota":{"max_disk_mib":-5}}`)
	if code != 400 || eb.Error.Param != "quota.max_disk_mib" {
		t.Fatalf("a create with a bad quota: %d %+v", code, eb)
	}
	if code, _ := f.raw(t, "POST", "/v1/tenants", f.admin, "application/json", `{"name":"globex","quota":{"max_sandboxes":3}}`); code != 201 {
		t.Fatalf("a create with a quota: %d", code)
	}
	if tn, err := f.store.GetTenant(ctx, "globex"); err != nil || tn.Quota != (torpor.Quota{MaxSandboxes: 3}) {
		t.Fatalf("globex: %+v %v", tn, err)
	}
}
