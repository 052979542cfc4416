package proxy_test

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

// client is a raw HTTP/1.1 connection to the proxy.
type client struct {
	t  *testing.T
	c  net.Conn
	br *bufio.Reader
}

func (f *fixture) dial(t *testing.T) *client {
	c, err := net.Dial("tcp", f.proxy.Addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	return &client{t: t, c: c, br: bufio.NewReader(c)}
}

func (c *client) send(s string) {
	c.t.Helper()
	if _, err := io.WriteString(c.c, s); err != nil {
		c.t.Fatal(err)
	}
}

// read reads a response to a request of the method, body and all.
func (c *client) read(method string) (*http.Response, string) {
	c.t.Helper()
	resp, err := http.ReadResponse(c.br, &http.Request{Method: method})
	if err != nil {
		c.t.Fatalf("reading the response: %v", err)
	}
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		c.t.Fatalf("reading the body: %v", err)
	}
	resp.Body.Close()
	return resp, string(b)
}

// closed tells whether the proxy closed the connection.
func (c *client) closed() bool {
	_ = c.c.SetReadDeadline(time.Now().Add(2 * time.Second))
	_, err := c.br.ReadByte()
	var ne net.Error
	// The end of the stream, or a reset (a proxy that closes with bytes
	// of ours unread resets).
	return err != nil && !(errors.As(err, &ne) && ne.Timeout())
}

// TestResponsesPassThroughAsSent: whatever framing the sandbox's server
// answers with (a length, chunks with trailers, the end of the
// connection), the client gets the same status, headers and body, less
// the hop-by-hop headers, and keeps its connection when the framing
// allows it.
func TestResponsesPassThroughAsSent(t *testing.T) {
	f := newFixture(t)
	sb := f.create(t, torpor.CreateRequest{Ports: []torpor.PortSpec{{Port: 8083, Public: true}}})
	host := "8083-" + sb.ID + ".sb.test"
	for _, tc := range []struct {
		name, method, answer string
		closeAfter           bool
		status               int
		body                 string
		headers              map[string]string // "" : must be absent
		trailer              map[string]string
		keeps                bool // the client's connection stays usable
		broken               bool // the body ends short: the connection is cut
	}{
		{name: "length", answer: "HTTP/1.1 200 OK\r\nContent-Length: 5\r\nX-A: 1\r\n\r\nhello",
			status: 200, body: "hello", headers: map[string]string{"X-A": "1"}, keeps: true},
		{name: "chunked with trailers", answer: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nTrailer: X-Sum\r\n\r\n" +
			"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\nX-Sum: 42\r\n\r\n",
			status: 200, body: "hello world", trailer: map[string]string{"X-Sum": "42"}, keeps: true},
		{name: "until the connection ends", answer: "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nbye, all of it", closeAfter: true,
			status: 200, body: "bye, all of it", keeps: false},
		{name: "HTTP/1.0 with a length", answer: "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nok", closeAfter: true,
			status: 200, body: "ok", keeps: true},
		{name: "no content", answer: "HTTP/1.1 204 No Content\r\nX-B: 2\r\n\r\n",
			status: 204, headers: map[string]string{"X-B": "2"}, keeps: true},
		{name: "not modified keeps its length header", answer: "HTTP/1.1 304 Not Modified\r\nContent-Length: 99\r\n\r\n",
			status: 304, keeps: true},
		{name: "HEAD", method: "HEAD", answer: "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n",
			status: 200, headers: map[string]string{"Content-Length": "10"}, keeps: true},
		{name: "early hints first", answer: "HTTP/1.1 103 Early Hints\r\nLink: </a.css>; rel=preload\r\n\r\nHTTP/1.1 200 OK\r\nContent-Length: 1\r\n\r\nx",
			status: 200, body: "x", keeps: true},
		{name: "hop-by-hop headers dropped", answer: "HTTP/1.1 200 OK\r\nConnection: X-Private, keep-alive\r\nX-Private: a\r\nKeep-Alive: timeout=5\r\nX-Public: b\r\nContent-Length: 0\r\n\r\n",
			status: 200, headers: map[string]string{"X-Private": "", "Keep-Alive": "", "X-Public": "b"}, keeps: true},
		{name: "chunked wins over a length", answer: "HTTP/1.1 200 OK\r\nContent-Length: 100\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n",
			status: 200, body: "abc", headers: map[string]string{"Content-Length": ""}, keeps: true},
		{name: "server closes after a length", answer: "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 3\r\n\r\nend", closeAfter: true,
			status: 200, body: "end", keeps: true},
		{name: "an upgrade nobody asked for", answer: "HTTP/1.1 101 Switching Protocols\r\nUpgrade: x\r\nConnection: upgrade\r\n\r\n", closeAfter: true,
			status: 503, body: "did not answer", keeps: true},
		{name: "not HTTP", answer: "SSH-2.0-OpenSSH_9.2\r\n\r\n", closeAfter: true,
			status: 503, body: "did not answer", keeps: true},
		{name: "a bare CR in a header value", answer: "HTTP/1.1 200 OK\r\nX-A: a\rContent-Length: 0\r\nContent-Length: 4\r\n\r\nbody", closeAfter: true,
			status: 503, body: "did not answer", keeps: true},
		{name: "no space after the version", answer: "HTTP/1.1X200 OK\r\nContent-Length: 0\r\n\r\n", closeAfter: true,
			status: 503, body: "did not answer", keeps: true},
		{name: "a signed chunk size", answer: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n+5\r\nhello\r\n0\r\n\r\n", closeAfter: true,
			status: 200, broken: true},
		{name: "a chunk ended by a bare LF", answer: "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\n0\r\n\r\n", closeAfter: true,
			status: 200, broken: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			method := tc.method
			if method == "" {
				method = "GET"
			}
			path := "/" + strings.ReplaceAll(tc.name, " ", "-")
			f.rawMu.Lock()
			f.raw[path], f.rawClose[path] = tc.answer, tc.closeAfter
			f.rawMu.Unlock()
			c := f.dial(t)
			c.send(method + " " + path + " HTTP/1.1\r\nHost: " + host + "\r\n\r\n")
			if tc.broken {
				// Cut before the head or in the body, never whole.
				if resp, err := http.ReadResponse(c.br, nil); err == nil {
					if b, err := io.ReadAll(resp.Body); err == nil {
						t.Fatalf("a malformed body came through whole: %d %q", resp.StatusCode, b)
					}
				}
				if !c.closed() {
					t.Fatal("the connection stayed open after a malformed body")
				}
				return
			}
			resp, body := c.read(method)
			if resp.StatusCode == 103 { // then the answer
				if resp.Header.Get("Link") == "" {
					t.Fatal("103 without its Link")
				}
				resp, body = c.read(method)
			}
			if resp.StatusCode >= 500 && strings.Contains(body, tc.body) {
				body = tc.body // an error in the API's shape, saying why
			}
			if resp.StatusCode != tc.status || body != tc.body || resp.Proto != "HTTP/1.1" {
				t.Fatalf("got %s %d %q, want %d %q", resp.Proto, resp.StatusCode, body, tc.status, tc.body)
			}
			for k, want := range tc.headers {
				if got := resp.Header.Get(k); got != want {
					t.Errorf("header %s: %q, want %q", k, got, want)
				}
			}
			for k, want := range tc.trailer {
				if got := resp.Trailer.Get(k); got != want {
					t.Errorf("trailer %s: %q, want %q", k, got, want)
				}
			}
			if !tc.keeps {
				if !c.closed() {
					t.Fatal("the connection stayed open after a body that ends with it")
				}
				return
			}
			// The connection serves the next request.
			c.send(method + " " + path + " HTTP/1.1\r\nHost: " + host + "\r\n\r\n")
			resp, body = c.read(method)
			if resp.StatusCode == 103 {
				resp, body = c.read(method)
			}
			if resp.StatusCode >= 500 && strings.Contains(body, tc.body) {
				body = tc.body
			}
			if resp.StatusCode != tc.status || body != tc.body {
				t.Fatalf("second request: %d %q", resp.StatusCode, body)
			}
		})
	}
}

// TestRequestsAsSent: the sandbox sees the client's request line and
// headers, its body whatever its size, and the proxy's forwarding
// headers instead of the client's, without the traffic token; pipelined
// requests are answered in order.
func TestRequestsAsSent(t *testing.T) {
	f := newFixture(t)
	sb := f.create(t, torpor.CreateRequest{Ports: []torpor.PortSpec{{Port: 8080}}})
	host := "8080-" + sb.ID + ".sb.test"
	c := f.dial(t)
	auth := "X-Torpor-Token: " + sb.TrafficToken + "\r\n"
	c.send("POST /echo HTTP/1.1\r\nHost: " + host + "\r\n" + auth + "X-Forwarded-For: 6.6.6.6\r\nX-Custom: a\r\nContent-Length: 3\r\n\r\none" +
		"POST /echo HTTP/1.1\r\nHost: " + host + "\r\n" + auth + "Content-Length: 3\r\n\r\ntwo" +
		"GET / HTTP/1.1\r\nHost: " + host + "\r\n" + auth + "\r\n")
	if _, body := c.read("POST"); body != `POST one xff="127.0.0.1" secret="" custom="a"` {
		t.Fatalf("first: %q", body)
	}
	if _, body := c.read("POST"); !strings.HasPrefix(body, "POST two ") {
		t.Fatalf("second: %q", body)
	}
	if _, body := c.read("GET"); body != `hello from `+host+`/ token=""` {
		t.Fatalf("third: %q", body)
	}
	// A body larger than the proxy's buffers streams through.
	big := strings.Repeat("0123456789abcdef", 64<<10) // 1 MiB
	c.send("PUT /echo HTTP/1.1\r\nHost: " + host + "\r\n" + auth + "Content-Length: " + strconv.Itoa(len(big)) + "\r\n\r\n")
	go io.WriteString(c.c, big)
	if resp, body := c.read("PUT"); resp.StatusCode != 200 || !strings.HasPrefix(body, "PUT "+big+" ") {
		t.Fatalf("a 1 MiB body: %d, %d bytes back", resp.StatusCode, len(body))
	}
	// Connection: close is honoured.
	c.send("GET / HTTP/1.1\r\nHost: " + host + "\r\n" + auth + "Connection: close\r\n\r\n")
	if resp, _ := c.read("GET"); resp.StatusCode != 200 {
		t.Fatalf("close: %d", resp.StatusCode)
	}
	if !c.closed() {
		t.Fatal("the connection stayed open after Connection: close")
	}
}

// TestOneConnectionFromFastToNetHTTP: requests the proxy's own loop does
// not take (an upgrade, a token in the query, a head too large for its
// buffer, a wrong token) are served on the same connection as the ones it
// does, with the bytes already read.
func TestOneConnectionFromFastToNetHTTP(t *testing.T) {
	f := newFixture(t)
	sb := f.create(t, torpor.CreateRequest{Ports: []torpor.PortSpec{{Port: 8080}}})
	host := "8080-" + sb.ID + ".sb.test"
	auth := "X-Torpor-Token: " + sb.TrafficToken + "\r\n"

	c := f.dial(t)
	c.send("GET /a HTTP/1.1\r\nHost: " + host + "\r\n" + auth + "\r\n" +
		"GET /b?torpor_token=" + sb.TrafficToken + " HTTP/1.1\r\nHost: " + host + "\r\n\r\n")
	if _, body := c.read("GET"); !strings.Contains(body, host+"/a ") {
		t.Fatalf("first: %q", body)
	}
	if resp, body := c.read("GET"); resp.StatusCode != 200 || !strings.Contains(body, host+"/b ") {
		t.Fatalf("token in the query: %d %q", resp.StatusCode, body)
	}
	c.send("GET /c HTTP/1.1\r\nHost: " + host + "\r\n" + auth + "X-Big: " + strings.Repeat("x", 12<<10) + "\r\n\r\n")
	if resp, body := c.read("GET"); resp.StatusCode != 200 || !strings.Contains(body, host+"/c ") {
		t.Fatalf("a 12 KiB head: %d %q", resp.StatusCode, body)
	}

	c = f.dial(t)
	c.send("GET /d HTTP/1.1\r\nHost: " + host + "\r\n" + auth + "\r\n" +
		"GET /e HTTP/1.1\r\nHost: " + host + "\r\nX-Torpor-Token: wrong\r\n\r\n")
	c.read("GET")
	if resp, _ := c.read("GET"); resp.StatusCode != http.StatusForbidden {
		t.Fatalf("wrong token after a good request: %d", resp.StatusCode)
	}

	c = f.dial(t)
	c.send("GET / HTTP/1.1\r\nHost: " + host + "\r\n" + auth + "\r\n" +
		"GET /ws HTTP/1.1\r\nHost: " + host + "\r\n" + auth + "Connection: Upgrade\r\nUpgrade: echo\r\n\r\n")
	c.read("GET")
	resp, err := http.ReadResponse(c.br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("upgrade after a plain request: %v %v", resp, err)
	}
	c.send("ping")
	got := make([]byte, 4)
	if _, err := io.ReadFull(c.br, got); err != nil || !bytes.Equal(got, []byte("ping")) {
		t.Fatalf("echo over the upgraded connection: %q %v", got, err)
	}
}

// TestRefusalsReadTheRequest: a refused request's body is read with it,
// so the next request on the connection is served; one whose body is too
// large to read is answered with Connection: close.
func TestRefusalsReadTheRequest(t *testing.T) {
	f := newFixture(t)
	sb := f.create(t, torpor.CreateRequest{Ports: []torpor.PortSpec{{Port: 8080}}})
	host := "8080-" + sb.ID + ".sb.test"
	c := f.dial(t)
	c.send("POST /echo HTTP/1.1\r\nHost: " + host + "\r\nX-Torpor-Token: wrong\r\nContent-Length: 5\r\n\r\nhello" +
		"GET / HTTP/1.1\r\nHost: " + host + "\r\nX-Torpor-Token: " + sb.TrafficToken + "\r\n\r\n")
	if resp, body := c.read("POST"); resp.StatusCode != http.StatusForbidden || !strings.Contains(body, "wrong traffic token") {
		t.Fatalf("wrong token: %d %q", resp.StatusCode, body)
	}
	if resp, body := c.read("GET"); resp.StatusCode != 200 || !strings.Contains(body, "hello from") {
		t.Fatalf("the next request: %d %q", resp.StatusCode, body)
	}
	c.send("PUT /echo HTTP/1.1\r\nHost: " + host + "\r\nContent-Length: 1000000\r\n\r\n")
	if resp, _ := c.read("PUT"); resp.StatusCode != http.StatusUnauthorized || !resp.Close {
		t.Fatalf("no token, a large body: %d, close %v", resp.StatusCode, resp.Close)
	}
	if !c.closed() {
		t.Fatal("the connection stayed open with a body unread")
	}
}

// TestTheSandboxCannotDesyncItsClients: a server that sends more than it
// was asked for (a body after HEAD) or answers an upload early cannot
// make one client's bytes another's answer or request.
func TestTheSandboxCannotDesyncItsClients(t *testing.T) {
	f := newFixture(t)
	sb := f.create(t, torpor.CreateRequest{Ports: []torpor.PortSpec{{Port: 8083, Public: true}, {Port: 8080, Public: true}}})
	host := "8083-" + sb.ID + ".sb.test"
	f.rawMu.Lock()
	f.raw["/head"] = "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nstale"
	f.raw["/b"] = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nb!"
	f.raw["/c"] = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nc!"
	f.raw["/charge"], f.rawClose["/charge"] = "", true // takes the request, closes without answering
	f.raw["/again"], f.rawClose["/again"] = "", true
	f.raw["/ok"] = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
	f.raw["/early"], f.rawClose["/early"], f.rawEarly["/early"] = "HTTP/1.1 413 Content Too Large\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", true, true
	f.raw["/gzip"], f.rawClose["/gzip"] = "HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\nContent-Length: 3\r\n\r\nabc", true
	f.rawMu.Unlock()

	a := f.dial(t)
	a.send("HEAD /head HTTP/1.1\r\nHost: " + host + "\r\n\r\n")
	a.read("HEAD")
	a.c.Close()
	for _, path := range []string{"/b", "/c"} {
		c := f.dial(t)
		c.send("GET " + path + " HTTP/1.1\r\nHost: " + host + "\r\n\r\n")
		if _, body := c.read("GET"); body != path[1:]+"!" {
			t.Fatalf("GET %s after a HEAD answered with a body: %q", path, body)
		}
	}

	// A request that cannot be sent twice is not, even on a kept-alive
	// connection that fails; a GET is.
	for _, tc := range []struct {
		method, path string
		seen         int
	}{{"POST", "/charge", 1}, {"GET", "/again", 2}} {
		c := f.dial(t)
		c.send("GET /ok HTTP/1.1\r\nHost: " + host + "\r\n\r\n")
		c.read("GET")
		c.send(tc.method + " " + tc.path + " HTTP/1.1\r\nHost: " + host + "\r\nContent-Length: 0\r\n\r\n")
		if resp, _ := c.read(tc.method); resp.StatusCode != http.StatusServiceUnavailable {
			t.Fatalf("%s %s: %d", tc.method, tc.path, resp.StatusCode)
		}
		f.rawMu.Lock()
		seen := f.rawSeen[tc.path]
		f.rawMu.Unlock()
		if seen != tc.seen {
			t.Fatalf("%s %s reached the server %d times, want %d", tc.method, tc.path, seen, tc.seen)
		}
	}

	// An upload answered early (more than the sockets' buffers hold, so
	// that sending it fails): the answer comes through, and the rest of
	// the body is never read as a request.
	before := f.hits.Load()
	c := f.dial(t)
	_ = c.c.SetDeadline(time.Now().Add(30 * time.Second))
	rest := strings.Repeat("x", 32<<20) + "GET /smuggled HTTP/1.1\r\nHost: 8080-" + sb.ID + ".sb.test\r\n\r\n"
	c.send("POST /early HTTP/1.1\r\nHost: " + host + "\r\nContent-Length: " + strconv.Itoa(len(rest)) + "\r\n\r\n")
	go io.WriteString(c.c, rest)
	if resp, err := http.ReadResponse(c.br, nil); err == nil {
		io.Copy(io.Discard, resp.Body)
		if resp.StatusCode != http.StatusRequestEntityTooLarge {
			t.Fatalf("an upload answered early: %d", resp.StatusCode)
		}
	} else {
		t.Fatalf("an upload answered early: %v", err)
	}
	if !c.closed() {
		t.Fatal("the connection stayed open with a body unread")
	}
	if f.hits.Load() != before {
		t.Fatal("the rest of the body reached a server as a request")
	}

	// Transfer-Encoding other than chunked: read to the end, its length
	// header dropped, the client's connection closed after.
	c = f.dial(t)
	c.send("GET /gzip HTTP/1.1\r\nHost: " + host + "\r\n\r\n")
	_ = c.c.SetReadDeadline(time.Now().Add(5 * time.Second))
	raw, _ := io.ReadAll(c.br)
	if s := string(raw); strings.Contains(s, "Content-Length") || !strings.Contains(s, "Connection: close\r\n") || !strings.HasSuffix(s, "\r\n\r\nabc") {
		t.Fatalf("Transfer-Encoding: gzip with a length: %q", s)
	}
}

// TestAClientThatGoesAwayLetsItsSandboxSleep: a request whose client went
// away while the sandbox's server thinks stops keeping the sandbox awake.
func TestAClientThatGoesAwayLetsItsSandboxSleep(t *testing.T) {
	f := newFixture(t)
	sb := f.create(t, torpor.CreateRequest{Ports: []torpor.PortSpec{{Port: 8080, Public: true}},
		PolicyRequest: torpor.PolicyRequest{LifecyclePolicy: &torpor.LifecyclePolicy{PauseAfterIdleSeconds: torpor.Seconds(1)}}})
	t.Cleanup(func() { close(f.answer) })
	c := f.dial(t)
	c.send("GET /slow HTTP/1.1\r\nHost: 8080-" + sb.ID + ".sb.test\r\n\r\n")
	time.Sleep(100 * time.Millisecond)
	c.c.Close()
	if got := f.awaitPaused(sb.ID, 15*time.Second); got != torpor.StatePaused {
		t.Fatalf("still %s with its only client gone", got)
	}
}
