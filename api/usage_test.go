package api_test

import (
	"testing"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/client"
)

func TestUsageReportPerTenant(t *testing.T) {
	f := newFixture(t)
	mine, err := f.tenantCl.Create(ctx, torpor.CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.tenantCl.Pause(ctx, mine.ID, ""); err != nil {
		t.Fatal(err)
	}
	theirs, err := f.adminCl.Create(ctx, torpor.CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}

	rep, err := f.tenantCl.Usage(ctx, client.UsageQuery{GroupBy: torpor.GroupBySandbox})
	if err != nil {
		t.Fatal(err)
	}
	if len(rep.Groups) != 1 || rep.Groups[0].Key != mine.ID || rep.Total.RunningS <= 0 || rep.Currency != "USD" {
		t.Fatalf("acme's report: %+v", rep)
	}
	rows, err := f.tenantCl.Usage(ctx, client.UsageQuery{})
	if err != nil {
		t.Fatal(err)
	}
	// The running stretch is in the ledger; the frozen one is still open.
	var closed, open int
	for _, r := range rows.Rows {
		if r.SandboxID != mine.ID {
			t.Fatalf("acme sees a row of %s", r.SandboxID)
		}
		if r.Open {
			open++
			if r.Kind != torpor.UsageFrozen {
				t.Errorf("open row is %s, want frozen", r.Kind)
			}
		} else {
			closed++
		}
	}
	if closed != 1 || open != 1 {
		t.Errorf("%d ledger rows and %d open, want 1 and 1: %+v", closed, open, rows.Rows)
	}
	all, err := f.adminCl.Usage(ctx, client.UsageQuery{GroupBy: torpor.GroupByTenant})
	if err != nil {
		t.Fatal(err)
	}
	if len(all.Groups) != 2 || all.Groups[0].Key != "acme" || all.Groups[1].Key != theirs.Tenant {
		t.Errorf("admin's report by tenant: %+v", all.Groups)
	}

	cases := []struct {
		name, query, key string
		status           int
		param            string
	}{
		{"another tenant", "tenant=default", "acme", 403, ""},
		{"bad from", "from=yesterday", "acme", 400, "from"},
		{"to before from", "from=2026-02-01&to=2026-01-01", "acme", 400, "to"},
		{"bad group", "group_by=week", "acme", 400, "group_by"},
		{"bad sandbox", "sandbox=../x", "acme", 400, "sandbox"},
		{"bad limit", "limit=0", "acme", 400, "limit"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			key := map[string]string{"acme": f.acmeKey, "admin": f.admin}[c.key]
			status, eb := f.raw(t, "GET", "/v1/usage?"+c.query, key, "", "")
			if status != c.status || eb.Error.Param != c.param {
				t.Fatalf("got %d param %q, want %d %q", status, eb.Error.Param, c.status, c.param)
			}
		})
	}
}

func TestRuntimesAndIsolation(t *testing.T) {
	f := newFixture(t)
	rts, err := f.tenantCl.Runtimes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(rts) != 1 || rts[0].Kind != "fake" || rts[0].Isolation != torpor.IsolationContainer || !rts[0].Default ||
		len(rts[0].PauseModes) == 0 {
		t.Fatalf("runtimes: %+v", rts)
	}
	if _, err := f.tenantCl.Create(ctx, torpor.CreateRequest{Template: "base", Isolation: torpor.IsolationContainer}); err != nil {
		t.Fatalf("isolation container: %v", err)
	}
	status, eb := f.raw(t, "POST", "/v1/sandboxes", f.acmeKey, "application/json", `{"template":"base","isolation":"vm"}`)
	if status != 400 || eb.Error.Param != "isolation" {
		t.Errorf("isolation vm on a node without one: %d %+v", status, eb.Error)
	}
	status, eb = f.raw(t, "POST", "/v1/sandboxes", f.acmeKey, "application/json", `{"template":"base","isolation":"chroot"}`)
	if status != 400 || eb.Error.Param != "isolation" {
		t.Errorf("an unknown isolation: %d %+v", status, eb.Error)
	}
}
