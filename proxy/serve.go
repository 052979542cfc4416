package proxy

import (
	"bufio"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"
)

// Serving. Serve accepts the proxy's connections itself: plain HTTP/1.1
// requests are served by the proxy's own loop (h1.go), which reads and
// writes the bytes of the request and the response with no net/http
// server in between. Everything else — HTTP/2, upgrades, CONNECT,
// anything whose framing the loop does not read with certainty — is
// handed, at a request boundary and with the bytes already read, to a
// net/http server whose handler is ServeHTTP; the connection stays there
// from then on.

// headerTimeout bounds the wait for the rest of a request head once its
// first byte came; keepAliveIdle the wait for the next request on an
// idle connection.
const (
	headerTimeout = 10 * time.Second
	keepAliveIdle = 2 * time.Minute
)

// Serve serves the proxy on ln until ln fails or Close is called; then it
// returns http.ErrServerClosed.
func (p *Proxy) Serve(ln net.Listener) error {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		ln.Close()
		return http.ErrServerClosed
	}
	p.listeners = append(p.listeners, ln)
	p.mu.Unlock()
	p.startFallback.Do(func() { go func() { _ = p.fallback.Serve(p.handoff) }() })
	var backoff time.Duration
	for {
		c, err := ln.Accept()
		if err != nil {
			if p.isClosed() || errors.Is(err, net.ErrClosed) {
				return http.ErrServerClosed
			}
			// Out of file descriptors and the like: wait, as net/http does.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			p.log.Warn("proxy: accept", "err", err, "retry_in", backoff)
			time.Sleep(backoff)
			continue
		}
		backoff = 0
		go p.serveConn(c)
	}
}

// Close stops Serve and closes every connection.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.closed = true
	lns, conns := p.listeners, p.conns
	p.listeners, p.conns = nil, nil
	p.mu.Unlock()
	for _, ln := range lns {
		ln.Close()
	}
	for c := range conns {
		c.Close()
	}
	p.handoff.Close()
	p.pool.closeAll()
	return p.fallback.Close()
}

func (p *Proxy) isClosed() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.closed
}

// track records an open connection; false once the proxy is closed.
func (p *Proxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return false
	}
	if p.conns == nil {
		p.conns = map[net.Conn]struct{}{}
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *Proxy) untrack(c net.Conn) {
	p.mu.Lock()
	delete(p.conns, c)
	p.mu.Unlock()
}

// newFallback is the net/http server that connections are handed to:
// HTTP/1.1 and HTTP/2 without TLS (h2c with prior knowledge).
func (p *Proxy) newFallback() *http.Server {
	s := &http.Server{Handler: p, ReadHeaderTimeout: headerTimeout, IdleTimeout: keepAliveIdle,
		ErrorLog: slog.NewLogLogger(p.log.Handler(), slog.LevelWarn), Protocols: new(http.Protocols)}
	s.Protocols.SetHTTP1(true)
	s.Protocols.SetUnencryptedHTTP2(true)
	return s
}

// connQueue is the listener the fallback server accepts handed-over
// connections from.
type connQueue struct {
	ch   chan net.Conn
	done chan struct{}
	once sync.Once
}

func newConnQueue() *connQueue {
	return &connQueue{ch: make(chan net.Conn), done: make(chan struct{})}
}

func (q *connQueue) Accept() (net.Conn, error) {
	select {
	case c := <-q.ch:
		return c, nil
	case <-q.done:
		return nil, net.ErrClosed
	}
}

func (q *connQueue) Close() error {
	q.once.Do(func() { close(q.done) })
	return nil
}

func (q *connQueue) Addr() net.Addr { return &net.TCPAddr{} }

// put hands c over; it is closed if the proxy is.
func (q *connQueue) put(c net.Conn) {
	select {
	case q.ch <- c:
	case <-q.done:
		c.Close()
	}
}

// bufferedConn is a connection whose first bytes were already read into r.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(b []byte) (int, error) { return c.r.Read(b) }
