// Package proxy is torpor's port proxy: it routes HTTP (WebSocket and
// server-sent events included) to a port inside a sandbox, addressed as
// `<port>-<sandbox id>.<domain>` or by the X-Sandbox-Id and X-Sandbox-Port
// headers; it checks the sandbox's traffic token for private ports, wakes
// a paused or hibernated sandbox on the first request (auto_resume), and
// reports traffic to the idle engine while bytes flow.
package proxy

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/wire"
)

// Engine is what the proxy needs of the lifecycle engine.
type Engine interface {
	Lookup(ctx context.Context, id string) (*torpor.Sandbox, error)
	WakeForTraffic(ctx context.Context, id string) (*torpor.Sandbox, error)
	DialSandbox(ctx context.Context, sb *torpor.Sandbox, port int) (net.Conn, error)
	NoteTraffic(id string)
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
	Logger    *slog.Logger
}

// Proxy is an http.Handler.
type Proxy struct {
	eng    Engine
	domain string
	hold   time.Duration
	log    *slog.Logger
	// transport is shared by every request, so connections to a sandbox's
	// port are kept alive and reused; its dialer reads the target from the
	// request's upstream host name, <port>.<sandbox id>.torpor.
	transport *http.Transport
	rp        *httputil.ReverseProxy
}

// upstream is what the shared transport needs to dial a sandbox.
type upstreamKey struct{}

type upstream struct {
	sb   *torpor.Sandbox
	port int
}

// New returns a proxy.
func New(cfg Config) *Proxy {
	p := &Proxy{eng: cfg.Engine, domain: strings.ToLower(cfg.Domain), hold: cfg.HoldLimit, log: cfg.Logger}
	if p.domain == "" {
		p.domain = "localhost"
	}
	if p.hold <= 0 {
		p.hold = 30 * time.Second
	}
	if p.log == nil {
		p.log = slog.New(slog.DiscardHandler)
	}
	p.transport = &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			up, ok := ctx.Value(upstreamKey{}).(upstream)
			if !ok {
				return nil, errors.New("proxy: no upstream")
			}
			c, err := p.eng.DialSandbox(ctx, up.sb, up.port)
			if err != nil {
				return nil, err
			}
			id := up.sb.ID
			return newActiveConn(c, func() { p.eng.NoteTraffic(id) }, up.sb.Policy().ConnectionIdle), nil
		},
		MaxIdleConnsPerHost: 32,
		IdleConnTimeout:     30 * time.Second,
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			up := pr.In.Context().Value(upstreamKey{}).(upstream)
			pr.Out.URL.Scheme = "http"
			// A host name per sandbox and port keeps their pooled
			// connections apart; the dialer ignores it.
			pr.Out.URL.Host = fmt.Sprintf("%d.%s.torpor", up.port, up.sb.ID)
			pr.Out.Host = pr.In.Host
			q := pr.Out.URL.Query()
			if q.Has(QueryToken) {
				q.Del(QueryToken)
				pr.Out.URL.RawQuery = q.Encode()
			}
			pr.Out.Header.Del(HeaderToken)
			pr.SetXForwarded()
		},
		Transport:     p.transport,
		FlushInterval: -1, // stream (server-sent events, long polls) as it comes
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			up := r.Context().Value(upstreamKey{}).(upstream)
			p.log.Debug("proxy: upstream", "sandbox", up.sb.ID, "port", up.port, "err", err)
			p.writeError(w, &torpor.Error{Code: torpor.EUnavailable, RetryAfter: time.Second,
				Message: fmt.Sprintf("port %d of the sandbox did not answer", up.port)})
		},
	}
	return p
}

// target is where a request goes.
type target struct {
	id   string
	port int
}

// route reads the target from the host name or the headers.
func (p *Proxy) route(r *http.Request) (target, error) {
	if id := r.Header.Get(HeaderSandboxID); id != "" {
		port, err := strconv.Atoi(r.Header.Get(HeaderSandboxPort))
		if err != nil || port < 1 || port > 65535 {
			return target{}, torpor.Invalid(HeaderSandboxPort, "give the port inside the sandbox (1-65535)")
		}
		return target{id: id, port: port}, nil
	}
	host := strings.ToLower(r.Host)
	if h, _, err := net.SplitHostPort(host); err == nil {
		host = h
	}
	label, ok := strings.CutSuffix(host, "."+p.domain)
	portStr, id, ok2 := strings.Cut(label, "-")
	port, err := strconv.Atoi(portStr)
	if !ok || !ok2 || err != nil || port < 1 || port > 65535 || strings.Contains(id, ".") {
		return target{}, torpor.Invalid("Host", "address a sandbox as <port>-<sandbox id>.%s, or with the %s and %s headers", p.domain, HeaderSandboxID, HeaderSandboxPort)
	}
	return target{id: id, port: port}, nil
}

// ServeHTTP proxies one request.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if err := p.serve(w, r); err != nil {
		p.writeError(w, err)
	}
}

func (p *Proxy) serve(w http.ResponseWriter, r *http.Request) error {
	t, err := p.route(r)
	if err != nil {
		return err
	}
	sb, err := p.eng.Lookup(r.Context(), t.id)
	if err != nil {
		return err
	}
	// Check access before anything can wake the sandbox.
	if !sb.PortPublic(t.port) {
		token := r.Header.Get(HeaderToken)
		if token == "" {
			token = r.URL.Query().Get(QueryToken)
		}
		switch {
		case token == "":
			return torpor.Errorf(torpor.EUnauthenticated, "port %d of this sandbox is private: send its traffic token in %s or ?%s=", t.port, HeaderToken, QueryToken)
		case subtle.ConstantTimeCompare([]byte(token), []byte(sb.TrafficToken)) != 1:
			return torpor.Errorf(torpor.EForbidden, "wrong traffic token")
		}
	}
	if sb.State == torpor.StateTerminated {
		return torpor.Errorf(torpor.EGone, "sandbox %s is terminated", sb.ID)
	}
	if sb.State != torpor.StateRunning {
		ctx, cancel := context.WithTimeout(r.Context(), p.hold)
		defer cancel()
		if sb, err = p.eng.WakeForTraffic(ctx, t.id); err != nil {
			if ctx.Err() != nil && r.Context().Err() == nil {
				return &torpor.Error{Code: torpor.EUnavailable, RetryAfter: 2 * time.Second, Message: "the sandbox did not wake within the proxy's hold limit"}
			}
			return err
		}
		// A sandbox that booted again serves once its entrypoint listens.
		if err := p.awaitPort(ctx, sb, t.port); err != nil {
			return err
		}
	}
	p.eng.NoteTraffic(sb.ID)
	p.forward(w, r, sb, t.port)
	p.eng.NoteTraffic(sb.ID)
	return nil
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

// forward proxies the request to the sandbox's port.
func (p *Proxy) forward(w http.ResponseWriter, r *http.Request, sb *torpor.Sandbox, port int) {
	ctx := context.WithValue(r.Context(), upstreamKey{}, upstream{sb: sb, port: port})
	p.rp.ServeHTTP(w, r.WithContext(ctx))
}

// activeConn reports traffic on a connection to a sandbox, at most once a
// second: while bytes flow, and while it stays open for up to idle after
// its last byte (connection_idle_seconds). A long stream keeps its sandbox
// awake; a silent socket stops counting.
type activeConn struct {
	net.Conn
	note     func()
	idle     time.Duration
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
			if time.Since(time.Unix(0, c.last.Load())) < c.idle {
				c.report()
			}
		}
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

// writeError answers in the API's error shape; paused-without-auto-resume
// is a 409 whose body says so, a full node a 503 with Retry-After.
func (p *Proxy) writeError(w http.ResponseWriter, err error) {
	e := torpor.AsError(err)
	status := wire.Status(e.Code)
	if e.Code == torpor.EConflict && e.Reason == "capacity" {
		status = http.StatusServiceUnavailable
	}
	if e.Code == torpor.EInternal {
		p.log.Error("proxy", "err", err)
	}
	if e.RetryAfter > 0 || status == http.StatusServiceUnavailable {
		secs := int((e.RetryAfter + time.Second - 1) / time.Second)
		w.Header().Set("Retry-After", strconv.Itoa(max(secs, 1)))
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"error":{"code":%q,"message":%q,"reason":%q,"state":%q}}`+"\n", e.Code, e.Message, e.Reason, e.State)
}
