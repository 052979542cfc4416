package lifecycle_test

import (
	"testing"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/lifecycle"
)

// Every tenant's view (an admin's) lists the sandboxes and events of every
// tenant, each with its tenant, and never a warm pool's member or event.
func TestAllTenantsHidesPool(t *testing.T) {
	e := newEnv(t, withPools(map[string]int{"base": 1}))
	e.waitReady("base", 1)
	if len(e.poolMembers()) != 1 {
		t.Fatalf("pool members %v, want one", e.poolMembers())
	}
	claimed := e.create(torpor.CreateRequest{}) // acme claims the member
	e.waitReady("base", 1)                      // and the pool makes another
	other, err := e.eng.Create(ctx, "globex", torpor.CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	e.waitReady("base", 1)

	list, err := e.eng.List(ctx, lifecycle.AllTenants, torpor.SandboxFilter{})
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, sb := range list {
		got[sb.ID] = sb.Tenant
	}
	if len(got) != 2 || got[claimed.ID] != "acme" || got[other.ID] != "globex" {
		t.Fatalf("every tenant's list = %v, want %s (acme) and %s (globex)", got, claimed.ID, other.ID)
	}

	if pool, err := e.eng.Events(ctx, torpor.PoolTenant, torpor.EventFilter{}); err != nil || len(pool) == 0 {
		t.Fatalf("the pool wrote no events (%v): the check below would be empty", err)
	}
	evs, err := e.eng.Events(ctx, lifecycle.AllTenants, torpor.EventFilter{})
	if err != nil {
		t.Fatal(err)
	}
	tenants := map[string]bool{}
	for _, ev := range evs {
		tenants[ev.Tenant] = true
	}
	if len(tenants) != 2 || !tenants["acme"] || !tenants["globex"] {
		t.Fatalf("every tenant's events come from tenants %v, want acme and globex", tenants)
	}

	// A sandbox's events are read as its tenant.
	if _, err := e.eng.Events(ctx, lifecycle.AllTenants, torpor.EventFilter{SandboxID: claimed.ID}); !torpor.IsCode(err, torpor.EInvalid) {
		t.Fatalf("every tenant's events of one sandbox: %v, want invalid", err)
	}
	// The empty tenant is no one: it sees nothing, not everything.
	if list, err := e.eng.List(ctx, "", torpor.SandboxFilter{}); err != nil || len(list) != 0 {
		t.Fatalf("the empty tenant lists %d sandboxes (%v)", len(list), err)
	}
	if evs, err := e.eng.Events(ctx, "", torpor.EventFilter{}); err != nil || len(evs) != 0 {
		t.Fatalf("the empty tenant reads %d events (%v)", len(evs), err)
	}
}
