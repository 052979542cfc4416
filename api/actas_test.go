package api_test

import (
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/wire"
	"github.com/torpor-dev/torpor/client"
)

// getJSON sends a GET with key and decodes a 2xx answer into out.
func (f *fixture) getJSON(t *testing.T, key, path string, out any) int {
	t.Helper()
	req, _ := http.NewRequest("GET", f.url+path, nil)
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 == 2 && out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			t.Fatalf("GET %s: %v: %s", path, err, data)
		}
	}
	return resp.StatusCode
}

// An admin key names a tenant with ?tenant= on a sandbox's routes, the
// list and the events, and acts as that tenant; tenant=* lists and
// follows every tenant's. Without it the admin is its own tenant.
func TestAdminActsAsTenant(t *testing.T) {
	f := newFixture(t)
	sb, err := f.tenantCl.Create(ctx, torpor.CreateRequest{Template: "base", Metadata: map[string]string{"team": "ml"}})
	if err != nil {
		t.Fatal(err)
	}
	own, err := f.adminCl.Create(ctx, torpor.CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	ids := func(l wire.SandboxList) map[string]string {
		m := map[string]string{}
		for _, s := range l.Sandboxes {
			m[s.ID] = s.Tenant
		}
		return m
	}

	var l wire.SandboxList
	if f.getJSON(t, f.admin, "/v1/sandboxes", &l); len(l.Sandboxes) != 1 || l.Sandboxes[0].ID != own.ID {
		t.Fatalf("the admin's own list = %v, want only %s", ids(l), own.ID)
	}
	l = wire.SandboxList{}
	if f.getJSON(t, f.admin, "/v1/sandboxes?tenant=acme&metadata.team=ml", &l); len(l.Sandboxes) != 1 || l.Sandboxes[0].ID != sb.ID {
		t.Fatalf("acme's list for the admin = %v, want only %s", ids(l), sb.ID)
	}
	l = wire.SandboxList{}
	f.getJSON(t, f.admin, "/v1/sandboxes?tenant=*", &l)
	if m := ids(l); len(m) != 2 || m[sb.ID] != "acme" || m[own.ID] != "default" {
		t.Fatalf("every tenant's list = %v", m)
	}
	// The same through the client.
	if all, err := f.adminCl.List(ctx, client.ListOptions{Tenant: client.AllTenants}); err != nil || len(all) != 2 {
		t.Fatalf("client: every tenant's list: %d, %v", len(all), err)
	}
	if mine, err := f.tenantCl.List(ctx, client.ListOptions{Tenant: "acme"}); err != nil || len(mine) != 1 {
		t.Fatalf("client: a tenant naming itself: %d, %v", len(mine), err)
	}
	if _, err := f.tenantCl.List(ctx, client.ListOptions{Tenant: client.AllTenants}); !torpor.IsCode(err, torpor.EForbidden) {
		t.Fatalf("client: a tenant asking for every tenant: %v, want forbidden", err)
	}

	// A sandbox of acme, read and acted on by the admin as acme.
	var got torpor.Sandbox
	if code := f.getJSON(t, f.admin, "/v1/sandboxes/"+sb.ID, nil); code != 404 {
		t.Fatalf("the admin's own GET of acme's sandbox: %d, want 404", code)
	}
	if code := f.getJSON(t, f.admin, "/v1/sandboxes/"+sb.ID+"?tenant=acme", &got); code != 200 || got.Tenant != "acme" {
		t.Fatalf("GET as acme: %d %+v", code, got)
	}
	if code, eb := f.raw(t, "POST", "/v1/sandboxes/"+sb.ID+"/pause?tenant=acme", f.admin, "", ""); code != 200 {
		t.Fatalf("pause as acme: %d %+v", code, eb)
	}
	if code, eb := f.raw(t, "POST", "/v1/sandboxes/"+sb.ID+"/exec?tenant=acme", f.admin, "application/json", `{"cmd":["echo","hi"]}`); code != 200 {
		t.Fatalf("exec as acme: %d %+v", code, eb)
	}
	var evs wire.EventList
	if code := f.getJSON(t, f.admin, "/v1/sandboxes/"+sb.ID+"/events?tenant=acme", &evs); code != 200 || len(evs.Events) == 0 {
		t.Fatalf("a sandbox's events as acme: %d, %d events", code, len(evs.Events))
	}
	evs = wire.EventList{}
	f.getJSON(t, f.admin, "/v1/events?tenant=*", &evs)
	tenants := map[string]bool{}
	for _, ev := range evs.Events {
		tenants[ev.Tenant] = true
	}
	if len(tenants) != 2 || !tenants["acme"] || !tenants["default"] {
		t.Fatalf("every tenant's events are of %v", tenants)
	}

	for _, c := range []struct {
		name, key, method, path string
		code                    int
		param                   string
	}{
		{"the pools' tenant", f.admin, "GET", "/v1/sandboxes?tenant=" + torpor.PoolTenant, 400, "tenant"},
		{"the pools' tenant on a sandbox", f.admin, "GET", "/v1/sandboxes/" + sb.ID + "?tenant=" + torpor.PoolTenant, 400, "tenant"},
		{"not a tenant name", f.admin, "GET", "/v1/sandboxes?tenant=Not%20A%20Name", 400, "tenant"},
		{"two tenants", f.admin, "GET", "/v1/sandboxes?tenant=acme&tenant=default", 400, "tenant"},
		{"every tenant on one sandbox", f.admin, "GET", "/v1/sandboxes/" + sb.ID + "?tenant=*", 400, "tenant"},
		{"a route without tenant", f.admin, "GET", "/v1/webhooks?tenant=acme", 400, "tenant"},
		{"create takes no tenant", f.admin, "POST", "/v1/sandboxes?tenant=acme", 400, "tenant"},
		{"an unknown tenant has nothing", f.admin, "GET", "/v1/sandboxes/" + sb.ID + "?tenant=nobody", 404, "id"},
		{"a tenant naming another", f.acmeKey, "GET", "/v1/sandboxes?tenant=default", 403, ""},
		{"a tenant naming every tenant", f.acmeKey, "GET", "/v1/events?tenant=*", 403, ""},
		{"a tenant naming the admin's on its sandbox", f.acmeKey, "GET", "/v1/sandboxes/" + own.ID + "?tenant=default", 403, ""},
	} {
		body := ""
		if c.method == "POST" {
			body = `{"template":"base"}`
		}
		code, eb := f.raw(t, c.method, c.path, c.key, "application/json", body)
		if code != c.code || eb.Error.Param != c.param {
			t.Errorf("%s: %d %+v, want %d (param %q)", c.name, code, eb, c.code, c.param)
		}
		if strings.Contains(eb.Error.Message, own.ID) && !strings.Contains(c.path, own.ID) {
			t.Errorf("%s: the answer names the admin's sandbox: %s", c.name, eb.Error.Message)
		}
	}
}
