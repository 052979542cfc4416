package proxy_test

import (
	"bufio"
	"context"
	"encoding/base64"
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
	eng       *lifecycle.Engine
	host      *fake.Host
	proxy     proxyAddr
	backend   *httptest.Server
	h2backend *httptest.Server
	hits      atomic.Int32
	release   chan struct{} // lets /stream write its second piece
	answer    chan struct{} // lets /slow answer
	// raw: what port 8083 answers to a request for a path, as bytes on
	// the wire; the connection is closed after an answer whose value
	// in rawClose is true.
	rawMu    sync.Mutex
	raw      map[string]string
	rawClose map[string]bool
	rawSeen  map[string]int  // requests seen, by path
	rawEarly map[string]bool // paths answered without reading the body
}

var ctx = context.Background()

// proxyAddr is where the fixture's proxy listens.
type proxyAddr struct{ URL, Addr string }

// newFixture: a real engine over the fake runtime, whose sandboxes' port
// 8080 is an httptest server (a websocket-like echo on /ws).
func newFixture(t testing.TB, opts ...func(*proxy.Config)) *fixture {
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "torpor.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	st.PutTemplate(ctx, torpor.Template{Name: "base", RootFS: "/x", CreatedAt: time.Now()})
	f := &fixture{host: fake.NewHost(), release: make(chan struct{}), answer: make(chan struct{})}
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
		switch r.URL.Path {
		case "/echo":
			body, _ := io.ReadAll(r.Body)
			fmt.Fprintf(w, "%s %s xff=%q secret=%q custom=%q", r.Method, body, r.Header.Get("X-Forwarded-For"), r.Header.Get("X-Secret"), r.Header.Get("X-Custom"))
			return
		case "/slow":
			<-f.answer
			io.WriteString(w, "at last")
			return
		case "/stream":
			// A body of unknown length: its first piece must reach the
			// client before the second is written.
			io.WriteString(w, "first\n")
			http.NewResponseController(w).Flush()
			<-f.release
			io.WriteString(w, "second\n")
			return
		}
		fmt.Fprintf(w, "hello from %s%s token=%q", r.Host, r.URL.RequestURI(), r.Header.Get(proxy.HeaderToken))
	}))
	t.Cleanup(f.backend.Close)
	// Port 8081: a cleartext HTTP/2 server (as gRPC's are), answering
	// with the protocol it saw and a trailer.
	f.h2backend = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Trailer", "Grpc-Status")
		fmt.Fprintf(w, "proto=%d", r.ProtoMajor)
		w.Header().Set("Grpc-Status", "0")
	}))
	f.h2backend.Config.Protocols = new(http.Protocols)
	f.h2backend.Config.Protocols.SetHTTP1(true)
	f.h2backend.Config.Protocols.SetUnencryptedHTTP2(true)
	f.h2backend.Start()
	t.Cleanup(f.h2backend.Close)
	// Port 8082: a plain TCP echo.
	echo, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { echo.Close() })
	go func() {
		for {
			c, err := echo.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	ports := map[string]string{
		"127.0.0.1:8080": f.backend.Listener.Addr().String(),
		"127.0.0.1:8081": f.h2backend.Listener.Addr().String(),
		"127.0.0.1:8082": echo.Addr().String(),
		"127.0.0.1:8083": f.rawServer(t),
	}
	f.host.DialFunc = func(ctx context.Context, id, network, addr string) (net.Conn, error) {
		to, ok := ports[addr]
		if !ok {
			return nil, fmt.Errorf("connection refused to %s", addr)
		}
		var d net.Dialer
		return d.DialContext(ctx, network, to)
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
	tcp, _ := proxy.ParsePorts("8082,9000-9010")
	cfg := proxy.Config{Engine: f.eng, Domain: "sb.test", HoldLimit: 2 * time.Second, TCPPorts: tcp}
	for _, o := range opts {
		o(&cfg)
	}
	prox := proxy.New(cfg)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go prox.Serve(ln)
	t.Cleanup(func() { prox.Close() })
	f.proxy = proxyAddr{URL: "http://" + ln.Addr().String(), Addr: ln.Addr().String()}
	return f
}

// awaitPaused waits up to within for the sandbox to be paused, and
// returns the state it found last.
func (f *fixture) awaitPaused(id string, within time.Duration) torpor.State {
	deadline := time.Now().Add(within)
	for {
		got, _ := f.eng.Lookup(ctx, id)
		if got.State == torpor.StatePaused || time.Now().After(deadline) {
			return got.State
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// rawServer answers each request with the bytes f.raw names for its
// path (a 404 when none).
func (f *fixture) rawServer(t testing.TB) string {
	f.raw, f.rawClose, f.rawSeen, f.rawEarly = map[string]string{}, map[string]bool{}, map[string]int{}, map[string]bool{}
	return serveRequests(t, func(c net.Conn, req *http.Request) bool {
		f.rawMu.Lock()
		early := f.rawEarly[req.URL.Path]
		f.rawMu.Unlock()
		if !early {
			io.Copy(io.Discard, req.Body)
		}
		f.rawMu.Lock()
		f.rawSeen[req.URL.Path]++
		answer, ok := f.raw[req.URL.Path]
		closeAfter := f.rawClose[req.URL.Path]
		f.rawMu.Unlock()
		if !ok {
			answer = "HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n"
		}
		_, err := io.WriteString(c, answer)
		return err == nil && !closeAfter
	})
}

// serveRequests listens on a local port and hands each request read on
// each connection to answer, which writes what it likes to the connection
// and says whether to read the next request (false closes it). It returns
// the listener's address.
func serveRequests(t testing.TB, answer func(c net.Conn, req *http.Request) bool) string {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				br := bufio.NewReader(c)
				for {
					req, err := http.ReadRequest(br)
					if err != nil || !answer(c, req) {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

func (f *fixture) create(t testing.TB, req torpor.CreateRequest) *torpor.Sandbox {
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
		// An unknown id answers as a private port does, token or not, so
		// that ids cannot be probed.
		{"unknown sandbox, no token", "8080-nosuchsandbox.sb.test", "/", nil, 401, "private"},
		{"unknown sandbox, a token", "8080-nosuchsandbox.sb.test", "/", map[string]string{proxy.HeaderToken: sb.TrafficToken}, 403, "wrong traffic token"},
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
	conn, err := net.Dial("tcp", f.proxy.Addr)
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

// TestH2CPassesThrough: a request over cleartext HTTP/2 reaches an h2c
// server in the sandbox over HTTP/2 (trailers included, as gRPC needs),
// and an HTTP/1.1 server over HTTP/1.1.
func TestH2CPassesThrough(t *testing.T) {
	f := newFixture(t)
	sb := f.create(t, torpor.CreateRequest{Ports: []torpor.PortSpec{{Port: 8080, Public: true}, {Port: 8081, Public: true}}})
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	c := &http.Client{Transport: tr}
	for _, tc := range []struct {
		port, body, trailer string
	}{{"8081", "proto=2", "0"}, {"8080", "hello from 8080-", ""}, {"8081", "proto=2", "0"}} {
		req, _ := http.NewRequest("GET", f.proxy.URL+"/x", nil)
		req.Host = tc.port + "-" + sb.ID + ".sb.test"
		resp, err := c.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.ProtoMajor != 2 || resp.StatusCode != 200 || !strings.HasPrefix(string(b), tc.body) || resp.Trailer.Get("Grpc-Status") != tc.trailer {
			t.Fatalf("port %s over h2c: HTTP/%d %d %q trailer %q", tc.port, resp.ProtoMajor, resp.StatusCode, b, resp.Trailer.Get("Grpc-Status"))
		}
	}
	// Over HTTP/1.1 to the h2c server (which speaks both): HTTP/1.1.
	if status, body := f.get(t, "8081-"+sb.ID+".sb.test", "/", nil); status != 200 || body != "proto=1" {
		t.Fatalf("HTTP/1.1 to the h2c server: %d %q", status, body)
	}
}

// connect sends a CONNECT through the proxy and returns the answer and
// the connection (the tunnel when the answer is 200).
func (f *fixture) connect(t *testing.T, target string, hdr ...string) (*http.Response, net.Conn, *bufio.Reader) {
	t.Helper()
	conn, err := net.Dial("tcp", f.proxy.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	fmt.Fprintf(conn, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n%s\r\n", target, target, strings.Join(hdr, ""))
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, &http.Request{Method: "CONNECT"})
	if err != nil {
		t.Fatal(err)
	}
	return resp, conn, br
}

// TestConnectTunnelsPlainTCP: CONNECT opens a TCP tunnel to a sandbox
// port in TCPPorts, addressed by host name or as <id>:<port>, with the
// traffic token as the Proxy-Authorization password or in X-Torpor-Token;
// its traffic counts as activity.
func TestConnectTunnelsPlainTCP(t *testing.T) {
	f := newFixture(t)
	sb := f.create(t, torpor.CreateRequest{})
	basic := "Proxy-Authorization: Basic " + base64.StdEncoding.EncodeToString([]byte("x:"+sb.TrafficToken)) + "\r\n"
	for _, target := range []string{sb.ID + ":8082", "8082-" + sb.ID + ".sb.test:443"} {
		for _, auth := range []string{basic, proxy.HeaderToken + ": " + sb.TrafficToken + "\r\n"} {
			resp, conn, br := f.connect(t, target, auth)
			if resp.StatusCode != 200 {
				t.Fatalf("CONNECT %s: %d", target, resp.StatusCode)
			}
			fmt.Fprint(conn, "ping\n")
			if line, err := br.ReadString('\n'); err != nil || line != "ping\n" {
				t.Fatalf("echo through the tunnel: %q %v", line, err)
			}
		}
	}
	if resp, _, _ := f.connect(t, sb.ID+":8082"); resp.StatusCode != 407 || resp.Header.Get("Proxy-Authenticate") == "" {
		t.Fatalf("CONNECT without a token: %d %q", resp.StatusCode, resp.Header.Get("Proxy-Authenticate"))
	}
	if resp, _, _ := f.connect(t, sb.ID+":8082", "Proxy-Authorization: Basic "+base64.StdEncoding.EncodeToString([]byte("x:tt_wrong"))+"\r\n"); resp.StatusCode != 403 {
		t.Fatalf("CONNECT with a wrong token: %d", resp.StatusCode)
	}
	if resp, _, _ := f.connect(t, sb.ID+":8080", basic); resp.StatusCode != 403 {
		t.Fatalf("CONNECT to a port not open to TCP: %d", resp.StatusCode)
	}
	if resp, _, _ := f.connect(t, sb.ID+":9005", basic); resp.StatusCode != 503 {
		t.Fatalf("CONNECT to a port where nothing listens: %d", resp.StatusCode)
	}

	// A paused sandbox wakes for a tunnel, and the tunnel's bytes count.
	if _, err := f.eng.Pause(ctx, "acme", sb.ID, ""); err != nil {
		t.Fatal(err)
	}
	resp, conn, br := f.connect(t, sb.ID+":8082", basic)
	if resp.StatusCode != 200 {
		t.Fatalf("CONNECT to a paused sandbox: %d", resp.StatusCode)
	}
	before, _ := f.eng.Lookup(ctx, sb.ID)
	time.Sleep(1100 * time.Millisecond)
	fmt.Fprint(conn, "pong\n")
	if line, err := br.ReadString('\n'); err != nil || line != "pong\n" {
		t.Fatalf("echo after waking: %q %v", line, err)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if got, _ := f.eng.Lookup(ctx, sb.ID); got.LastActivityAt.After(before.LastActivityAt) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("traffic in the tunnel was not reported as activity")
		}
	}
}

// TestChangesReachTheProxyAtOnce: what the proxy keeps about a running
// sandbox does not outlive a pause or a change of its ports.
func TestChangesReachTheProxyAtOnce(t *testing.T) {
	f := newFixture(t)
	sb := f.create(t, torpor.CreateRequest{Ports: []torpor.PortSpec{{Port: 8080, Public: true}}})
	host := "8080-" + sb.ID + ".sb.test"
	if status, _ := f.get(t, host, "/", nil); status != 200 {
		t.Fatalf("public port: %d", status)
	}
	if _, err := f.eng.Pause(ctx, "acme", sb.ID, ""); err != nil {
		t.Fatal(err)
	}
	if status, _ := f.get(t, host, "/", nil); status != 200 {
		t.Fatalf("after a pause: %d", status)
	}
	if got, _ := f.eng.Lookup(ctx, sb.ID); got.State != torpor.StateRunning || got.Meters.AutoResumed != 1 {
		t.Fatalf("the request after a pause did not wake the sandbox: %s %+v", got.State, got.Meters)
	}
	private := []torpor.PortSpec{}
	if _, err := f.eng.Update(ctx, "acme", sb.ID, torpor.UpdateRequest{Ports: &private}); err != nil {
		t.Fatal(err)
	}
	if status, _ := f.get(t, host, "/", nil); status != 401 {
		t.Fatalf("a port made private still answers: %d", status)
	}
}

func TestParsePorts(t *testing.T) {
	ps, err := proxy.ParsePorts(" 22, 8000-8099 ,5432")
	if err != nil || ps.String() != "22,8000-8099,5432" || !ps.Contains(8050) || !ps.Contains(22) || ps.Contains(8100) || ps.Contains(23) {
		t.Fatalf("%v %v", ps, err)
	}
	if ps, err := proxy.ParsePorts(""); err != nil || ps.Contains(80) {
		t.Fatalf("empty: %v %v", ps, err)
	}
	for _, bad := range []string{"0", "70000", "9-8", "x", "1-", "-5"} {
		if _, err := proxy.ParsePorts(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}

// TestForwardsFaithfully: a body and end-to-end headers reach the sandbox;
// hop-by-hop headers (and those Connection names) do not, nor a client's
// own X-Forwarded-For; a body of unknown length streams.
func TestForwardsFaithfully(t *testing.T) {
	f := newFixture(t)
	sb := f.create(t, torpor.CreateRequest{Ports: []torpor.PortSpec{{Port: 8080, Public: true}}})
	req, _ := http.NewRequest("POST", f.proxy.URL+"/echo", strings.NewReader("payload"))
	req.Host = "8080-" + sb.ID + ".sb.test"
	req.Header.Set("X-Custom", "kept")
	req.Header.Set("X-Secret", "hop")
	req.Header.Set("Connection", "X-Secret")
	req.Header.Set("X-Forwarded-For", "6.6.6.6")
	for range 3 { // over a new, then kept-alive upstream connections
		resp, err := http.DefaultClient.Do(req.Clone(ctx))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if want := `POST payload xff="127.0.0.1" secret="" custom="kept"`; string(b) != want {
			t.Fatalf("got %q, want %q", b, want)
		}
		req.Body = io.NopCloser(strings.NewReader("payload"))
	}

	req, _ = http.NewRequest("GET", f.proxy.URL+"/stream", nil)
	req.Host = "8080-" + sb.ID + ".sb.test"
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	if line, err := br.ReadString('\n'); err != nil || line != "first\n" {
		t.Fatalf("first piece: %q %v", line, err)
	}
	close(f.release)
	if line, err := br.ReadString('\n'); err != nil || line != "second\n" {
		t.Fatalf("second piece: %q %v", line, err)
	}
}

// TestStaleUpstreamConnections: after the sandbox's server closed the
// kept-alive connections, the next requests (with a body or without) get
// through on new ones.
func TestStaleUpstreamConnections(t *testing.T) {
	f := newFixture(t)
	sb := f.create(t, torpor.CreateRequest{Ports: []torpor.PortSpec{{Port: 8080, Public: true}}})
	host := "8080-" + sb.ID + ".sb.test"
	for _, method := range []string{"GET", "POST", "GET"} {
		f.backend.CloseClientConnections()
		time.Sleep(10 * time.Millisecond) // let the close arrive
		req, _ := http.NewRequest(method, f.proxy.URL+"/echo", strings.NewReader("b"))
		if method == "GET" {
			req.Body, req.ContentLength = nil, 0
		}
		req.Host = host
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.HasPrefix(string(b), method+" ") {
			t.Fatalf("%s after the server closed its connections: %d %q", method, resp.StatusCode, b)
		}
	}
}

// TestRequestDuringAPause: a request that arrives while its sandbox is
// being paused waits for the pause and wakes it again; when the pause
// takes longer than the proxy's hold limit, the answer is 503 with
// Retry-After at the limit, not a wait for as long as the pause takes.
func TestRequestDuringAPause(t *testing.T) {
	f := newFixture(t)
	sb := f.create(t, torpor.CreateRequest{Ports: []torpor.PortSpec{{Port: 8080, Public: true}}})
	host := "8080-" + sb.ID + ".sb.test"
	for _, tc := range []struct {
		name       string
		slow       bool // the pause outlasts the hold limit (2 s)
		wantStatus int
	}{
		{"the pause ends within the hold limit", false, 200},
		{"the pause outlasts the hold limit", true, 503},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, _ := f.eng.Lookup(ctx, sb.ID); got.State != torpor.StateRunning {
				t.Fatalf("sandbox %s before the pause", got.State)
			}
			freezing, release := make(chan struct{}), make(chan struct{})
			f.host.FreezeHook = func(context.Context, string) error {
				close(freezing)
				<-release
				return nil
			}
			defer func() { f.host.FreezeHook = nil }()
			paused := make(chan error, 1)
			go func() { _, err := f.eng.Pause(ctx, "acme", sb.ID, ""); paused <- err }()
			<-freezing
			type result struct {
				status int
				retry  string
			}
			answer := make(chan result, 1)
			go func() {
				req, _ := http.NewRequest("GET", f.proxy.URL+"/", nil)
				req.Host = host
				resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
				if err != nil {
					answer <- result{status: -1, retry: err.Error()}
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				answer <- result{resp.StatusCode, resp.Header.Get("Retry-After")}
			}()
			var got result
			if tc.slow {
				got = <-answer // while the pause still holds the sandbox
				close(release)
			} else {
				time.Sleep(50 * time.Millisecond) // let the request wait
				close(release)
				got = <-answer
			}
			if err := <-paused; err != nil {
				t.Fatal(err)
			}
			if got.status != tc.wantStatus || (tc.wantStatus == 503 && got.retry == "") {
				t.Fatalf("got %d (Retry-After %q), want %d", got.status, got.retry, tc.wantStatus)
			}
			// Either way the next request finds the sandbox running again.
			if status, _ := f.get(t, host, "/", nil); status != 200 {
				t.Fatalf("next request: %d", status)
			}
		})
	}
}

// TestARequestWaitingForItsAnswerKeepsItsSandboxAwake: a sandbox is not
// paused for idleness under a request whose answer has not begun, however
// long its server thinks; once answered, it pauses when idle again.
func TestARequestWaitingForItsAnswerKeepsItsSandboxAwake(t *testing.T) {
	f := newFixture(t)
	sb := f.create(t, torpor.CreateRequest{Ports: []torpor.PortSpec{{Port: 8080, Public: true}},
		PolicyRequest: torpor.PolicyRequest{LifecyclePolicy: &torpor.LifecyclePolicy{PauseAfterIdleSeconds: torpor.Seconds(1)}}})
	host := "8080-" + sb.ID + ".sb.test"
	for _, through := range []string{"the HTTP/1.1 loop", "net/http"} {
		t.Run(through, func(t *testing.T) {
			answered := make(chan string, 1)
			go func() {
				path := "/slow"
				if through == "net/http" {
					path += "?torpor_token=x" // the query token: net/http's path
				}
				_, body := f.get(t, host, path, nil)
				answered <- body
			}()
			time.Sleep(3 * time.Second) // three idle timeouts
			if got, _ := f.eng.Lookup(ctx, sb.ID); got.State != torpor.StateRunning {
				t.Fatalf("%s under a request waiting for its answer", got.State)
			}
			f.answer <- struct{}{}
			if body := <-answered; body != "at last" {
				t.Fatalf("answer %q", body)
			}
			if got := f.awaitPaused(sb.ID, 10*time.Second); got != torpor.StatePaused {
				t.Fatalf("still %s after the answer", got)
			}
			if status, _ := f.get(t, host, "/", nil); status != 200 { // wakes it for the next round
				t.Fatalf("waking: %d", status)
			}
		})
	}
}

// TestAKeptAliveConnectionIsNotActivity: once a request is answered, the
// connection the proxy keeps alive to the sandbox's port does not keep it
// awake, whatever connection_idle_seconds says: the sandbox pauses after
// its idle time, on either path.
func TestAKeptAliveConnectionIsNotActivity(t *testing.T) {
	f := newFixture(t)
	sb := f.create(t, torpor.CreateRequest{Ports: []torpor.PortSpec{{Port: 8080, Public: true}},
		PolicyRequest: torpor.PolicyRequest{LifecyclePolicy: &torpor.LifecyclePolicy{
			PauseAfterIdleSeconds: torpor.Seconds(3), ConnectionIdleSeconds: torpor.Seconds(300)}}})
	host := "8080-" + sb.ID + ".sb.test"
	for _, path := range []string{"/", "/?torpor_token=x"} { // the loop, then net/http
		if status, _ := f.get(t, host, path, nil); status != 200 {
			t.Fatalf("GET %s: %d", path, status)
		}
		// (The pool keeps connections 30 s.)
		if got := f.awaitPaused(sb.ID, 10*time.Second); got != torpor.StatePaused {
			t.Fatalf("GET %s: still %s 10 s after the answer, idle time 3 s", path, got)
		}
	}
}
