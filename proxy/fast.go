package proxy

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor"
)

// The fast path forwards a plain HTTP/1.1 request (no upgrade, no
// Expect, a body of known length) over a kept-alive connection of its
// own pool, writing the request and reading the response on the
// handler's goroutine. net/http's Transport hands every request to two
// goroutines per connection and httputil.ReverseProxy clones each
// request; on a small machine that doubled the proxy's cost. Everything
// else (upgrades, chunked uploads, HTTP/2) goes through ReverseProxy.

// upConn is a kept-alive HTTP/1.1 connection to a sandbox's port.
type upConn struct {
	c    net.Conn
	br   *bufio.Reader
	bw   *bufio.Writer
	idle time.Time // when it went back to the pool
}

// upPool keeps idle connections per sandbox port.
type upPool struct {
	mu    sync.Mutex
	idle  map[string][]*upConn
	sweep *time.Timer
}

const (
	maxIdlePerPort = 64
	idleTimeout    = 30 * time.Second
)

func (p *upPool) get(key string) *upConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	for l := p.idle[key]; len(l) > 0; l = p.idle[key] {
		uc := l[len(l)-1]
		p.idle[key] = l[:len(l)-1]
		if time.Since(uc.idle) < idleTimeout {
			return uc
		}
		uc.c.Close()
	}
	return nil
}

func (p *upPool) put(key string, uc *upConn) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.idle == nil {
		p.idle = map[string][]*upConn{}
	}
	if len(p.idle[key]) >= maxIdlePerPort {
		uc.c.Close()
		return
	}
	uc.idle = time.Now()
	p.idle[key] = append(p.idle[key], uc)
	if p.sweep == nil {
		p.sweep = time.AfterFunc(idleTimeout, p.closeIdle)
	}
}

// closeIdle closes the connections idle for idleTimeout, and looks again
// later while any are left.
func (p *upPool) closeIdle() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sweep = nil
	for key, l := range p.idle {
		kept := l[:0]
		for _, uc := range l {
			if time.Since(uc.idle) < idleTimeout {
				kept = append(kept, uc)
			} else {
				uc.c.Close()
			}
		}
		if len(kept) == 0 {
			delete(p.idle, key)
		} else {
			p.idle[key] = kept
		}
	}
	if len(p.idle) > 0 {
		p.sweep = time.AfterFunc(idleTimeout, p.closeIdle)
	}
}

var (
	readers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, 4096) }}
	writers = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, 4096) }}
)

// fastPathOK tells whether a request can take the fast path.
func fastPathOK(r *http.Request) bool {
	return r.ProtoMajor == 1 && r.ContentLength >= 0 && len(r.TransferEncoding) == 0 &&
		r.Header.Get("Upgrade") == "" && r.Header.Get("Expect") == "" && r.Method != http.MethodConnect
}

// forwardFast forwards r on the fast path.
func (p *Proxy) forwardFast(w http.ResponseWriter, r *http.Request, up upstream) {
	key := up.host
	uc := p.pool.get(key)
	// A body cannot be sent twice: make sure a kept-alive connection
	// still stands (the server may have closed it, or gone with its
	// sandbox) before giving it one. A request without a body is simply
	// sent again on a new connection if the old one fails.
	for uc != nil && r.ContentLength > 0 && !uc.alive() {
		uc.close()
		uc = p.pool.get(key)
	}
	reused := uc != nil
	var resp *http.Response
	for {
		var err error
		if uc == nil {
			if uc, err = p.dialUp(r.Context(), up); err != nil {
				p.upstreamError(w, up, err)
				return
			}
		}
		resp, err = roundTrip(r, uc, up)
		if err == nil {
			break
		}
		uc.close()
		// A kept-alive connection the server closed meanwhile: once
		// more on a new one, when nothing of the request was consumed.
		if reused && r.ContentLength == 0 && r.Context().Err() == nil {
			reused, uc = false, nil
			continue
		}
		p.upstreamError(w, up, err)
		return
	}
	// A client that goes away ends the wait for a slow body too.
	stop := context.AfterFunc(r.Context(), func() { _ = uc.c.SetDeadline(time.Unix(1, 0)) })
	ok := p.copyResponse(w, r, resp)
	if stop() && ok && !resp.Close {
		resp.Body.Close()
		p.pool.put(key, uc)
		return
	}
	uc.close()
	if !ok {
		// The client got part of a response: end its connection too.
		panic(http.ErrAbortHandler)
	}
}

func (p *Proxy) dialUp(ctx context.Context, up upstream) (*upConn, error) {
	c, err := p.dial(ctx, up.sb, up.port)
	if err != nil {
		return nil, err
	}
	br := readers.Get().(*bufio.Reader)
	br.Reset(c)
	bw := writers.Get().(*bufio.Writer)
	bw.Reset(c)
	return &upConn{c: c, br: br, bw: bw}, nil
}

// alive tells whether an idle connection is still open: a peek at its
// socket that would block, not an end of file, an error or bytes nobody
// asked for.
func (uc *upConn) alive() bool {
	if uc.br.Buffered() > 0 {
		return false
	}
	c := uc.c
	if ac, ok := c.(*activeConn); ok {
		c = ac.Conn
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return true // cannot tell; a failure will say
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	alive := true
	var b [1]byte
	_ = rc.Read(func(fd uintptr) bool {
		_, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		alive = errors.Is(err, unix.EAGAIN)
		return true
	})
	return alive
}

func (uc *upConn) close() {
	uc.c.Close()
	uc.br.Reset(nil)
	readers.Put(uc.br)
	uc.bw.Reset(nil)
	writers.Put(uc.bw)
}

func (p *Proxy) upstreamError(w http.ResponseWriter, up upstream, err error) {
	p.log.Debug("proxy: upstream", "sandbox", up.sb.ID, "port", up.port, "err", err)
	p.writeError(w, &torpor.Error{Code: torpor.EUnavailable, RetryAfter: time.Second,
		Message: fmt.Sprintf("port %d of the sandbox did not answer", up.port)})
}

// hopHeaders are dropped on the way, as RFC 9110 says (and the
// traffic token).
var hopHeaders = map[string]bool{
	"Connection": true, "Proxy-Connection": true, "Keep-Alive": true, "Proxy-Authenticate": true,
	"Proxy-Authorization": true, "Te": true, "Trailer": true, "Transfer-Encoding": true, "Upgrade": true,
}

// roundTrip writes r to the connection and reads the response head. It
// ends the wait when the client goes away.
func roundTrip(r *http.Request, uc *upConn, up upstream) (*http.Response, error) {
	stop := context.AfterFunc(r.Context(), func() { _ = uc.c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	bw := uc.bw
	uri := r.URL.RequestURI()
	if strings.Contains(r.URL.RawQuery, QueryToken) {
		u := *r.URL
		q := u.Query()
		q.Del(QueryToken)
		u.RawQuery = q.Encode()
		uri = u.RequestURI()
	}
	bw.WriteString(r.Method)
	bw.WriteByte(' ')
	bw.WriteString(uri)
	bw.WriteString(" HTTP/1.1\r\nHost: ")
	bw.WriteString(r.Host)
	bw.WriteString("\r\n")
	dropped := connectionTokens(r.Header)
	for k, vs := range r.Header {
		switch {
		case hopHeaders[k] || k == HeaderToken || dropped[k]:
			if k == "Te" && hasToken(vs, "trailers") {
				bw.WriteString("Te: trailers\r\n")
			}
			continue
		case k == "X-Forwarded-For" || k == "X-Forwarded-Host" || k == "X-Forwarded-Proto" || k == "Forwarded" || k == "Content-Length":
			// The client's forwarding headers are not trusted (as
			// ReverseProxy.Rewrite does): the proxy sets its own.
			continue
		}
		for _, v := range vs {
			bw.WriteString(k)
			bw.WriteString(": ")
			bw.WriteString(v)
			bw.WriteString("\r\n")
		}
	}
	if ip, _, err := net.SplitHostPort(r.RemoteAddr); err == nil {
		bw.WriteString("X-Forwarded-For: ")
		bw.WriteString(ip)
		bw.WriteString("\r\n")
	}
	bw.WriteString("X-Forwarded-Host: ")
	bw.WriteString(r.Host)
	bw.WriteString("\r\nX-Forwarded-Proto: http\r\n")
	if r.ContentLength > 0 || (r.ContentLength == 0 && methodWithBody(r.Method)) {
		bw.WriteString("Content-Length: ")
		bw.WriteString(strconv.FormatInt(r.ContentLength, 10))
		bw.WriteString("\r\n")
	}
	bw.WriteString("\r\n")
	if r.ContentLength > 0 {
		if _, err := io.CopyN(bw, r.Body, r.ContentLength); err != nil {
			return nil, err
		}
	}
	if err := bw.Flush(); err != nil {
		return nil, err
	}
	for {
		resp, err := http.ReadResponse(uc.br, r)
		if err != nil {
			return nil, err
		}
		if resp.StatusCode >= 200 || resp.StatusCode == http.StatusSwitchingProtocols {
			if resp.StatusCode == http.StatusSwitchingProtocols {
				return nil, errors.New("an upgrade nobody asked for")
			}
			return resp, nil
		}
		// 1xx (such as 103 Early Hints): read on; the final answer follows.
	}
}

func methodWithBody(m string) bool { return m == "POST" || m == "PUT" || m == "PATCH" }

// connectionTokens are the headers the Connection header names.
func connectionTokens(h http.Header) map[string]bool {
	vs := h["Connection"]
	if len(vs) == 0 {
		return nil
	}
	m := map[string]bool{}
	for _, v := range vs {
		for _, f := range strings.Split(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				m[textproto.CanonicalMIMEHeaderKey(f)] = true
			}
		}
	}
	return m
}

func hasToken(vs []string, token string) bool {
	for _, v := range vs {
		for _, f := range strings.Split(v, ",") {
			if strings.EqualFold(strings.TrimSpace(f), token) {
				return true
			}
		}
	}
	return false
}

// copyResponse sends the response to the client; a stream (unknown
// length, server-sent events) is flushed as it comes. It returns false
// when the body could not be copied whole.
func (p *Proxy) copyResponse(w http.ResponseWriter, r *http.Request, resp *http.Response) bool {
	dropped := connectionTokens(resp.Header)
	h := w.Header()
	for k, vs := range resp.Header {
		if hopHeaders[k] || dropped[k] {
			continue
		}
		h[k] = vs
	}
	for k := range resp.Trailer {
		h.Add("Trailer", k)
	}
	if resp.ContentLength >= 0 && r.Method != http.MethodHead && resp.StatusCode != http.StatusNoContent && resp.StatusCode != http.StatusNotModified {
		h.Set("Content-Length", strconv.FormatInt(resp.ContentLength, 10))
	}
	w.WriteHeader(resp.StatusCode)
	var dst io.Writer = w
	if resp.ContentLength < 0 || isEventStream(resp.Header.Get("Content-Type")) {
		dst = flushWriter{w, http.NewResponseController(w)}
	}
	buf := copyBuffers.Get().([]byte)
	_, err := io.CopyBuffer(dst, struct{ io.Reader }{resp.Body}, buf)
	copyBuffers.Put(buf) //nolint:staticcheck // a slice header is small
	if err != nil {
		return false
	}
	for k, vs := range resp.Trailer {
		h[k] = vs
	}
	return true
}

func isEventStream(ct string) bool {
	if ct == "" {
		return false
	}
	mt, _, _ := mime.ParseMediaType(ct)
	return mt == "text/event-stream"
}
