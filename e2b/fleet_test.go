package e2b_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/e2b"
	"github.com/torpor-dev/torpor/fleet"
	"github.com/torpor-dev/torpor/lifecycle"
	"github.com/torpor-dev/torpor/runtime/fake"
	"github.com/torpor-dev/torpor/store/sqlite"
)

// router stands for the engine's view of the fleet.
type router struct {
	mu     sync.Mutex
	owners map[string]torpor.Node
	place  *torpor.Node
	routed []string
	placed []torpor.CreateRequest
}

func (r *router) Route(_ context.Context, tenant, id string) (lifecycle.Route, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.routed = append(r.routed, tenant+" "+id)
	if n, ok := r.owners[id]; ok {
		return lifecycle.Route{Node: n}, nil
	}
	return lifecycle.Route{Local: true}, nil
}

func (r *router) PlaceCreate(_ context.Context, req torpor.CreateRequest) (lifecycle.Route, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.placed = append(r.placed, req)
	if r.place != nil {
		return lifecycle.Route{Node: *r.place}, nil
	}
	return lifecycle.Route{Local: true}, nil
}

func (r *router) own(id string, n torpor.Node) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.owners == nil {
		r.owners = map[string]torpor.Node{}
	}
	r.owners[id] = n
}

// e2bNode is a node of a fleet serving E2B's API, with its own store: its
// key of tenant acme is no key on the other nodes.
type e2bNode struct {
	url    string
	key    string
	eng    *lifecycle.Engine
	store  *sqlite.Store
	node   torpor.Node
	router *router
}

var fleetSecret = fleet.Secret("the-e2b-tests-fleet-secret-32-bytes")

func newE2BNode(t *testing.T, name string) *e2bNode {
	t.Helper()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "torpor.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	now := time.Now().UTC()
	if err := st.PutTemplate(ctx, torpor.Template{Name: "e2b-base", RootFS: "/x", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateTenant(ctx, torpor.Tenant{Name: "acme", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	secret, k := torpor.NewAPIKey("acme", false, now)
	if err := st.CreateAPIKey(ctx, k); err != nil {
		t.Fatal(err)
	}
	eng, err := lifecycle.New(lifecycle.Config{Store: st, Runtimes: []torpor.Runtime{fake.New(fake.NewHost())}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(eng.Close)
	if err := eng.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	fl, err := fleet.New(fleet.Config{Self: name, Secret: fleetSecret})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fl.Close)
	n := &e2bNode{key: secret, eng: eng, store: st, router: &router{}}
	hs := httptest.NewServer(e2b.New(e2b.Config{Engine: eng, Auth: st, TemplateStore: st, Templates: &names{}, Fleet: fl, Router: n.router}))
	t.Cleanup(hs.Close)
	n.url = hs.URL
	n.node = torpor.Node{Name: name, Address: hs.Listener.Addr().String()}
	return n
}

func (n *e2bNode) do(t *testing.T, method, path, body string) reply {
	t.Helper()
	req, _ := http.NewRequest(method, n.url+path, strings.NewReader(body))
	req.Header.Set("X-API-KEY", n.key)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: data}
}

func TestFleetControlPlaneForwardsToTheOwner(t *testing.T) {
	owner, front := newE2BNode(t, "b"), newE2BNode(t, "a")
	// A create placed on the owner is made there, from the body as it
	// came; the front asked with the request mapped to torpor's.
	front.router.place = &owner.node
	r := front.do(t, "POST", "/v2/sandboxes", `{"templateID":"base","timeout":120,"metadata":{"user":"ada"}}`)
	if r.status != http.StatusCreated {
		t.Fatalf("create through the front: %d %s", r.status, r.body)
	}
	var c created
	if err := json.Unmarshal(r.body, &c); err != nil {
		t.Fatal(err)
	}
	sb, err := owner.eng.Get(ctx, "acme", c.SandboxID)
	if err != nil || sb.Metadata["user"] != "ada" {
		t.Fatalf("the sandbox on the owner: %+v %v", sb, err)
	}
	if _, err := front.store.GetSandbox(ctx, c.SandboxID); err == nil {
		t.Fatal("the sandbox was made on the front too")
	}
	if p := front.router.placed; len(p) != 1 || p[0].Template != "e2b-base" || len(owner.router.placed) != 0 {
		t.Fatalf("placed: front %+v, owner %+v", p, owner.router.placed)
	}

	// The sandbox's routes go to the owner (the id with E2B's client
	// suffix too).
	front.router.own(c.SandboxID, owner.node)
	if r := front.do(t, "GET", "/sandboxes/"+c.SandboxID+"-"+c.ClientID, ""); r.status != 200 || !strings.Contains(string(r.body), c.SandboxID) {
		t.Fatalf("get through the front: %d %s", r.status, r.body)
	}
	if r := front.do(t, "POST", "/sandboxes/"+c.SandboxID+"/timeout", `{"timeout":600}`); r.status != http.StatusNoContent {
		t.Fatalf("timeout through the front: %d %s", r.status, r.body)
	}
	if r := front.do(t, "POST", "/sandboxes/"+c.SandboxID+"/pause", ""); r.status != http.StatusNoContent {
		t.Fatalf("pause through the front: %d %s", r.status, r.body)
	}
	if sb, _ := owner.eng.Get(ctx, "acme", c.SandboxID); sb.State != torpor.StatePaused {
		t.Fatalf("after a pause through the front: %s", sb.State)
	}
	if r := front.do(t, "POST", "/sandboxes/"+c.SandboxID+"/connect", `{"timeout":60}`); r.status != http.StatusCreated && r.status != http.StatusOK {
		t.Fatalf("connect through the front: %d %s", r.status, r.body)
	}
	if r := front.do(t, "DELETE", "/sandboxes/"+c.SandboxID, ""); r.status != http.StatusNoContent {
		t.Fatalf("kill through the front: %d %s", r.status, r.body)
	}

	// A key the front does not know is refused there.
	req, _ := http.NewRequest("GET", front.url+"/sandboxes/"+c.SandboxID, nil)
	req.Header.Set("X-API-KEY", "e2b_nosuchkey")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Fatalf("an unknown key: %d", resp.StatusCode)
	}
}

func TestFleetControlPlaneRefusals(t *testing.T) {
	owner, front := newE2BNode(t, "b"), newE2BNode(t, "a")
	r := owner.do(t, "POST", "/v2/sandboxes", `{"templateID":"base"}`)
	var c created
	json.Unmarshal(r.body, &c)

	// The owner down: 503 in E2B's shape, with Retry-After.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	front.router.own(c.SandboxID, torpor.Node{Name: "c", Address: ln.Addr().String()})
	ln.Close()
	r = front.do(t, "GET", "/sandboxes/"+c.SandboxID, "")
	var eb struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}
	json.Unmarshal(r.body, &eb)
	if r.status != 503 || r.header.Get("Retry-After") != "1" || eb.Code != 503 || !strings.Contains(eb.Message, "node c") {
		t.Fatalf("the owner down: %d %v %s", r.status, r.header, r.body)
	}

	// Forwarded once only: each node thinks the other owns it.
	front.router.own(c.SandboxID, owner.node)
	owner.router.own(c.SandboxID, front.node)
	n := len(front.router.routed)
	r = front.do(t, "GET", "/sandboxes/"+c.SandboxID, "")
	if r.status != 503 || !strings.Contains(string(r.body), "moved to node a") || len(front.router.routed) != n+1 {
		t.Fatalf("a forwarded request whose sandbox moved on: %d %s", r.status, r.body)
	}

	// Fleet headers a user sends are refused, not trusted.
	forger, _ := fleet.New(fleet.Config{Self: "a", Secret: fleet.Secret(strings.Repeat("w", 32))})
	req, _ := http.NewRequest("GET", owner.url+"/sandboxes/"+c.SandboxID, nil)
	req.Header.Set("X-API-KEY", owner.key)
	forger.Sign(req, fleet.Identity{Tenant: "acme"})
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Fatalf("forged fleet headers: %d", resp.StatusCode)
	}
}
