package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/wire"
	"github.com/torpor-dev/torpor/client"
)

// TestAdminActsAsTenant drives ?tenant= through the real daemon and the
// real binary (docs/api.md, "Acting as a tenant"): `torpor ls` with an
// admin key lists its own tenant's sandboxes, --tenant NAME that tenant's
// and --all-tenants every tenant's with a TENANT column, never a warm
// pool's member; an admin reads and pauses a tenant's sandbox and reads
// every tenant's events; a tenant key that names another tenant, or every
// tenant, is refused with 403; the pools' tenant is no tenant one may
// name.
func TestAdminActsAsTenant(t *testing.T) {
	needs(t)
	bin, dataDir := torporBin(t), t.TempDir()
	d := startDaemonArgs(t, bin, dataDir, []string{"--warm-pool", "base=1"})
	drainPools(t, d)
	admin := d.client(t)
	ctx := context.Background()
	waitPool(t, d, admin, "base", readyIs(1))

	acmeKey := strings.TrimSpace(d.ok("keys", "create", "--tenant", "acme"))
	acme, err := client.New("http://"+d.addr, acmeKey)
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := acme.Create(ctx, torpor.CreateRequest{Template: "base", Metadata: map[string]string{"team": "ml"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = acme.Delete(context.Background(), theirs.ID) })
	mine, err := admin.Create(ctx, torpor.CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	// The pool made a member again: there is one to hide.
	waitPool(t, d, admin, "base", readyIs(1))

	// The CLI.
	if out := d.ok("ls"); strings.Contains(out, theirs.ID) || !strings.Contains(out, mine.ID) || strings.Contains(out, "TENANT") {
		t.Fatalf("torpor ls with the admin key:\n%s", out)
	}
	if out := d.ok("ls", "--tenant", "acme"); !strings.Contains(out, theirs.ID) || strings.Contains(out, mine.ID) || !strings.Contains(out, "TENANT") {
		t.Fatalf("torpor ls --tenant acme:\n%s", out)
	}
	var all []torpor.Sandbox
	if err := json.Unmarshal([]byte(d.ok("ls", "--all-tenants", "--json")), &all); err != nil {
		t.Fatal(err)
	}
	tenants := map[string]string{}
	for _, sb := range all {
		tenants[sb.ID] = sb.Tenant
	}
	if len(tenants) != 2 || tenants[theirs.ID] != "acme" || tenants[mine.ID] != "default" {
		t.Fatalf("torpor ls --all-tenants lists %v, want %s (acme) and %s (default), no pool member", tenants, theirs.ID, mine.ID)
	}
	if out := d.ok("ls", "--all-tenants"); !strings.Contains(out, "TENANT") || !strings.Contains(out, "acme") {
		t.Fatalf("torpor ls --all-tenants:\n%s", out)
	}
	if _, errs, code := d.cli("ls", "--tenant", torpor.PoolTenant); code == 0 || !strings.Contains(errs, "tenant") {
		t.Fatalf("torpor ls --tenant %s: exit %d %s", torpor.PoolTenant, code, errs)
	}
	if _, errs, code := d.cli("ls", "--tenant", "acme", "--all-tenants"); code == 0 || !strings.Contains(errs, "all-tenants") {
		t.Fatalf("torpor ls with both --tenant and --all-tenants: exit %d %s", code, errs)
	}
	asAcme := []string{"TORPOR_API_KEY=" + acmeKey}
	if out, errs, code := d.cliEnv(asAcme, "ls", "--all-tenants"); code == 0 || strings.Contains(out+errs, mine.ID) || !strings.Contains(errs, "own tenant") {
		t.Fatalf("torpor ls --all-tenants with a tenant key: exit %d\n%s%s", code, out, errs)
	}
	if out, errs, code := d.cliEnv(asAcme, "ls", "--tenant", "default"); code == 0 || strings.Contains(out+errs, mine.ID) {
		t.Fatalf("torpor ls --tenant default with acme's key: exit %d\n%s%s", code, out, errs)
	}
	if out, errs, code := d.cliEnv(asAcme, "ls", "--tenant", "acme"); code != 0 || !strings.Contains(out, theirs.ID) || strings.Contains(out, mine.ID) {
		t.Fatalf("acme naming itself: exit %d\n%s%s", code, out, errs)
	}

	// The API: a tenant's sandbox, acted on by the admin as that tenant.
	call := func(key, method, path, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, "http://"+d.addr+path, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+key)
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(data)
	}
	if code, body := call(d.key, "GET", "/v1/sandboxes/"+theirs.ID, ""); code != 404 {
		t.Fatalf("the admin's own GET of acme's sandbox: %d %s", code, body)
	}
	if code, body := call(d.key, "POST", "/v1/sandboxes/"+theirs.ID+"/exec?tenant=acme", `{"cmd":["hostname"]}`); code != 200 || !strings.Contains(body, theirs.ID) {
		t.Fatalf("exec as acme: %d %s", code, body)
	}
	if code, body := call(d.key, "POST", "/v1/sandboxes/"+theirs.ID+"/pause?tenant=acme", ""); code != 200 || !strings.Contains(body, `"paused"`) {
		t.Fatalf("pause as acme: %d %s", code, body)
	}
	if got, err := acme.Get(ctx, theirs.ID); err != nil || got.State != torpor.StatePaused {
		t.Fatalf("acme sees its sandbox %+v %v, want paused by the admin", got, err)
	}
	code, body := call(d.key, "GET", "/v1/events?tenant=*", "")
	var evs wire.EventList
	if err := json.Unmarshal([]byte(body), &evs); code != 200 || err != nil {
		t.Fatalf("every tenant's events: %d %s", code, body)
	}
	of := map[string]bool{}
	for _, ev := range evs.Events {
		of[ev.Tenant] = true
	}
	if len(of) != 2 || !of["acme"] || !of["default"] {
		t.Fatalf("every tenant's events are of %v, want acme and default (no pool's)", of)
	}
	if code, body := call(acmeKey, "GET", "/v1/sandboxes/"+mine.ID+"?tenant=default", ""); code != 403 || strings.Contains(body, mine.ID) {
		t.Fatalf("acme naming default on the admin's sandbox: %d %s", code, body)
	}
	if code, body := call(d.key, "GET", "/v1/events?tenant="+torpor.PoolTenant, ""); code != 400 {
		t.Fatalf("the admin naming the pools' tenant: %d %s", code, body)
	}
}
