package proxy_test

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/fleet"
	"github.com/torpor-dev/torpor/lifecycle"
	"github.com/torpor-dev/torpor/proxy"
)

var fleetSecret = fleet.Secret("the-proxy-tests-fleet-secret-32-bytes")

// router stands for the engine's view of the fleet: the sandboxes other
// nodes own.
type router struct {
	mu     sync.Mutex
	owners map[string]torpor.Node
	calls  int
}

func (r *router) Route(_ context.Context, tenant, id string) (lifecycle.Route, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	if n, ok := r.owners[id]; ok {
		return lifecycle.Route{Node: n}, nil
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

func (r *router) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls
}

// fleetProxies are two nodes' proxies: the owner's, whose engine has the
// sandboxes, and the front's, which forwards to it.
type fleetProxies struct {
	owner, front             *fixture
	ownerRouter, frontRouter *router
	ownerNode, frontNode     torpor.Node
}

func newFleetProxies(t *testing.T) *fleetProxies {
	t.Helper()
	fp := &fleetProxies{ownerRouter: &router{}, frontRouter: &router{}}
	node := func(name string, rt *router) func(*proxy.Config) {
		return func(c *proxy.Config) {
			fl, err := fleet.New(fleet.Config{Self: name, Secret: fleetSecret})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(fl.Close)
			c.Fleet, c.Router = fl, rt
			c.Services = map[int]proxy.Service{49983: echoService{}}
		}
	}
	fp.owner = newFixture(t, node("b", fp.ownerRouter))
	fp.front = newFixture(t, node("a", fp.frontRouter))
	fp.ownerNode = torpor.Node{Name: "b", Address: "127.0.0.1:1", ProxyAddress: fp.owner.proxy.Addr}
	fp.frontNode = torpor.Node{Name: "a", Address: "127.0.0.1:1", ProxyAddress: fp.front.proxy.Addr}
	return fp
}

// sandbox makes a sandbox on the owner that the front knows is there.
func (fp *fleetProxies) sandbox(t *testing.T, req torpor.CreateRequest) *torpor.Sandbox {
	sb := fp.owner.create(t, req)
	fp.frontRouter.own(sb.ID, fp.ownerNode)
	return sb
}

func TestFleetProxyForwardsToTheOwner(t *testing.T) {
	fp := newFleetProxies(t)
	f := fp.front
	sb := fp.sandbox(t, torpor.CreateRequest{})
	host := "8080-" + sb.ID + ".sb.test"
	tok := map[string]string{proxy.HeaderToken: sb.TrafficToken}
	// The front's own loop takes plain requests: one for another node's
	// sandbox goes on to that node, which checks the token.
	for _, c := range []struct {
		name, host, path string
		hdr              map[string]string
		status           int
		body             string
	}{
		{"with its token", host, "/a?b=1", tok, 200, "hello from " + host + "/a?b=1 token=\"\""},
		{"kept alive", host, "/again", tok, 200, "/again"},
		{"token in the query", host, "/q?torpor_token=" + sb.TrafficToken, nil, 200, "hello from " + host + "/q token"},
		{"by headers", "anything", "/h", map[string]string{proxy.HeaderSandboxID: sb.ID, proxy.HeaderSandboxPort: "8080", proxy.HeaderToken: sb.TrafficToken}, 200, "/h"},
		{"no token", host, "/", nil, 401, "private"},
		{"wrong token", host, "/", map[string]string{proxy.HeaderToken: "tt_nope"}, 403, "wrong traffic token"},
		{"the client's address", host, "/echo", tok, 200, `xff="127.0.0.1"`},
		{"a service port", "49983-" + sb.ID + ".sb.test", "/", map[string]string{"X-Access-Token": sb.TrafficToken}, 200, "service " + sb.ID + " running /"},
	} {
		t.Run(c.name, func(t *testing.T) {
			status, body := f.get(t, c.host, c.path, c.hdr)
			if status != c.status || !strings.Contains(body, c.body) {
				t.Fatalf("got %d %q, want %d containing %q", status, body, c.status, c.body)
			}
		})
	}
	if fp.front.hits.Load() != 0 {
		t.Fatal("the front's own sandbox server was reached")
	}

	t.Run("stream", func(t *testing.T) {
		req, _ := http.NewRequest("GET", f.proxy.URL+"/stream", nil)
		req.Host = host
		req.Header.Set(proxy.HeaderToken, sb.TrafficToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		br := bufio.NewReader(resp.Body)
		first := make(chan string, 1)
		go func() { l, _ := br.ReadString('\n'); first <- l }()
		select {
		case l := <-first:
			if l != "first\n" {
				t.Fatalf("first piece %q", l)
			}
		case <-time.After(5 * time.Second):
			t.Fatal("the stream's first piece did not come before its end")
		}
		fp.owner.release <- struct{}{}
		if rest, _ := io.ReadAll(br); string(rest) != "second\n" {
			t.Fatalf("the rest: %q", rest)
		}
	})

	t.Run("upgrade", func(t *testing.T) {
		conn, err := net.Dial("tcp", f.proxy.Addr)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(conn, "GET /ws HTTP/1.1\r\nHost: %s\r\n%s: %s\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n", host, proxy.HeaderToken, sb.TrafficToken)
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil || resp.StatusCode != 101 {
			t.Fatalf("upgrade: %v %v", resp, err)
		}
		fmt.Fprint(conn, "ping\n")
		if line, err := br.ReadString('\n'); line != "ping\n" {
			t.Fatalf("echo: %q %v", line, err)
		}
	})

	t.Run("connect", func(t *testing.T) {
		basic := "Proxy-Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte("x:"+sb.TrafficToken)) + "\r\n"
		for _, target := range []string{sb.ID + ":8082", "8082-" + sb.ID + ".sb.test:443"} {
			resp, conn, br := f.connect(t, target, basic)
			if resp.StatusCode != 200 {
				t.Fatalf("CONNECT %s: %d", target, resp.StatusCode)
			}
			fmt.Fprint(conn, "ping\n")
			if line, err := br.ReadString('\n'); line != "ping\n" {
				t.Fatalf("echo through the tunnel: %q %v", line, err)
			}
		}
		if resp, _, _ := f.connect(t, sb.ID+":8082"); resp.StatusCode != 407 || resp.Header.Get("Proxy-Authenticate") == "" {
			t.Fatalf("CONNECT without a token, at the owner: %d %v", resp.StatusCode, resp.Header)
		}
	})

	t.Run("h2c", func(t *testing.T) {
		sb := fp.sandbox(t, torpor.CreateRequest{Ports: []torpor.PortSpec{{Port: 8081, Public: true}}})
		tr := &http.Transport{Protocols: new(http.Protocols)}
		tr.Protocols.SetUnencryptedHTTP2(true)
		req, _ := http.NewRequest("GET", f.proxy.URL+"/x", nil)
		req.Host = "8081-" + sb.ID + ".sb.test"
		resp, err := (&http.Client{Transport: tr}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || string(b) != "proto=2" || resp.Trailer.Get("Grpc-Status") != "0" {
			t.Fatalf("h2c through the front: %d %q trailer %q", resp.StatusCode, b, resp.Trailer.Get("Grpc-Status"))
		}
	})

	t.Run("wakes at the owner", func(t *testing.T) {
		if _, err := fp.owner.eng.Pause(ctx, "acme", sb.ID, ""); err != nil {
			t.Fatal(err)
		}
		if status, body := f.get(t, host, "/w", tok); status != 200 || !strings.Contains(body, "/w") {
			t.Fatalf("a paused sandbox of another node: %d %q", status, body)
		}
		if got, _ := fp.owner.eng.Lookup(ctx, sb.ID); got.State != torpor.StateRunning {
			t.Fatalf("after the request: %s", got.State)
		}
	})
}

func TestFleetProxyRefusals(t *testing.T) {
	fp := newFleetProxies(t)
	sb := fp.sandbox(t, torpor.CreateRequest{})
	host := "8080-" + sb.ID + ".sb.test"

	t.Run("owner down", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		down := torpor.Node{Name: "c", ProxyAddress: ln.Addr().String()}
		ln.Close()
		fp.frontRouter.own(sb.ID, down)
		defer fp.frontRouter.own(sb.ID, fp.ownerNode)
		req, _ := http.NewRequest("GET", fp.front.proxy.URL+"/", nil)
		req.Host = host
		req.Header.Set(proxy.HeaderToken, sb.TrafficToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var eb struct {
			Error struct{ Code, Message string }
		}
		json.NewDecoder(resp.Body).Decode(&eb)
		resp.Body.Close()
		if resp.StatusCode != 503 || resp.Header.Get("Retry-After") != "1" || eb.Error.Code != "unavailable" || !strings.Contains(eb.Error.Message, "node c") {
			t.Fatalf("the owner down: %d %v %+v", resp.StatusCode, resp.Header, eb)
		}
		// envd's port answers in the shape of E2B's SDKs.
		status, body := fp.front.get(t, "49983-"+sb.ID+".sb.test", "/", map[string]string{"X-Access-Token": sb.TrafficToken})
		if status != 503 || !strings.Contains(body, `"code":503`) {
			t.Fatalf("a service port, the owner down: %d %q", status, body)
		}
		if resp, _, _ := fp.front.connect(t, sb.ID+":8082"); resp.StatusCode != 503 {
			t.Fatalf("CONNECT, the owner down: %d", resp.StatusCode)
		}
	})

	t.Run("forwarded once only", func(t *testing.T) {
		fp.ownerRouter.own(sb.ID, fp.frontNode)
		defer fp.ownerRouter.own(sb.ID, torpor.Node{})
		n := fp.frontRouter.count()
		// On a new connection, which the front's loop takes first.
		req, _ := http.NewRequest("GET", fp.front.proxy.URL+"/", nil)
		req.Host = host
		req.Header.Set(proxy.HeaderToken, sb.TrafficToken)
		resp, err := (&http.Client{Transport: &http.Transport{}}).Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 503 || !strings.Contains(string(body), "moved to node a") {
			t.Fatalf("a forwarded request whose sandbox moved on: %d %q", resp.StatusCode, body)
		}
		// The loop asked, and net/http's path asked again; the owner did
		// not send it back, which would have been a third.
		if got := fp.frontRouter.count() - n; got != 2 {
			t.Fatalf("the front routed it %d times", got)
		}
	})

	t.Run("fleet headers from a user", func(t *testing.T) {
		forger, _ := fleet.New(fleet.Config{Self: "a", Secret: fleet.Secret(strings.Repeat("w", 32))})
		req, _ := http.NewRequest("GET", fp.owner.proxy.URL+"/", nil)
		req.Host = host
		forger.Sign(req, fleet.Identity{})
		hdr := map[string]string{proxy.HeaderToken: sb.TrafficToken}
		for k, v := range req.Header {
			hdr[k] = v[0]
		}
		if status, body := fp.owner.get(t, host, "/", hdr); status != 401 || !strings.Contains(body, "fleet signature") {
			t.Fatalf("forged fleet headers: %d %q", status, body)
		}
		// At a proxy in no fleet, too: nothing trusts them, and they do
		// not reach the sandbox.
		plain := newFixture(t)
		sb := plain.create(t, torpor.CreateRequest{})
		if status, body := plain.get(t, "8080-"+sb.ID+".sb.test", "/", map[string]string{proxy.HeaderToken: sb.TrafficToken, fleet.HeaderNode: "a"}); status != 401 {
			t.Fatalf("fleet headers at a proxy in no fleet: %d %q", status, body)
		}
	})
}
