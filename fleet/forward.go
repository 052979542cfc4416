package fleet

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"sync"
	"time"

	"github.com/torpor-dev/torpor"
)

// Target is the listener of the owner node that a request goes to.
type Target int

const (
	// API is the owner's API listener (native /v1 and E2B's control
	// plane). The user's credentials (Authorization, X-API-Key, the
	// session cookie) stay behind: the owner acts for the signed
	// identity.
	API Target = iota
	// Proxy is the owner's port proxy (a sandbox's ports, envd). The
	// request goes as it came, Host and credentials included: those are
	// the sandbox's tokens, which the owner checks itself.
	Proxy
)

func (t Target) String() string {
	if t == Proxy {
		return "proxy"
	}
	return "api"
}

// forwarder holds what every forwarded request shares: one transport per
// protocol, with kept-alive connections to the other nodes.
type forwarder struct {
	f      *Fleet
	dialer *net.Dialer
	// h1 speaks HTTP/1.1 (and upgrades); h2c cleartext HTTP/2, for
	// requests that came to the port proxy over HTTP/2 (gRPC), so that
	// the owner forwards them to the sandbox as HTTP/2 too.
	h1, h2c   *http.Transport
	rp, rpH2C *httputil.ReverseProxy
}

// forwarding is one forwarded request's state, in its context.
type forwarding struct {
	node   torpor.Node
	addr   string
	target Target
	id     Identity
	// began: the owner's answer began (the error handler must not
	// answer any more); err is why it could not be reached, if it was
	// not.
	began bool
	err   error
}

type forwardingKey struct{}

func newForwarder(f *Fleet, d *net.Dialer) forwarder {
	fw := forwarder{f: f, dialer: d}
	// No Proxy: nodes reach one another directly, whatever the
	// environment says. No ResponseHeaderTimeout: an exec or a wake-up
	// takes as long as it takes, and the client's own context bounds it.
	fw.h1 = &http.Transport{
		DialContext:         d.DialContext,
		MaxIdleConns:        256,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	fw.h2c = &http.Transport{DialContext: d.DialContext, IdleConnTimeout: 90 * time.Second, DisableCompression: true,
		Protocols: new(http.Protocols)}
	fw.h2c.Protocols.SetUnencryptedHTTP2(true)
	fw.rp = fw.reverseProxy(fw.h1)
	fw.rpH2C = fw.reverseProxy(fw.h2c)
	return fw
}

func (fw *forwarder) reverseProxy(t http.RoundTripper) *httputil.ReverseProxy {
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			st := pr.In.Context().Value(forwardingKey{}).(*forwarding)
			pr.Out.URL.Scheme = "http"
			pr.Out.URL.Host = st.addr
			if st.target == API {
				// The owner acts for the signed identity: the
				// user's credentials are the front node's to check.
				pr.Out.Host = st.addr
				pr.Out.Header.Del("Authorization")
				pr.Out.Header.Del("X-Api-Key")
				pr.Out.Header.Del("Cookie")
			} else {
				// The owner's proxy routes by the Host.
				pr.Out.Host = pr.In.Host
			}
			pr.SetXForwarded()
			fw.f.Sign(pr.Out, st.id)
		},
		ModifyResponse: func(resp *http.Response) error {
			resp.Request.Context().Value(forwardingKey{}).(*forwarding).began = true
			return nil
		},
		Transport: t,
		ErrorLog:  slog.NewLogLogger(fw.f.log.Handler(), slog.LevelWarn),
		// -1: every write is flushed at once, so that an exec's output,
		// server-sent events and a process's stream arrive as the owner
		// writes them.
		FlushInterval: -1,
		ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
			st := r.Context().Value(forwardingKey{}).(*forwarding)
			if st.began {
				// An upgraded connection that failed on the way: its
				// answer was sent already.
				fw.f.log.Debug("fleet: forwarded connection", "node", st.node.Name, "err", err)
				return
			}
			st.err = err
		},
	}
}

// Forward sends r to node's target listener, signed for id, and copies
// the answer back as it comes: streams and server-sent events flush at
// every write, an upgrade (WebSocket) becomes a two-way connection, and a
// CONNECT a tunnel through the owner's proxy. It returns nil once the
// owner answered, whatever its answer. When the owner could not be reached
// (refused, timed out, gone before its answer began) nothing is written
// and the error returned is unavailable with a Retry-After of a second,
// for the caller to write in its API's shape; when the client went away,
// it is the context's error.
func (f *Fleet) Forward(w http.ResponseWriter, r *http.Request, node torpor.Node, t Target, id Identity) error {
	addr := node.Address
	if t == Proxy {
		addr = node.ProxyAddress
	}
	if addr == "" {
		return &torpor.Error{Code: torpor.EUnavailable, RetryAfter: time.Second,
			Message: fmt.Sprintf("sandbox is on node %s, which has no %s address", node.Name, t)}
	}
	if r.Method == http.MethodConnect {
		return f.tunnel(w, r, node, addr)
	}
	st := &forwarding{node: node, addr: addr, target: t, id: id}
	r = r.WithContext(context.WithValue(r.Context(), forwardingKey{}, st))
	if t == Proxy && r.ProtoMajor == 2 {
		f.fwd.rpH2C.ServeHTTP(w, r)
	} else {
		f.fwd.rp.ServeHTTP(w, r)
	}
	if st.err != nil {
		return f.unreachable(r, node, st.err)
	}
	return nil
}

// unreachable is the error for a node that did not answer.
func (f *Fleet) unreachable(r *http.Request, node torpor.Node, err error) error {
	if cerr := r.Context().Err(); cerr != nil {
		return cerr
	}
	f.log.Warn("fleet: node unreachable", "node", node.Name, "method", r.Method, "path", r.URL.Path, "err", err)
	return &torpor.Error{Code: torpor.EUnavailable, RetryAfter: time.Second,
		Message: fmt.Sprintf("the sandbox's node %s cannot be reached; retry", node.Name)}
}

// tunnel forwards a CONNECT to the owner's proxy: it sends the CONNECT on
// (its Proxy-Authorization included: the sandbox's traffic token), and
// once the owner answers 200, joins the client's connection (HTTP/1.1)
// or stream (HTTP/2) to it. Any other answer is copied back.
func (f *Fleet) tunnel(w http.ResponseWriter, r *http.Request, node torpor.Node, addr string) error {
	ctx := r.Context()
	up, err := f.fwd.dialer.DialContext(ctx, "tcp", addr)
	if err != nil {
		return f.unreachable(r, node, err)
	}
	defer up.Close()
	stop := context.AfterFunc(ctx, func() { up.Close() })
	defer stop()
	out := &http.Request{Method: http.MethodConnect, URL: &url.URL{Host: r.Host}, Host: r.Host,
		Header: r.Header.Clone(), Proto: "HTTP/1.1", ProtoMajor: 1, ProtoMinor: 1}
	for _, h := range []string{"Connection", "Proxy-Connection", "Keep-Alive", "Te", "Trailer", "Transfer-Encoding", "Upgrade"} {
		out.Header.Del(h)
	}
	if out.Header.Get("User-Agent") == "" {
		out.Header["User-Agent"] = []string{""}
	}
	if ip, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		out.Header.Set("X-Forwarded-For", ip)
	} else {
		out.Header.Del("X-Forwarded-For")
	}
	out.Header.Del("X-Forwarded-Proto")
	f.Sign(out, Identity{})
	if err := out.Write(up); err != nil {
		return f.unreachable(r, node, err)
	}
	br := bufio.NewReader(up)
	resp, err := http.ReadResponse(br, out)
	if err != nil {
		return f.unreachable(r, node, err)
	}
	if resp.StatusCode != http.StatusOK {
		defer resp.Body.Close()
		for k, vs := range resp.Header {
			w.Header()[k] = vs
		}
		w.WriteHeader(resp.StatusCode)
		_, _ = io.Copy(w, resp.Body)
		return nil
	}
	var from io.Reader = up
	if n := br.Buffered(); n > 0 { // bytes the sandbox sent at once
		from = io.MultiReader(io.LimitReader(br, int64(n)), up)
	}
	if err := ServeTunnel(w, r, up, from); err != nil {
		return fmt.Errorf("fleet: %w", err)
	}
	return nil
}

// ServeTunnel answers a CONNECT whose upstream connection up is open: it
// answers 200 and joins the client's connection (HTTP/1.1, hijacked) or
// the request's stream (HTTP/2) to up, copying bytes both ways until both
// directions end (see join). from is what is read from up: up itself, or
// up behind bytes already read from it. It returns an error only when the
// client's connection cannot be hijacked, before anything was written: the
// caller answers that one. The fleet's tunnels and the port proxy's
// (package proxy) are served so.
func ServeTunnel(w http.ResponseWriter, r *http.Request, up net.Conn, from io.Reader) error {
	if r.ProtoMajor == 1 {
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return fmt.Errorf("hijack: %w", err)
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Time{})
		if _, err := brw.WriteString("HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
			return nil
		}
		if err := brw.Flush(); err != nil {
			return nil
		}
		var in io.Reader = conn
		if n := brw.Reader.Buffered(); n > 0 { // sent before our answer
			in = io.MultiReader(io.LimitReader(brw.Reader, int64(n)), conn)
		}
		join(conn, in, up, from)
		return nil
	}
	rc := http.NewResponseController(w)
	w.WriteHeader(http.StatusOK)
	if err := rc.Flush(); err != nil {
		return nil
	}
	join(flusher{w, rc}, r.Body, up, from)
	return nil
}

// join copies in to up and from to client until both directions end;
// the end of each half-closes the other side where it can.
func join(client io.Writer, in io.Reader, up net.Conn, from io.Reader) {
	var wg sync.WaitGroup
	wg.Go(func() {
		_, _ = io.Copy(up, in)
		if cw, ok := up.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
	})
	_, err := io.Copy(client, from)
	if cw, ok := client.(interface{ CloseWrite() error }); ok && err == nil {
		_ = cw.CloseWrite()
	} else if c, ok := client.(io.Closer); ok {
		_ = c.Close()
	}
	if err != nil {
		up.Close()
	}
	wg.Wait()
}

// flusher flushes after every write, so that a tunnel over HTTP/2
// streams.
type flusher struct {
	w  io.Writer
	rc *http.ResponseController
}

func (f flusher) Write(b []byte) (int, error) {
	n, err := f.w.Write(b)
	if err == nil {
		err = f.rc.Flush()
	}
	return n, err
}

// OwnerMoved answers a forwarded request for a sandbox that this node no
// longer owns: it moved to node as the request came. The sending node
// retries, and then finds the new owner.
func OwnerMoved(id, node string) error {
	return &torpor.Error{Code: torpor.EUnavailable, RetryAfter: time.Second,
		Message: fmt.Sprintf("sandbox %s moved to node %s as the request came; retry", id, node)}
}

// KeepBody reads up to limit bytes of r's body, for a node to look into
// before it forwards r (a create, to place it), and leaves r.Body to be
// read again from its start, by the handler or by Forward. ok is false
// when the body could not be read or is over limit: it stays here, for
// the handler to refuse.
func KeepBody(r *http.Request, limit int64) (body []byte, ok bool) {
	body, err := io.ReadAll(io.LimitReader(r.Body, limit+1))
	rest := r.Body
	r.Body = readAgain{io.MultiReader(bytes.NewReader(body), rest), rest}
	return body, err == nil && int64(len(body)) <= limit
}

// readAgain is a body whose first bytes were read already: they are read
// again first.
type readAgain struct {
	io.Reader
	io.Closer
}
