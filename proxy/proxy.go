// Package proxy is torpor's port proxy: it routes HTTP (HTTP/1.1 and
// cleartext HTTP/2, WebSocket and server-sent events included) to a port
// inside a sandbox, addressed as `<port>-<sandbox id>.<domain>` or by the
// X-Sandbox-Id and X-Sandbox-Port headers, and tunnels plain TCP to the
// ports it is configured for (HTTP CONNECT). It checks the sandbox's
// traffic token for private ports, wakes a paused or hibernated sandbox
// on the first request (auto_resume), and reports traffic to the idle
// engine while bytes flow.
package proxy

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/wire"
	"github.com/torpor-dev/torpor/fleet"
)

// Engine is what the proxy needs of the lifecycle engine.
type Engine interface {
	Lookup(ctx context.Context, id string) (*torpor.Sandbox, error)
	WakeForTraffic(ctx context.Context, id string) (*torpor.Sandbox, error)
	DialSandbox(ctx context.Context, sb *torpor.Sandbox, port int) (net.Conn, error)
	NoteTraffic(id string)
	// RequestStarted and RequestEnded bracket a request forwarded to a
	// running sandbox (see admit).
	RequestStarted(id string)
	RequestEnded(id string)
	// EventsChanged returns a channel closed at the next stored event or
	// change of state (every change of ports has an event): the proxy
	// keeps what Lookup said about a running sandbox until then.
	EventsChanged() <-chan struct{}
}

// Headers and the query parameter the proxy reads.
const (
	HeaderSandboxID   = "X-Sandbox-Id"
	HeaderSandboxPort = "X-Sandbox-Port"
	HeaderToken       = "X-Torpor-Token"
	QueryToken        = "torpor_token"
)

// Config is what a Proxy needs.
type Config struct {
	Engine Engine
	// Domain: hosts are `<port>-<id>.<Domain>` (default "localhost").
	Domain string
	// HoldLimit bounds how long a request waits for a sandbox to wake and
	// its port to accept (default 30 s); past it the answer is 503.
	HoldLimit time.Duration
	// TCPPorts are the sandbox ports that HTTP CONNECT tunnels plain TCP
	// to (none by default).
	TCPPorts Ports
	Logger   *slog.Logger
	// Observer is told of every request and wake-up (for metrics); nil
	// tells no one.
	Observer Observer
	// Services are ports the daemon serves itself for every sandbox
	// (E2B's envd and code interpreter; see Service).
	Services map[int]Service
	// Fleet, in a fleet, checks the requests other nodes forward here and
	// forwards a request for a sandbox of another node to that node's
	// proxy (fleet.go); nil: no fleet. Router says which node serves what
	// (nil: Engine, which must then be one).
	Fleet  *fleet.Fleet
	Router Router
}

// Observer counts what the proxy does.
type Observer interface {
	// ProxyRequest reports a request that ended: "ok", "tunnel", or the
	// error code it was answered with.
	ProxyRequest(result string)
	// ProxyWake reports a request that had to wake its sandbox, how long
	// the wake-up held it, and whether it worked.
	ProxyWake(took time.Duration, ok bool)
}

type nopObserver struct{}

func (nopObserver) ProxyRequest(string)           {}
func (nopObserver) ProxyWake(time.Duration, bool) {}

// Proxy serves the proxy's listener (Serve); it is also an http.Handler.
type Proxy struct {
	eng    Engine
	domain string
	// dotDomain is "." + domain.
	dotDomain string
	hold      time.Duration
	tcp       Ports
	services  map[int]Service
	log       *slog.Logger
	obs       Observer
	// fleet forwards to other nodes and router says to which (both nil
	// outside a fleet).
	fleet  *fleet.Fleet
	router Router
	// The transports are shared by every request, so connections to a
	// sandbox's port are kept alive and reused; their dialer reads the
	// target from the request's context. h2 speaks cleartext HTTP/2, to
	// sandbox servers that do, for requests that came in over HTTP/2.
	transport, h2 *http.Transport
	rp, rpH2      *httputil.ReverseProxy
	pool          upPool
	cache         cache

	// Serving (serve.go).
	mu            sync.Mutex
	closed        bool
	listeners     []net.Listener
	conns         map[net.Conn]struct{}
	fallback      *http.Server
	handoff       *connQueue
	startFallback sync.Once
}

// poolKey names a sandbox's port among pooled connections:
// <port>.<sandbox id>.torpor.
func poolKey(id string, port int) string { return strconv.Itoa(port) + "." + id + ".torpor" }

// upstream is what the shared transport needs to dial a sandbox.
type upstreamKey struct{}

type upstream struct {
	sb   *torpor.Sandbox
	port int
	host string // <port>.<sandbox id>.torpor
	req  *underWay
	// forwarded: another node forwarded the request, and signed its
	// X-Forwarded-* headers.
	forwarded bool
}

// underWay is a request counted as under way (RequestStarted) until its
// answer begins, or it fails: end says so once. A sandbox is not paused
// for idleness under a request that waits for its answer; once the answer
// begins, its bytes count as traffic while they flow, and a silent stream
// or upgraded connection stops counting after connection_idle_seconds.
type underWay struct {
	eng  Engine
	id   string
	once sync.Once
}

func (u *underWay) end() { u.once.Do(func() { u.eng.RequestEnded(u.id) }) }

// New returns a proxy.
func New(cfg Config) *Proxy {
	p := &Proxy{eng: cfg.Engine, domain: strings.ToLower(cfg.Domain), hold: cfg.HoldLimit, tcp: cfg.TCPPorts, services: cfg.Services, log: cfg.Logger}
	if p.domain == "" {
		p.domain = "localhost"
	}
	p.dotDomain = "." + p.domain
	if p.fleet = cfg.Fleet; p.fleet != nil {
		if p.router = cfg.Router; p.router == nil {
			p.router, _ = cfg.Engine.(Router)
		}
	}
	if p.hold <= 0 {
		p.hold = 30 * time.Second
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	if p.obs = cfg.Observer; p.obs == nil {
		p.obs = nopObserver{}
	}
	dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
		up, ok := ctx.Value(upstreamKey{}).(upstream)
		if !ok {
			return nil, errors.New("proxy: no upstream")
		}
		return p.dial(ctx, up.sb, up.port)
	}
	// DisableCompression: bodies pass as the sandbox sends them, never
	// decompressed on the way.
	p.transport = &http.Transport{
		DialContext:         dial,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}
	p.h2 = &http.Transport{DialContext: dial, IdleConnTimeout: 30 * time.Second, DisableCompression: true, Protocols: new(http.Protocols)}
	p.h2.Protocols.SetUnencryptedHTTP2(true)
	p.rp = p.reverseProxy(p.transport)
	p.rpH2 = p.reverseProxy(p.h2)
	p.fallback, p.handoff = p.newFallback(), newConnQueue()
	return p
}

// dial connects to a sandbox's port; the connection reports its traffic.
func (p *Proxy) dial(ctx context.Context, sb *torpor.Sandbox, port int) (net.Conn, error) {
	c, err := p.eng.DialSandbox(ctx, sb, port)
	if err != nil {
		return nil, err
	}
	id := sb.ID
	return newActiveConn(c, func() { p.eng.NoteTraffic(id) }, sb.Policy().ConnectionIdle), nil
}

func (p *Proxy) reverseProxy(t http.RoundTripper) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			up := pr.In.Context().Value(upstreamKey{}).(upstream)
			pr.Out.URL.Scheme = "http"
			// A host name per sandbox and port keeps their pooled
			// connections apart; the dialer ignores it.
			pr.Out.URL.Host = up.host
			pr.Out.Host = pr.In.Host
			if strings.Contains(pr.Out.URL.RawQuery, QueryToken) {
				q := pr.Out.URL.Query()
				q.Del(QueryToken)
				pr.Out.URL.RawQuery = q.Encode()
			}
			pr.Out.Header.Del(HeaderToken)
			if up.forwarded {
				// The node the client came to said who it is.
				forwardedFrom(pr)
			} else {
				pr.SetXForwarded()
			}
		},
		ModifyResponse: func(resp *http.Response) error {
			// The answer begins.
			resp.Request.Context().Value(upstreamKey{}).(upstream).req.end()
			return nil
		},
		Transport: t,
		// 0: a body of unknown length (a stream, a long poll) or of
		// server-sent events is flushed as it comes; one of known length
		// is written through a buffer, without a flush per write.
		FlushInterval: 0,
		BufferPool:    bufferPool{},
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			up := r.Context().Value(upstreamKey{}).(upstream)
			p.log.Debug("proxy: upstream", "sandbox", up.sb.ID, "port", up.port, "err", err)
			if serr := p.stoppedUnder(up.sb); serr != nil {
				p.writeError(w, serr)
				return
			}
			p.writeError(w, &torpor.Error{Code: torpor.EUnavailable, RetryAfter: time.Second,
				Message: fmt.Sprintf("port %d of the sandbox did not answer", up.port)})
		},
	}
}

// stoppedUnder tells, once a request to a port of sb failed before its
// answer began, whether sb has stopped running the instance the request
// went to (a restart, hibernation or delete raced the request, and ended
// the server): the error that says so, a conflict with the sandbox's state
// or gone; nil when it runs as it did, and its server itself failed.
func (p *Proxy) stoppedUnder(sb *torpor.Sandbox) error {
	cur, _, err := p.lookup(context.Background(), sb.ID)
	switch {
	case err != nil || cur.State == torpor.StateRunning && cur.Handle == sb.Handle:
		return nil
	case cur.State == torpor.StateTerminated:
		return torpor.Errorf(torpor.EGone, "sandbox %s was deleted while the request ran", sb.ID)
	}
	return &torpor.Error{Code: torpor.EConflict, State: cur.State, Reason: "state",
		Message: fmt.Sprintf("sandbox %s stopped running the server the request went to (it is %s now); send the request again", sb.ID, cur.State)}
}

// bufferPool lends the 32 KiB buffers that copy response bodies.
type bufferPool struct{}

var copyBuffers = sync.Pool{New: func() any { return make([]byte, 32<<10) }}

func (bufferPool) Get() []byte  { return copyBuffers.Get().([]byte) }
func (bufferPool) Put(b []byte) { copyBuffers.Put(b) } //nolint:staticcheck // a slice header is small

// target is where a request goes.
type target struct {
	id   string
	port int
}

// route reads the target from the headers or the host name; a CONNECT
// may also name `<sandbox id>:<port>`.
func (p *Proxy) route(r *http.Request) (target, error) {
	id, port := r.Header.Get(HeaderSandboxID), r.Header.Get(HeaderSandboxPort)
	if id == "" {
		id, port = r.Header.Get(HeaderE2BSandboxID), r.Header.Get(HeaderE2BSandboxPort)
	}
	return p.routeTo(id, port, r.Host, r.Method == http.MethodConnect)
}

// routeTo reads the target from the X-Sandbox-Id and X-Sandbox-Port
// headers (id, port) or else from the host name.
func (p *Proxy) routeTo(id, port, host string, connect bool) (target, error) {
	if id != "" {
		port, err := strconv.Atoi(port)
		if err != nil || port < 1 || port > 65535 {
			return target{}, torpor.Invalid(HeaderSandboxPort, "give the port inside the sandbox (1-65535)")
		}
		return target{id: id, port: port}, nil
	}
	host, hostPort := strings.ToLower(host), ""
	if h, port, err := net.SplitHostPort(host); err == nil {
		host, hostPort = h, port
	}
	label, ok := strings.CutSuffix(host, p.dotDomain)
	if !ok && connect {
		port, err := strconv.Atoi(hostPort)
		if err != nil || port < 1 || port > 65535 || strings.Contains(host, ".") || host == "" {
			return target{}, torpor.Invalid("Host", "CONNECT to <sandbox id>:<port> or <port>-<sandbox id>.%s:<any port>", p.domain)
		}
		return target{id: host, port: port}, nil
	}
	portStr, id, ok2 := strings.Cut(label, "-")
	n, err := strconv.Atoi(portStr)
	if !ok || !ok2 || err != nil || n < 1 || n > 65535 || strings.Contains(id, ".") {
		return target{}, torpor.Invalid("Host", "address a sandbox as <port>-<sandbox id>.%s, or with the %s and %s headers", p.domain, HeaderSandboxID, HeaderSandboxPort)
	}
	return target{id: id, port: n}, nil
}

// tokenOK tells whether token opens the sandbox's port.
func tokenOK(sb *torpor.Sandbox, port int, token string) bool {
	return sb.PortPublic(port) || (token != "" && subtle.ConstantTimeCompare([]byte(token), []byte(sb.TrafficToken)) == 1)
}

// ServeHTTP proxies one request.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	err := p.serve(w, r)
	switch {
	case err == nil && r.Method == http.MethodConnect:
		p.obs.ProxyRequest("tunnel")
	case err == nil:
		p.obs.ProxyRequest("ok")
	default:
		p.obs.ProxyRequest(string(torpor.ErrorCodeOf(err)))
	}
	if err != nil {
		if r.Method == http.MethodConnect && torpor.IsCode(err, torpor.EUnauthenticated) {
			// What CONNECT clients (curl --proxy-user, nc -X connect -P)
			// answer with credentials.
			w.Header().Set("Proxy-Authenticate", `Basic realm="torpor sandbox traffic token"`)
			p.writeErrorStatus(w, err, http.StatusProxyAuthRequired)
			return
		}
		p.writeError(w, err)
	}
}

func (p *Proxy) serve(w http.ResponseWriter, r *http.Request) error {
	// The fleet headers go first: nothing after reads them unchecked.
	_, forwarded, err := p.fleet.Verify(r)
	if err != nil {
		return err
	}
	t, err := p.route(r)
	if err != nil {
		return err
	}
	if p.router != nil {
		if done, err := p.toOwner(w, r, t, forwarded); done {
			return err
		}
		if forwarded {
			r = r.WithContext(context.WithValue(r.Context(), forwardedKey{}, true))
		}
	}
	connect := r.Method == http.MethodConnect
	if svc := p.services[t.port]; svc != nil && !connect {
		return p.serveService(w, r, t, svc)
	}
	if connect && !p.tcp.Contains(t.port) {
		return torpor.Errorf(torpor.EForbidden, "this proxy does not forward plain TCP to port %d (proxy_tcp_ports: %q)", t.port, p.tcp.String())
	}
	sb, err := p.reach(r.Context(), t, tokenOf(r, connect), connect)
	if err != nil {
		return err
	}
	req := &underWay{eng: p.eng, id: sb.ID}
	defer req.end()
	return p.pass(w, r, sb, t.port, req)
}

// reach makes a sandbox's port ready for a request that carries token:
// it looks the sandbox up, checks the token before anything can wake it,
// wakes a sleeping one (within the hold limit, and until its port
// accepts), and counts the request as under way (Engine.RequestStarted;
// the caller ends it when the answer begins).
func (p *Proxy) reach(ctx context.Context, t target, token string, connect bool) (*torpor.Sandbox, error) {
	for {
		sb, gen, err := p.lookup(ctx, t.id)
		if torpor.IsCode(err, torpor.ENotFound) {
			// An unknown id answers as a private port of a sandbox that
			// exists does, so that no one can probe ids without a token.
			return nil, authorize(unknownSandbox(t.id), t.port, token, connect)
		}
		if err != nil {
			return nil, err
		}
		if err := authorize(sb, t.port, token, connect); err != nil {
			return nil, err
		}
		switch {
		case sb.State == torpor.StateTerminated:
			return nil, torpor.Errorf(torpor.EGone, "sandbox %s is terminated", sb.ID)
		case sb.State != torpor.StateRunning:
			return p.wake(ctx, t)
		case p.admit(sb.ID, gen):
			return sb, nil
		}
		// It changed as the request came: look again.
	}
}

// wake wakes the sandbox for a request and waits until its port accepts,
// within the hold limit; the request is then under way.
func (p *Proxy) wake(ctx context.Context, t target) (*torpor.Sandbox, error) {
	hold, cancel := context.WithTimeout(ctx, p.hold)
	defer cancel()
	start := time.Now()
	sb, err := p.eng.WakeForTraffic(hold, t.id)
	p.obs.ProxyWake(time.Since(start), err == nil)
	if err != nil {
		if hold.Err() != nil && ctx.Err() == nil {
			return nil, &torpor.Error{Code: torpor.EUnavailable, RetryAfter: 2 * time.Second, Message: "the sandbox did not wake within the proxy's hold limit"}
		}
		return nil, err
	}
	p.eng.RequestStarted(sb.ID)
	// A sandbox that booted again serves once its entrypoint listens (a
	// port the daemon serves itself is there at once).
	if p.services[t.port] != nil {
		return sb, nil
	}
	if err := p.awaitPort(hold, sb, t.port); err != nil {
		p.eng.RequestEnded(sb.ID)
		return nil, err
	}
	return sb, nil
}

// pass sends the request on to the sandbox's port: a tunnel for CONNECT.
func (p *Proxy) pass(w http.ResponseWriter, r *http.Request, sb *torpor.Sandbox, port int, req *underWay) error {
	if r.Method == http.MethodConnect {
		return p.tunnel(w, r, sb, port, req)
	}
	p.forward(w, r, sb, port, req)
	return nil
}

// tokenOf reads the traffic token a request carries: the header, the
// query parameter, or for CONNECT the password of Proxy-Authorization.
func tokenOf(r *http.Request, connect bool) string {
	token := r.Header.Get(HeaderToken)
	if token == "" && connect {
		if _, pw, ok := parseProxyAuth(r.Header.Get("Proxy-Authorization")); ok {
			token = pw
		}
	}
	if token == "" && strings.Contains(r.URL.RawQuery, QueryToken) {
		token = r.URL.Query().Get(QueryToken)
	}
	return token
}

// unknownSandbox stands for an id that names no sandbox when a request
// for it is refused: no port is public and its token is one nobody
// holds, so the refusal is the one a sandbox that exists would give.
func unknownSandbox(id string) *torpor.Sandbox {
	return &torpor.Sandbox{ID: id, TrafficToken: rand.Text()}
}

// authorize checks that token opens the sandbox's port (any does a public
// one).
func authorize(sb *torpor.Sandbox, port int, token string, connect bool) error {
	switch {
	case tokenOK(sb, port, token):
		return nil
	case token == "" && connect:
		return torpor.Errorf(torpor.EUnauthenticated, "port %d of this sandbox is private: send its traffic token in %s or as the password of Proxy-Authorization", port, HeaderToken)
	case token == "":
		return torpor.Errorf(torpor.EUnauthenticated, "port %d of this sandbox is private: send its traffic token in %s or ?%s=", port, HeaderToken, QueryToken)
	default:
		return torpor.Errorf(torpor.EForbidden, "wrong traffic token")
	}
}

// awaitPort waits until the port accepts, within ctx.
func (p *Proxy) awaitPort(ctx context.Context, sb *torpor.Sandbox, port int) error {
	for delay := 5 * time.Millisecond; ; delay = min(delay*2, 250*time.Millisecond) {
		c, err := p.eng.DialSandbox(ctx, sb, port)
		if err == nil {
			c.Close()
			return nil
		}
		select {
		case <-ctx.Done():
			return &torpor.Error{Code: torpor.EUnavailable, RetryAfter: 2 * time.Second,
				Message: fmt.Sprintf("nothing listens on port %d of the sandbox yet", port)}
		case <-time.After(delay):
		}
	}
}

// forward proxies a request that net/http serves (the proxy's own loop,
// h1.go, takes the plain HTTP/1.1 ones) to the sandbox's port: over
// cleartext HTTP/2 when it came in over HTTP/2 and the sandbox's server
// speaks it, else over HTTP/1.1, both through httputil.ReverseProxy.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, sb *torpor.Sandbox, port int, req *underWay) {
	up := upstream{sb: sb, port: port, host: poolKey(sb.ID, port), req: req, forwarded: r.Context().Value(forwardedKey{}) != nil}
	ctx := context.WithValue(r.Context(), upstreamKey{}, up)
	// The Transport's kept-alive connections are parked between requests
	// like the loop's. (An HTTP/2 connection, shared among requests, is
	// never put back idle, so never parked.)
	var conn net.Conn
	ctx = httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{
		GotConn: func(i httptrace.GotConnInfo) {
			conn = i.Conn
			park(conn, false)
		},
		PutIdleConn: func(err error) {
			if err == nil && conn != nil {
				park(conn, true)
			}
		},
	})
	if r.ProtoMajor == 2 && p.speaksH2C(ctx, sb, port) {
		p.rpH2.ServeHTTP(w, r.WithContext(ctx))
		return
	}
	p.rp.ServeHTTP(w, r.WithContext(ctx))
}

// activeConn reports traffic on a connection to a sandbox, at most once a
// second: while bytes flow, and while it stays open for up to idle after
// its last byte (connection_idle_seconds). A long stream keeps its sandbox
// awake; a silent socket stops counting.
type activeConn struct {
	net.Conn
	note func()
	idle time.Duration
	// parked: a kept-alive connection between requests, which is no one's
	// open connection and does not count.
	parked   atomic.Bool
	last     atomic.Int64 // unix nanos of the last byte
	reported atomic.Int64 // unix nanos of the last report
	done     chan struct{}
	once     sync.Once
}

func newActiveConn(c net.Conn, note func(), idle time.Duration) *activeConn {
	ac := &activeConn{Conn: c, note: note, idle: idle, done: make(chan struct{})}
	ac.last.Store(time.Now().UnixNano())
	if idle > 0 {
		go ac.keepAwake()
	}
	return ac
}

// keepAwake reports an open connection whose last byte is recent enough.
func (c *activeConn) keepAwake() {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-c.done:
			return
		case <-t.C:
			if !c.parked.Load() && time.Since(time.Unix(0, c.last.Load())) < c.idle {
				c.report()
			}
		}
	}
}

// park marks a connection to a sandbox as kept alive between requests (or
// not); conn may be any connection.
func park(conn net.Conn, parked bool) {
	if c, ok := conn.(*activeConn); ok {
		c.parked.Store(parked)
	}
}

func (c *activeConn) report() {
	now := time.Now().UnixNano()
	if now-c.reported.Load() >= int64(time.Second) {
		c.reported.Store(now)
		c.note()
	}
}

func (c *activeConn) flowed() {
	c.last.Store(time.Now().UnixNano())
	c.report()
}

func (c *activeConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		c.flowed()
	}
	return n, err
}

func (c *activeConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	if n > 0 {
		c.flowed()
	}
	return n, err
}

func (c *activeConn) Close() error {
	c.once.Do(func() { close(c.done) })
	return c.Conn.Close()
}

// CloseWrite half-closes the connection when it can (a TCP one can).
func (c *activeConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Close()
}

// writeError answers in the API's error shape; paused-without-auto-resume
// is a 409 whose body says so, a full node a 503 with Retry-After.
func (p *Proxy) writeError(w http.ResponseWriter, err error) {
	p.writeErrorStatus(w, err, 0)
}

// writeErrorStatus is writeError with the status given (0: from the
// error table).
func (p *Proxy) writeErrorStatus(w http.ResponseWriter, err error, status int) {
	a := p.errorAnswer(err, status)
	if a.retryAfter != "" {
		w.Header().Set("Retry-After", a.retryAfter)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(a.status)
	io.WriteString(w, a.body)
}

// answer is an error response: its status, Retry-After (or "") and body.
type answer struct {
	status     int
	retryAfter string
	body       string
}

func (p *Proxy) errorAnswer(err error, status int) answer {
	e := torpor.AsError(err)
	if status == 0 {
		status = wire.Status(e.Code)
	}
	if e.Code == torpor.EConflict && e.Reason == "capacity" {
		status = http.StatusServiceUnavailable
	}
	if e.Code == torpor.EInternal {
		p.log.Error("proxy", "err", err)
	}
	a := answer{status: status, body: fmt.Sprintf(`{"error":{"code":%q,"message":%q,"reason":%q,"state":%q}}`+"\n", e.Code, e.Message, e.Reason, e.State)}
	if e.RetryAfter > 0 || status == http.StatusServiceUnavailable {
		secs := int((e.RetryAfter + time.Second - 1) / time.Second)
		a.retryAfter = strconv.Itoa(max(secs, 1))
	}
	return a
}
