package api_test

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api"
	"github.com/torpor-dev/torpor/api/ratelimit"
	"github.com/torpor-dev/torpor/api/wire"
	"github.com/torpor-dev/torpor/client"
	"github.com/torpor-dev/torpor/fleet"
	"github.com/torpor-dev/torpor/lifecycle"
)

var fleetSecret = fleet.Secret("fleet-secret-of-the-api-tests-32b")

// router stands for the engine's view of the fleet: the sandboxes that
// other nodes own, and where creates go.
type router struct {
	mu     sync.Mutex
	owners map[string]torpor.Node
	place  *torpor.Node
	routed []string // "tenant id" of each Route
	placed int
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

func (r *router) PlaceCreate(context.Context, torpor.CreateRequest) (lifecycle.Route, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.placed++
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

func (r *router) placedN() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.placed
}

func (r *router) routes() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.routed...)
}

// fleetNode is a fixture that is a node of a fleet.
type fleetNode struct {
	*fixture
	node   torpor.Node
	router *router
}

func newFleetNode(t *testing.T, name string, opts ...func(*api.Config)) *fleetNode {
	t.Helper()
	fl, err := fleet.New(fleet.Config{Self: name, Secret: fleetSecret})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fl.Close)
	n := &fleetNode{router: &router{}}
	n.fixture = newFixture(t, append([]func(*api.Config){func(c *api.Config) { c.Fleet, c.Router = fl, n.router }}, opts...)...)
	n.node = torpor.Node{Name: name, Address: strings.TrimPrefix(n.url, "http://")}
	return n
}

// send sends a request with a bearer key and returns its answer's status,
// Retry-After and error body.
func send(t *testing.T, method, url, key string, hdr http.Header) (int, string, wire.ErrorBody) {
	t.Helper()
	req, _ := http.NewRequest(method, url, nil)
	for k, v := range hdr {
		req.Header[k] = v
	}
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var eb wire.ErrorBody
	b, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(b, &eb)
	return resp.StatusCode, resp.Header.Get("Retry-After"), eb
}

func TestFleetForwardsToTheOwner(t *testing.T) {
	// The owner limits its keys hard: what the front forwards is limited
	// at the front, not again here.
	owner := newFleetNode(t, "b", func(c *api.Config) { c.RateLimit = ratelimit.New(ratelimit.Config{PerSecond: 0.001, Burst: 2}) })
	front := newFleetNode(t, "a")
	sb, err := owner.tenantCl.Create(ctx, torpor.CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	front.router.own(sb.ID, owner.node)

	// The front's key of tenant acme is no key at the owner, which
	// serves it for the identity the front signed.
	got, err := front.tenantCl.Get(ctx, sb.ID)
	if err != nil || got.ID != sb.ID {
		t.Fatalf("get through the front: %v %v", got, err)
	}
	res, err := front.tenantCl.Exec(ctx, sb.ID, client.ExecRequest{Cmd: []string{"echo", "hi"}})
	if err != nil || res.Stdout != "echo hi\n" || res.ExitCode != 3 {
		t.Fatalf("exec through the front: %+v %v", res, err)
	}
	if r := front.router.routes(); len(r) != 2 || r[0] != "acme "+sb.ID {
		t.Fatalf("the front routed %q", r)
	}
	// An admin acting as the tenant: routed as the tenant, and acting as
	// it at the owner too.
	if status, _, eb := send(t, "GET", front.url+"/v1/sandboxes/"+sb.ID+"?tenant=acme", front.admin, nil); status != 200 {
		t.Fatalf("admin acting as acme through the front: %d %+v", status, eb)
	}
	// Another tenant's key sees nothing, there as here.
	other, _ := front.adminCl.CreateKey(ctx, wire.KeyRequest{Tenant: "other"})
	if status, _, eb := send(t, "GET", front.url+"/v1/sandboxes/"+sb.ID, other.Key, nil); status != 404 {
		t.Fatalf("tenant other through the front: %d %+v", status, eb)
	}
	// A key the front does not know never reaches the owner.
	n := len(owner.router.routes())
	if status, _, _ := send(t, "GET", front.url+"/v1/sandboxes/"+sb.ID, "tk_nosuchkey", nil); status != 401 {
		t.Fatalf("an unknown key: %d", status)
	}
	if len(owner.router.routes()) != n {
		t.Fatal("a request with an unknown key was forwarded")
	}

	// The output of a streamed exec arrives as it is written.
	release := make(chan struct{})
	owner.host.ExecFunc = func(ctx context.Context, id string, req torpor.ExecRequest) (torpor.ExecResult, error) {
		io.WriteString(req.Stdout, "first\n")
		<-release
		io.WriteString(req.Stdout, "second\n")
		return torpor.ExecResult{}, nil
	}
	first := make(chan struct{})
	out := &firstWrite{first: first}
	done := make(chan error, 1)
	go func() {
		_, err := front.tenantCl.ExecStream(ctx, sb.ID, client.ExecRequest{Cmd: []string{"x"}}, out, io.Discard)
		done <- err
	}()
	select {
	case <-first:
	case <-time.After(5 * time.Second):
		t.Fatal("the streamed output did not arrive before the command ended")
	}
	close(release)
	if err := <-done; err != nil || out.String() != "first\nsecond\n" {
		t.Fatalf("streamed exec: %q %v", out.String(), err)
	}
}

// firstWrite is a writer that tells of its first write.
type firstWrite struct {
	mu    sync.Mutex
	b     strings.Builder
	first chan struct{}
	once  sync.Once
}

func (w *firstWrite) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.once.Do(func() { close(w.first) })
	return w.b.Write(p)
}

func (w *firstWrite) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.b.String()
}

func TestFleetCreatePlacedOnAnotherNode(t *testing.T) {
	owner, front := newFleetNode(t, "b"), newFleetNode(t, "a")
	front.router.place = &owner.node
	sb, err := front.tenantCl.Create(ctx, torpor.CreateRequest{Template: "base", Metadata: map[string]string{"team": "ml"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := owner.store.GetSandbox(ctx, sb.ID); err != nil {
		t.Fatalf("the sandbox is not on the node the create was placed on: %v", err)
	}
	if _, err := front.store.GetSandbox(ctx, sb.ID); err == nil {
		t.Fatal("the sandbox was made on the front node too")
	}
	if got, _ := owner.tenantCl.Get(ctx, sb.ID); got == nil || got.Metadata["team"] != "ml" {
		t.Fatalf("the body went as it came: %+v", got)
	}
	if owner.router.placedN() != 0 {
		t.Fatal("the owner placed a create the front had placed")
	}
	// A body that does not decode is refused where it came.
	status, eb := front.raw(t, "POST", "/v1/sandboxes", front.acmeKey, "application/json", `{"template":`)
	if status != 400 || eb.Error.Param != "body" {
		t.Fatalf("a broken body: %d %+v", status, eb)
	}
}

func TestFleetOwnerDownIsUnavailable(t *testing.T) {
	front := newFleetNode(t, "a")
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	down := torpor.Node{Name: "c", Address: ln.Addr().String()}
	ln.Close()
	front.router.own("sb_gone", down)
	front.router.place = &down
	status, retry, eb := send(t, "GET", front.url+"/v1/sandboxes/sb_gone", front.acmeKey, nil)
	if status != 503 || retry != "1" || eb.Error.Code != torpor.EUnavailable || !strings.Contains(eb.Error.Message, "node c") {
		t.Fatalf("a sandbox whose node is down: %d Retry-After %q %+v", status, retry, eb)
	}
	_, err = front.tenantCl.Create(ctx, torpor.CreateRequest{Template: "base"})
	if !torpor.IsCode(err, torpor.EUnavailable) {
		t.Fatalf("a create placed on a node that is down: %v", err)
	}
}

func TestFleetForwardedOnceOnly(t *testing.T) {
	owner, front := newFleetNode(t, "b"), newFleetNode(t, "a")
	sb, err := owner.tenantCl.Create(ctx, torpor.CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	// Each node thinks the other owns it (ownership moved as the request
	// came): the owner answers the forwarded request, and does not
	// forward it back.
	front.router.own(sb.ID, owner.node)
	owner.router.own(sb.ID, front.node)
	status, retry, eb := send(t, "GET", front.url+"/v1/sandboxes/"+sb.ID, front.acmeKey, nil)
	if status != 503 || retry != "1" || !strings.Contains(eb.Error.Message, "moved to node a") {
		t.Fatalf("a forwarded request whose sandbox moved on: %d %q %+v", status, retry, eb)
	}
	if r := front.router.routes(); len(r) != 1 {
		t.Fatalf("the request went round: the front routed %q", r)
	}
	// A create forwarded to a node is made there.
	owner.router.place = &front.node
	front.router.place = &owner.node
	placed := owner.router.placedN()
	if _, err := front.tenantCl.Create(ctx, torpor.CreateRequest{Template: "base"}); err != nil || owner.router.placedN() != placed {
		t.Fatalf("a forwarded create: %v (placed again %d times)", err, owner.router.placedN()-placed)
	}
}

func TestFleetHeadersFromUsersAreNotTrusted(t *testing.T) {
	owner := newFleetNode(t, "b")
	plain := newFixture(t) // no fleet
	sb, err := owner.tenantCl.Create(ctx, torpor.CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	forger, _ := fleet.New(fleet.Config{Self: "a", Secret: fleet.Secret(strings.Repeat("w", 32))})
	forged := func(f *fixture, path string) http.Header {
		req, _ := http.NewRequest("GET", f.url+path, nil)
		forger.Sign(req, fleet.Identity{Tenant: "default", Admin: true})
		return req.Header
	}
	// The tenants list is the admin's: a forged admin identity opens it
	// to no one, with a key or without.
	for _, c := range []struct {
		name string
		f    *fixture
		key  string
		hdr  http.Header
	}{
		{"forged, no key", owner.fixture, "", forged(owner.fixture, "/v1/tenants")},
		{"forged, a tenant key", owner.fixture, owner.acmeKey, forged(owner.fixture, "/v1/tenants")},
		{"unsigned identity", owner.fixture, owner.acmeKey, http.Header{fleet.HeaderIdentity: {"admin=true&tenant=default"}}},
		{"no fleet here", plain, plain.acmeKey, forged(plain, "/v1/tenants")},
	} {
		t.Run(c.name, func(t *testing.T) {
			status, _, eb := send(t, "GET", c.f.url+"/v1/tenants", c.key, c.hdr)
			if status != 401 || !strings.Contains(eb.Error.Message, "fleet signature") {
				t.Fatalf("got %d %+v, want 401", status, eb)
			}
		})
	}
	// Signed with the fleet's secret, an identity is trusted: what a
	// node's forward is.
	node, _ := fleet.New(fleet.Config{Self: "a", Secret: fleetSecret})
	req, _ := http.NewRequest("GET", owner.url+"/v1/sandboxes/"+sb.ID, nil)
	node.Sign(req, fleet.Identity{Tenant: "acme"})
	if status, _, eb := send(t, "GET", req.URL.String(), "", req.Header); status != 200 {
		t.Fatalf("a request signed by a node of the fleet: %d %+v", status, eb)
	}
	// ... but not one that acts for no tenant (the proxy's).
	req, _ = http.NewRequest("GET", owner.url+"/v1/sandboxes/"+sb.ID, nil)
	node.Sign(req, fleet.Identity{})
	if status, _, _ := send(t, "GET", req.URL.String(), "", req.Header); status != 401 {
		t.Fatalf("a signed request for no tenant: %d", status)
	}
}
