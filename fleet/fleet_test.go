package fleet_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/clocktest"
	"github.com/torpor-dev/torpor/fleet"
)

var secret = fleet.Secret("0123456789abcdef0123456789abcdef")

func newFleet(t testing.TB, self string, clock torpor.Clock) *fleet.Fleet {
	t.Helper()
	f, err := fleet.New(fleet.Config{Self: self, Secret: secret, Clock: clock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.Close)
	return f
}

func TestShortSecretRefused(t *testing.T) {
	_, err := fleet.New(fleet.Config{Self: "a", Secret: fleet.Secret("too short")})
	if err == nil || !strings.Contains(err.Error(), "at least 32") {
		t.Fatalf("a 9-byte secret: %v", err)
	}
}

// verified is what the receiving node's Verify said, and the fleet
// headers left on the request after it.
type verified struct {
	id   fleet.Identity
	ok   bool
	err  error
	left bool
}

// receiver is a node that verifies every request and tells what it found.
func receiver(t testing.TB, f *fleet.Fleet) (*httptest.Server, chan verified) {
	got := make(chan verified, 16)
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, ok, err := f.Verify(r)
		got <- verified{id: id, ok: ok, err: err, left: fleet.Present(r.Header)}
	}))
	t.Cleanup(hs.Close)
	return hs, got
}

func TestSignatureRoundTripAndRefusals(t *testing.T) {
	clock := clocktest.New(time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC))
	a, b := newFleet(t, "a", clock), newFleet(t, "b", clock)
	hs, got := receiver(t, b)
	who := fleet.Identity{Tenant: "acme", KeyID: "key_1", Tier: "pro", Admin: true}
	send := func(t *testing.T, r *http.Request) verified {
		t.Helper()
		resp, err := http.DefaultClient.Do(r)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return <-got
	}
	// An escaped path and a query: what is signed is what travels.
	uri := "/v1/sandboxes/sb_1/files?path=%2Fa%20b%2Fc&x=1&x=2"
	signed := func() *http.Request {
		r, _ := http.NewRequest("POST", hs.URL+uri, strings.NewReader("{}"))
		r.Header.Set("X-Forwarded-For", "203.0.113.9")
		a.Sign(r, who)
		return r
	}

	t.Run("round trip", func(t *testing.T) {
		v := send(t, signed())
		want := who
		want.Node = "a"
		if v.err != nil || !v.ok || v.id != want || v.left {
			t.Fatalf("got %+v, want %+v verified and the headers gone", v, want)
		}
	})
	t.Run("absent", func(t *testing.T) {
		r, _ := http.NewRequest("GET", hs.URL+uri, nil)
		if v := send(t, r); v.err != nil || v.ok || v.id != (fleet.Identity{}) {
			t.Fatalf("an unsigned request: %+v", v)
		}
	})
	refused := map[string]func(r *http.Request){
		"another identity":   func(r *http.Request) { r.Header.Set(fleet.HeaderIdentity, "admin=true&key=&tenant=default&tier=") },
		"another node":       func(r *http.Request) { r.Header.Set(fleet.HeaderNode, "c") },
		"another method":     func(r *http.Request) { r.Method = "DELETE" },
		"another path":       func(r *http.Request) { r.URL.Path = "/v1/sandboxes/sb_2/files" },
		"another query":      func(r *http.Request) { r.URL.RawQuery = "path=/etc" },
		"another host":       func(r *http.Request) { r.Host = "elsewhere:1" },
		"another client":     func(r *http.Request) { r.Header.Set("X-Forwarded-For", "198.51.100.1") },
		"another time":       func(r *http.Request) { r.Header.Set(fleet.HeaderTime, fmt.Sprint(clock.Now().Unix()+1)) },
		"no signature":       func(r *http.Request) { r.Header.Del(fleet.HeaderSignature) },
		"only a node header": func(r *http.Request) { r.Header = http.Header{fleet.HeaderNode: {"a"}} },
	}
	for name, tamper := range refused {
		t.Run(name, func(t *testing.T) {
			r := signed()
			tamper(r)
			v := send(t, r)
			if v.ok || !torpor.IsCode(v.err, torpor.EUnauthenticated) || v.left {
				t.Fatalf("got %+v, want unauthenticated and the headers gone", v)
			}
		})
	}
	t.Run("another secret", func(t *testing.T) {
		other, _ := fleet.New(fleet.Config{Self: "a", Secret: fleet.Secret(strings.Repeat("x", 32)), Clock: clock})
		r, _ := http.NewRequest("GET", hs.URL+uri, nil)
		other.Sign(r, who)
		if v := send(t, r); v.ok || !torpor.IsCode(v.err, torpor.EUnauthenticated) {
			t.Fatalf("signed with another secret: %+v", v)
		}
	})
	t.Run("signed as the receiver", func(t *testing.T) {
		r, _ := http.NewRequest("GET", hs.URL+uri, nil)
		b.Sign(r, who)
		if v := send(t, r); v.ok || v.err == nil {
			t.Fatalf("a request signed as the receiving node: %+v", v)
		}
	})
	t.Run("skew", func(t *testing.T) {
		r := signed()
		clock.Advance(fleet.MaxSkew - time.Second)
		if v := send(t, r); !v.ok {
			t.Fatalf("59 s old: %+v", v)
		}
		r = signed()
		clock.Advance(fleet.MaxSkew + time.Second)
		if v := send(t, r); v.ok || !strings.Contains(fmt.Sprint(v.err), "clock") {
			t.Fatalf("61 s old: %+v", v)
		}
		clock.Advance(-2 * (fleet.MaxSkew + time.Second))
		if v := send(t, signed()); !v.ok {
			t.Fatalf("fresh: %+v", v)
		}
		r = signed()
		clock.Advance(-fleet.MaxSkew - time.Second)
		if v := send(t, r); v.ok {
			t.Fatalf("61 s in the future: %+v", v)
		}
	})
	t.Run("no fleet here", func(t *testing.T) {
		var none *fleet.Fleet
		r := httptest.NewRequest("GET", uri, nil)
		r.Header.Set(fleet.HeaderNode, "a")
		if _, ok, err := none.Verify(r); ok || err == nil || fleet.Present(r.Header) {
			t.Fatalf("fleet headers at a node in no fleet: ok %v err %v", ok, err)
		}
		r = httptest.NewRequest("GET", uri, nil)
		if _, ok, err := none.Verify(r); ok || err != nil {
			t.Fatalf("a plain request at a node in no fleet: ok %v err %v", ok, err)
		}
	})
}

// nodes is a front node whose handler forwards every request to owner
// (its API or proxy, per target) and the owner, whose handler is h after
// Verify: it sees the identity in X-Seen-*.
type nodes struct {
	front, owner *httptest.Server
	frontFleet   *fleet.Fleet
}

func newNodes(t *testing.T, target fleet.Target, who fleet.Identity, h http.HandlerFunc) *nodes {
	t.Helper()
	n := &nodes{frontFleet: newFleet(t, "front", nil)}
	ownerFleet := newFleet(t, "owner", nil)
	n.owner = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, ok, err := ownerFleet.Verify(r)
		if err != nil || !ok {
			http.Error(w, fmt.Sprintf("not from the fleet: %v", err), http.StatusUnauthorized)
			return
		}
		w.Header().Set("X-Seen-Tenant", id.Tenant)
		w.Header().Set("X-Seen-Node", id.Node)
		h(w, r)
	}))
	t.Cleanup(n.owner.Close)
	node := torpor.Node{Name: "owner", Address: n.owner.Listener.Addr().String(), ProxyAddress: n.owner.Listener.Addr().String()}
	n.front = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := n.frontFleet.Forward(w, r, node, target, who); err != nil {
			e := torpor.AsError(err)
			w.Header().Set("Retry-After", fmt.Sprint(int(e.RetryAfter/time.Second)))
			http.Error(w, string(e.Code)+": "+e.Message, http.StatusServiceUnavailable)
		}
	}))
	t.Cleanup(n.front.Close)
	return n
}

func TestForwardCredentialsAndHeaders(t *testing.T) {
	echo := func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "%s %s host=%s auth=%q xkey=%q cookie=%q token=%q xff=%q", r.Method, r.RequestURI, r.Host,
			r.Header.Get("Authorization"), r.Header.Get("X-Api-Key"), r.Header.Get("Cookie"), r.Header.Get("X-Access-Token"), r.Header.Get("X-Forwarded-For"))
	}
	send := func(t *testing.T, n *nodes) (*http.Response, string) {
		req, _ := http.NewRequest("GET", n.front.URL+"/sandboxes/sb_1/x?a=%2F", nil)
		req.Host = "49983-sb_1.sb.test"
		req.Header.Set("Authorization", "Bearer tk_user")
		req.Header.Set("X-API-Key", "tk_user")
		req.Header.Set("Cookie", "torpor_session=s")
		req.Header.Set("X-Access-Token", "at_sandbox")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp, string(b)
	}
	t.Run("api", func(t *testing.T) {
		n := newNodes(t, fleet.API, fleet.Identity{Tenant: "acme"}, echo)
		resp, body := send(t, n)
		want := fmt.Sprintf(`GET /sandboxes/sb_1/x?a=%%2F host=%s auth="" xkey="" cookie="" token="at_sandbox" xff="127.0.0.1"`, n.owner.Listener.Addr())
		if resp.StatusCode != 200 || body != want || resp.Header.Get("X-Seen-Tenant") != "acme" || resp.Header.Get("X-Seen-Node") != "front" {
			t.Fatalf("got %d %q (%v), want %q for acme from front", resp.StatusCode, body, resp.Header, want)
		}
	})
	t.Run("proxy", func(t *testing.T) {
		n := newNodes(t, fleet.Proxy, fleet.Identity{}, echo)
		resp, body := send(t, n)
		want := `GET /sandboxes/sb_1/x?a=%2F host=49983-sb_1.sb.test auth="Bearer tk_user" xkey="tk_user" cookie="torpor_session=s" token="at_sandbox" xff="127.0.0.1"`
		if resp.StatusCode != 200 || body != want || resp.Header.Get("X-Seen-Tenant") != "" {
			t.Fatalf("got %d %q, want %q", resp.StatusCode, body, want)
		}
	})
}

func TestForwardStreams(t *testing.T) {
	release := make(chan struct{})
	n := newNodes(t, fleet.API, fleet.Identity{Tenant: "acme"}, func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/events" {
			w.Header().Set("Content-Type", "text/event-stream")
		}
		body, _ := io.ReadAll(r.Body)
		fmt.Fprintf(w, "first %s\n", body)
		http.NewResponseController(w).Flush()
		<-release
		io.WriteString(w, "second\n")
	})
	for _, path := range []string{"/exec", "/events"} {
		t.Run(path, func(t *testing.T) {
			// A chunked request body goes through too.
			resp, err := http.Post(n.front.URL+path, "text/plain", io.MultiReader(strings.NewReader("chunked"), strings.NewReader(" body")))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			br := bufio.NewReader(resp.Body)
			done := make(chan string, 1)
			go func() {
				line, _ := br.ReadString('\n')
				done <- line
			}()
			select {
			case line := <-done:
				if line != "first chunked body\n" {
					t.Fatalf("first line %q", line)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the first piece did not arrive before the owner ended its answer")
			}
			release <- struct{}{}
			if rest, _ := io.ReadAll(br); string(rest) != "second\n" {
				t.Fatalf("the rest: %q", rest)
			}
		})
	}
}

func TestForwardUpgrade(t *testing.T) {
	n := newNodes(t, fleet.Proxy, fleet.Identity{}, func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Upgrade") != "echo" {
			http.Error(w, "upgrade to echo", 400)
			return
		}
		conn, brw, _ := http.NewResponseController(w).Hijack()
		defer conn.Close()
		brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
		brw.Flush()
		io.Copy(conn, brw)
	})
	c, err := net.Dial("tcp", n.front.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	io.WriteString(c, "GET /ws HTTP/1.1\r\nHost: 8080-sb_1.sb.test\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	for _, msg := range []string{"ping\n", "pong\n"} {
		io.WriteString(c, msg)
		if got, err := br.ReadString('\n'); got != msg {
			t.Fatalf("echo of %q: %q %v", msg, got, err)
		}
	}
}

func TestForwardConnect(t *testing.T) {
	var mu sync.Mutex
	var seen []string
	n := newNodes(t, fleet.Proxy, fleet.Identity{}, func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		seen = append(seen, r.Method+" "+r.RequestURI+" "+r.Header.Get("Proxy-Authorization"))
		mu.Unlock()
		if r.Header.Get("Proxy-Authorization") == "" {
			w.Header().Set("Proxy-Authenticate", "Basic")
			http.Error(w, "token please", http.StatusProxyAuthRequired)
			return
		}
		conn, brw, _ := http.NewResponseController(w).Hijack()
		defer conn.Close()
		brw.WriteString("HTTP/1.1 200 Connection established\r\n\r\nhello\n")
		brw.Flush()
		io.Copy(conn, brw)
	})
	dial := func(t *testing.T, auth string) (net.Conn, *bufio.Reader, *http.Response) {
		c, err := net.Dial("tcp", n.front.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		c.SetDeadline(time.Now().Add(5 * time.Second))
		fmt.Fprintf(c, "CONNECT sb_1:8082 HTTP/1.1\r\nHost: sb_1:8082\r\n%s\r\n", auth)
		br := bufio.NewReader(c)
		resp, err := http.ReadResponse(br, &http.Request{Method: "CONNECT"})
		if err != nil {
			t.Fatal(err)
		}
		return c, br, resp
	}
	if _, _, resp := dial(t, ""); resp.StatusCode != http.StatusProxyAuthRequired || resp.Header.Get("Proxy-Authenticate") == "" {
		t.Fatalf("without a token: %d %v", resp.StatusCode, resp.Header)
	}
	c, br, resp := dial(t, "Proxy-Authorization: Basic eDp0dA==\r\n")
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %d", resp.StatusCode)
	}
	if got, _ := br.ReadString('\n'); got != "hello\n" {
		t.Fatalf("what the owner sent with its answer: %q", got)
	}
	io.WriteString(c, "ping\n")
	if got, _ := br.ReadString('\n'); got != "ping\n" {
		t.Fatalf("echo: %q", got)
	}
	mu.Lock()
	defer mu.Unlock()
	if want := "CONNECT sb_1:8082 Basic eDp0dA=="; len(seen) != 2 || seen[1] != want {
		t.Fatalf("the owner saw %q, want then %q", seen, want)
	}
}

func TestForwardOwnerDown(t *testing.T) {
	front := newFleet(t, "front", nil)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	for _, target := range []fleet.Target{fleet.API, fleet.Proxy} {
		for _, method := range []string{"GET", "CONNECT"} {
			w := httptest.NewRecorder()
			r := httptest.NewRequest(method, "/v1/sandboxes/sb_1", nil)
			err := front.Forward(w, r, torpor.Node{Name: "owner", Address: addr, ProxyAddress: addr}, target, fleet.Identity{Tenant: "acme"})
			e := torpor.AsError(err)
			if e.Code != torpor.EUnavailable || e.RetryAfter != time.Second || !strings.Contains(e.Message, "owner") || w.Body.Len() != 0 {
				t.Fatalf("%s %s to a node that is down: %v (wrote %q)", target, method, err, w.Body)
			}
		}
	}
	// A node without a proxy address.
	err = front.Forward(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil), torpor.Node{Name: "owner", Address: addr}, fleet.Proxy, fleet.Identity{})
	if !torpor.IsCode(err, torpor.EUnavailable) {
		t.Fatalf("to a node without a proxy: %v", err)
	}
	// A client that went away is no unavailable node.
	cctx, cancel := context.WithCancel(context.Background())
	cancel()
	err = front.Forward(httptest.NewRecorder(), httptest.NewRequest("GET", "/", nil).WithContext(cctx), torpor.Node{Name: "owner", Address: addr}, fleet.API, fleet.Identity{})
	if err != context.Canceled {
		t.Fatalf("a client gone: %v", err)
	}
}
