package api_test

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api"
	"github.com/torpor-dev/torpor/api/wire"
	"github.com/torpor-dev/torpor/client"
	"github.com/torpor-dev/torpor/lifecycle"
	"github.com/torpor-dev/torpor/runtime/fake"
	"github.com/torpor-dev/torpor/store/sqlite"
)

// The nodes routes are the admin's: a tenant key is refused with 403
// before anything is read, a node's addresses and capacity being the
// operator's business.
func TestNodesAreTheAdmins(t *testing.T) {
	f := newFixture(t)
	if _, err := f.tenantCl.Nodes(ctx); !torpor.IsCode(err, torpor.EForbidden) {
		t.Fatalf("a tenant key lists the nodes: %v", err)
	}
	if _, err := f.tenantCl.DrainNode(ctx, "any"); !torpor.IsCode(err, torpor.EForbidden) {
		t.Fatalf("a tenant key drains a node: %v", err)
	}
	if _, err := f.tenantCl.UndrainNode(ctx, "any"); !torpor.IsCode(err, torpor.EForbidden) {
		t.Fatalf("a tenant key undrains a node: %v", err)
	}
}

// newFleetFixture is newFixture whose engine is node "node-a" of a fleet
// on its SQLite store, lending 6 vCPUs and 3000 MiB.
func newFleetFixture(t *testing.T) *fixture {
	t.Helper()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "torpor.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	now := time.Now().UTC()
	if err := st.PutTemplate(ctx, torpor.Template{Name: "base", RootFS: "/x", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateTenant(ctx, torpor.Tenant{Name: "default", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	secret, k := torpor.NewAPIKey("default", true, now)
	if err := st.CreateAPIKey(ctx, k); err != nil {
		t.Fatal(err)
	}
	host := fake.NewHost()
	eng, err := lifecycle.New(lifecycle.Config{Store: st, Runtimes: []torpor.Runtime{fake.New(host)},
		Capacity: lifecycle.Capacity{VCPUs: 6, MemoryMiB: 3000},
		Fleet: &lifecycle.FleetConfig{Nodes: st, Self: torpor.Node{Name: "node-a", Address: "127.0.0.1:7070",
			Labels: map[string]string{"zone": "eu-1"}}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(eng.Close)
	if err := eng.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	srv := api.New(api.Config{Engine: eng, Auth: st, Templates: st, Webhooks: st, WebhookGuard: webhookGuard})
	srv.SetReady()
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	f := &fixture{url: hs.URL, admin: secret, store: st, host: host}
	f.adminCl, _ = client.New(hs.URL, secret)
	kc, err := f.adminCl.CreateKey(ctx, wire.KeyRequest{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	f.tenantCl, _ = client.New(hs.URL, kc.Key)
	f.acmeKey = kc.Key
	return f
}

// A server that is no node of a fleet lists no nodes, and has none to
// drain.
func TestNodesOutsideAFleet(t *testing.T) {
	f := newFixture(t)
	var list map[string]json.RawMessage
	if code := f.getJSON(t, f.admin, "/v1/nodes", &list); code != http.StatusOK {
		t.Fatalf("GET /v1/nodes: %d", code)
	}
	if string(list["nodes"]) != "[]" {
		t.Fatalf("GET /v1/nodes outside a fleet: %s", list["nodes"])
	}
	// The node is unknown (404), not the server unavailable (5xx).
	for _, drain := range []func(context.Context, string) (*wire.Node, error){f.adminCl.DrainNode, f.adminCl.UndrainNode} {
		if _, err := drain(ctx, "node-a"); !torpor.IsCode(err, torpor.ENotFound) {
			t.Fatalf("a drain or undrain outside a fleet: %v, want not_found", err)
		}
	}
}

// GET /v1/nodes lists the node that answers, up and marked self, with its
// address, labels, runtimes and capacity, what its sandboxes use, free =
// capacity - used, and its sandboxes counted by state; a sandbox shows the
// node that owns it.
func TestNodesList(t *testing.T) {
	f := newFleetFixture(t)
	sb, err := f.tenantCl.Create(ctx, torpor.CreateRequest{Template: "base", Resources: &torpor.Resources{VCPUs: 2, MemoryMiB: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := f.adminCl.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 1 {
		t.Fatalf("GET /v1/nodes of one node: %d nodes, want 1: %+v", len(nodes), nodes)
	}
	n := nodes[0]
	if n.Name != "node-a" || !n.Self || n.State != torpor.NodeUp || n.Address != "127.0.0.1:7070" || n.Labels["zone"] != "eu-1" ||
		len(n.Runtimes) == 0 || n.Epoch == 0 || n.JoinedAt.IsZero() || n.HeartbeatAt.IsZero() {
		t.Fatalf("the answering node: %+v", n)
	}
	if n.Capacity.VCPUs != 6 || n.Capacity.MemoryMiB != 3000 {
		t.Fatalf("capacity %+v, want 6 vCPUs and 3000 MiB", n.Capacity)
	}
	if n.Used.VCPUs != 2 || n.Used.MemoryMiB != 1000 || n.Free.VCPUs != 4 || n.Free.MemoryMiB != 2000 {
		t.Fatalf("used %+v, free %+v; want 2 vCPUs and 1000 MiB used of 6 and 3000", n.Used, n.Free)
	}
	if n.Sandboxes[torpor.StateRunning] != 1 {
		t.Fatalf("the node counts %v, want 1 running", n.Sandboxes)
	}
	got, err := f.tenantCl.Get(ctx, sb.ID)
	if err != nil || got.Node != n.Name || got.NodeEpoch != n.Epoch || got.Durability != torpor.DurabilityNode {
		t.Fatalf("the sandbox's node: %q epoch %d durability %q (%v), want %q epoch %d, node", got.Node, got.NodeEpoch, got.Durability, err, n.Name, n.Epoch)
	}
}

// Drain sets a node draining and undrain up again, each answering the
// node; with no object store the sandbox stays where it is.
func TestDrainAndUndrain(t *testing.T) {
	f := newFleetFixture(t)
	sb, err := f.tenantCl.Create(ctx, torpor.CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	n, err := f.adminCl.DrainNode(ctx, "node-a")
	if err != nil || n.Name != "node-a" || n.State != torpor.NodeDraining || !n.Self || n.Held() != 1 {
		t.Fatalf("drain: %+v %v", n, err)
	}
	if again, err := f.adminCl.DrainNode(ctx, "node-a"); err != nil || again.State != torpor.NodeDraining {
		t.Fatalf("a second drain: %+v %v", again, err)
	}
	if nodes, err := f.adminCl.Nodes(ctx); err != nil || len(nodes) != 1 || nodes[0].State != torpor.NodeDraining {
		t.Fatalf("the nodes of a draining fleet: %+v %v", nodes, err)
	}
	if got, err := f.tenantCl.Get(ctx, sb.ID); err != nil || got.State != torpor.StateRunning || got.Node != "node-a" {
		t.Fatalf("a sandbox of a node drained with no object store: %+v %v", got, err)
	}
	n, err = f.adminCl.UndrainNode(ctx, "node-a")
	if err != nil || n.State != torpor.NodeUp {
		t.Fatalf("undrain: %+v %v", n, err)
	}
}

// Free is capacity less used, never below 0 (a node may hold more than
// it lends for a while), and empty maps are {} rather than null.
func TestNewNodeFree(t *testing.T) {
	n := wire.NewNode(torpor.Node{Capacity: torpor.Resources{VCPUs: 4, MemoryMiB: 1024}, Used: torpor.Resources{VCPUs: 5, MemoryMiB: 256}}, false)
	if n.Free != (torpor.Resources{VCPUs: 0, MemoryMiB: 768}) {
		t.Fatalf("free %+v", n.Free)
	}
	b, _ := json.Marshal(n)
	for _, s := range []string{`"labels":{}`, `"runtimes":[]`, `"sandboxes":{}`, `"self":false`} {
		if !strings.Contains(string(b), s) {
			t.Errorf("%s lacks %s", b, s)
		}
	}
}

// A drain or undrain of a node the fleet does not have is 404, and
// changes nothing; a body other than an empty object is refused.
func TestDrainUnknownNode(t *testing.T) {
	f := newFleetFixture(t)
	for _, verb := range []string{"drain", "undrain"} {
		code, eb := f.raw(t, "POST", "/v1/nodes/no-such-node/"+verb, f.admin, "", "")
		if code != http.StatusNotFound || eb.Error.Code != torpor.ENotFound {
			t.Errorf("%s of an unknown node: %d %+v, want 404 not_found", verb, code, eb.Error)
		}
		if code, _ := f.raw(t, "POST", "/v1/nodes/no-such-node/"+verb, f.admin, "application/json", `{"x":1}`); code != http.StatusBadRequest {
			t.Errorf("%s with a body: %d, want 400", verb, code)
		}
	}
	nodes, err := f.adminCl.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if n.State != torpor.NodeUp {
			t.Fatalf("a refused drain changed node %s: %s", n.Name, n.State)
		}
	}
}

// node_labels are checked as the node labels of torpor serve are: a bad
// key or value, or more than 16 pairs, is 400 naming node_labels and
// creates nothing.
func TestCreateNodeLabels(t *testing.T) {
	f := newFixture(t)
	many := map[string]string{}
	for i := 0; i <= torpor.MaxNodeLabels; i++ {
		many[fmt.Sprintf("k%d", i)] = "v"
	}
	manyJSON, _ := json.Marshal(many)
	for _, body := range []string{
		`{"template":"base","node_labels":{"bad key":"x"}}`,
		`{"template":"base","node_labels":{"":"x"}}`,
		`{"template":"base","node_labels":{"-lead":"x"}}`,
		`{"template":"base","node_labels":{"zone":"a b"}}`,
		`{"template":"base","node_labels":{"zone":"` + strings.Repeat("a", 64) + `"}}`,
		`{"template":"base","node_labels":{"` + strings.Repeat("k", 64) + `":"a"}}`,
		`{"template":"base","node_labels":{"zone":1}}`,
		`{"template":"base","node_labels":["zone=a"]}`,
		`{"template":"base","node_labels":` + string(manyJSON) + `}`,
	} {
		code, eb := f.raw(t, "POST", "/v1/sandboxes", f.acmeKey, "application/json", body)
		if code != http.StatusBadRequest || eb.Error.Code != torpor.EInvalid || !strings.HasPrefix(eb.Error.Param, "node_labels") {
			t.Errorf("create with %s: %d %+v, want 400 invalid_argument naming node_labels", body, code, eb.Error)
		}
	}
	if sbs, _ := f.tenantCl.List(ctx, client.ListOptions{All: true}); len(sbs) != 0 {
		t.Fatalf("refused creates made %d sandboxes", len(sbs))
	}
	if err := torpor.ValidateNodeLabels("node_labels", map[string]string{"zone": "eu-1", "gpu": "", "team/x": "a.b_c"}); err != nil {
		t.Fatalf("valid node labels refused: %v", err)
	}
}
