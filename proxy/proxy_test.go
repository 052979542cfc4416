package proxy_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/lifecycle"
	"github.com/torpor-dev/torpor/proxy"
	"github.com/torpor-dev/torpor/runtime/fake"
	"github.com/torpor-dev/torpor/store/sqlite"
)

type fixture struct {
	eng     *lifecycle.Engine
	host    *fake.Host
	proxy   *httptest.Server
	backend *httptest.Server
	hits    atomic.Int32
}

var ctx = context.Background()

// newFixture: a real engine over the fake runtime, whose sandboxes' port
// 8080 is an httptest server (a websocket-like echo on /ws).
func newFixture(t *testing.T) *fixture {
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "torpor.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	st.PutTemplate(ctx, torpor.Template{Name: "base", RootFS: "/x", CreatedAt: time.Now()})
	f := &fixture{host: fake.NewHost()}
	f.backend = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		f.hits.Add(1)
		if r.URL.Path == "/ws" {
			conn, brw, _ := http.NewResponseController(w).Hijack()
			defer conn.Close()
			brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nUpgrade: echo\r\nConnection: Upgrade\r\n\r\n")
			brw.Flush()
			io.Copy(conn, brw)
			return
		}
		fmt.Fprintf(w, "hello from %s%s token=%q", r.Host, r.URL.RequestURI(), r.Header.Get(proxy.HeaderToken))
	}))
	t.Cleanup(f.backend.Close)
	f.host.DialFunc = func(ctx context.Context, id, network, addr string) (net.Conn, error) {
		if addr != "127.0.0.1:8080" {
			return nil, fmt.Errorf("connection refused to %s", addr)
		}
		var d net.Dialer
		return d.DialContext(ctx, network, f.backend.Listener.Addr().String())
	}
	f.eng, err = lifecycle.New(lifecycle.Config{Store: st, Runtimes: []torpor.Runtime{fake.New(f.host)},
		Capacity: lifecycle.Capacity{VCPUs: 2, MemoryMiB: 2048}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.eng.Close)
	if err := f.eng.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	f.proxy = httptest.NewServer(proxy.New(proxy.Config{Engine: f.eng, Domain: "sb.test", HoldLimit: 2 * time.Second}))
	t.Cleanup(f.proxy.Close)
	return f
}

func (f *fixture) create(t *testing.T, req torpor.CreateRequest) *torpor.Sandbox {
	req.Template = "base"
	sb, err := f.eng.Create(ctx, "acme", req)
	if err != nil {
		t.Fatal(err)
	}
	return sb
}

// get sends a request through the proxy with a Host header.
func (f *fixture) get(t *testing.T, host, path string, hdr map[string]string) (int, string) {
	req, _ := http.NewRequest("GET", f.proxy.URL+path, nil)
	req.Host = host
	for k, v := range hdr {
		req.Header.Set(k, v)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestRoutingAndAccess(t *testing.T) {
	f := newFixture(t)
	sb := f.create(t, torpor.CreateRequest{})
	host := "8080-" + sb.ID + ".sb.test"
	cases := []struct {
		name, host, path string
		hdr              map[string]string
		status           int
		body             string
	}{
		{"token in a header", host, "/a?b=1", map[string]string{proxy.HeaderToken: sb.TrafficToken}, 200, "/a?b=1 token=\"\""},
		{"token in the query, not forwarded", host, "/a?torpor_token=" + sb.TrafficToken + "&b=1", nil, 200, "/a?b=1"},
		{"routing by headers", "anything", "/h", map[string]string{proxy.HeaderSandboxID: sb.ID, proxy.HeaderSandboxPort: "8080", proxy.HeaderToken: sb.TrafficToken}, 200, "/h"},
		{"no token", host, "/", nil, 401, "private"},
		{"wrong token", host, "/", map[string]string{proxy.HeaderToken: "tt_nope"}, 403, "wrong traffic token"},
		{"unknown sandbox", "8080-nosuchsandbox.sb.test", "/", nil, 404, "not_found"},
		{"bad host", "example.com", "/", nil, 400, "port"},
		{"bad port header", "x", "/", map[string]string{proxy.HeaderSandboxID: sb.ID, proxy.HeaderSandboxPort: "0"}, 400, "port"},
		{"nothing listens", "9999-" + sb.ID + ".sb.test", "/", map[string]string{proxy.HeaderToken: sb.TrafficToken}, 503, "did not answer"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			status, body := f.get(t, c.host, c.path, c.hdr)
			if status != c.status || !strings.Contains(body, c.body) {
				t.Fatalf("got %d %q, want %d containing %q", status, body, c.status, c.body)
			}
		})
	}
}

func TestPublicPortAndWrongTokenNeverWakes(t *testing.T) {
	f := newFixture(t)
	sb := f.create(t, torpor.CreateRequest{Ports: []torpor.PortSpec{{Port: 8080, Public: true}}})
	if status, _ := f.get(t, "8080-"+sb.ID+".sb.test", "/", nil); status != 200 {
		t.Fatalf("public port: %d", status)
	}
	private := f.create(t, torpor.CreateRequest{})
	if _, err := f.eng.Pause(ctx, "acme", private.ID, ""); err != nil {
		t.Fatal(err)
	}
	f.get(t, "8080-"+private.ID+".sb.test", "/", map[string]string{proxy.HeaderToken: "bad"})
	f.get(t, "8080-"+private.ID+".sb.test", "/", nil)
	if got, _ := f.eng.Lookup(ctx, private.ID); got.State != torpor.StatePaused {
		t.Fatalf("a request without the right token woke the sandbox: %s", got.State)
	}
}

func TestWakesOnTheFirstRequestOnce(t *testing.T) {
	f := newFixture(t)
	sb := f.create(t, torpor.CreateRequest{Ports: []torpor.PortSpec{{Port: 8080, Public: true}}})
	f.eng.Pause(ctx, "acme", sb.ID, "")
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if status, body := f.get(t, "8080-"+sb.ID+".sb.test", "/", nil); status != 200 {
				t.Errorf("request to a paused sandbox: %d %s", status, body)
			}
		}()
	}
	wg.Wait()
	got, _ := f.eng.Lookup(ctx, sb.ID)
	if got.State != torpor.StateRunning || got.Meters.AutoResumed != 1 {
		t.Fatalf("after 8 concurrent requests: %s, %+v", got.State, got.Meters)
	}
	// From hibernated too: booted again, then the request is served.
	f.eng.Hibernate(ctx, "acme", sb.ID)
	if status, _ := f.get(t, "8080-"+sb.ID+".sb.test", "/", nil); status != 200 {
		t.Fatalf("request to a hibernated sandbox: %d", status)
	}
}

func TestRefusals(t *testing.T) {
	f := newFixture(t)
	off := false
	sb := f.create(t, torpor.CreateRequest{Ports: []torpor.PortSpec{{Port: 8080, Public: true}},
		PolicyRequest: torpor.PolicyRequest{Lifecycle: &torpor.Lifecycle{AutoResume: &off}}})
	f.eng.Pause(ctx, "acme", sb.ID, "")
	if status, body := f.get(t, "8080-"+sb.ID+".sb.test", "/", nil); status != 409 || !strings.Contains(body, "paused") {
		t.Fatalf("auto_resume off: %d %s", status, body)
	}
	f.eng.Delete(ctx, "acme", sb.ID)
	if status, _ := f.get(t, "8080-"+sb.ID+".sb.test", "/", nil); status != 410 {
		t.Fatalf("terminated: %d", status)
	}
	// A full node: 503 with Retry-After, not a hang.
	big := f.create(t, torpor.CreateRequest{Resources: &torpor.Resources{VCPUs: 2, MemoryMiB: 1024}, Ports: []torpor.PortSpec{{Port: 8080, Public: true}}})
	f.eng.Hibernate(ctx, "acme", big.ID)
	f.create(t, torpor.CreateRequest{Resources: &torpor.Resources{VCPUs: 2, MemoryMiB: 1024}})
	req, _ := http.NewRequest("GET", f.proxy.URL+"/", nil)
	req.Host = "8080-" + big.ID + ".sb.test"
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 503 || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("full node: %d, Retry-After %q", resp.StatusCode, resp.Header.Get("Retry-After"))
	}
}

// TestUpgradedConnectionsPassThroughAndCountAsActivity: an upgraded
// (WebSocket-like) connection is spliced both ways, and its traffic is
// reported to the idle engine.
func TestUpgradedConnectionsPassThroughAndCountAsActivity(t *testing.T) {
	f := newFixture(t)
	sb := f.create(t, torpor.CreateRequest{Ports: []torpor.PortSpec{{Port: 8080, Public: true}}})
	before := sb.LastActivityAt
	conn, err := net.Dial("tcp", f.proxy.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "GET /ws HTTP/1.1\r\nHost: 8080-%s.sb.test\r\nConnection: Upgrade\r\nUpgrade: echo\r\n\r\n", sb.ID)
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != 101 {
		t.Fatalf("upgrade: %v %v", resp, err)
	}
	time.Sleep(1100 * time.Millisecond)
	fmt.Fprint(conn, "ping\n")
	line, err := br.ReadString('\n')
	if err != nil || line != "ping\n" {
		t.Fatalf("echo through the proxy: %q %v", line, err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if got, _ := f.eng.Lookup(ctx, sb.ID); got.LastActivityAt.After(before) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("traffic on the upgraded connection was not reported as activity")
		}
	}
}
