package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor"
)

// The proxy's own HTTP/1.1 loop. It reads a request head from the
// client's buffer without consuming it and takes the request only when
// everything about its framing is certain: an origin-form HTTP/1.1
// request with no body or one of a single Content-Length, no upgrade, no
// Expect, and a valid route. It checks the token, wakes a sleeping
// sandbox and answers refusals with the same code as net/http's path
// (reach, errorAnswer). The head's lines go to the sandbox as they came,
// less the hop-by-hop headers, the traffic token and the client's
// forwarding headers, plus the proxy's own X-Forwarded-*; the response's
// framing (Content-Length, chunked, or until close) is read exactly and
// its bytes copied through, flushed whenever the sandbox has sent nothing
// more, so streams (server-sent events, long downloads) arrive as they
// are written. A request the loop does not take is handed with its
// connection to net/http (serve.go), which serves upgrades, tunnels,
// HTTP/2 and whatever else. A client that goes away while its sandbox
// thinks is noticed when the answer comes. The grammar the loop reads is
// h1grammar.go's; the heads and bodies are copied through by h1copy.go.

const (
	clientBuf   = 8 << 10  // a request head larger than this goes to net/http
	upstreamBuf = 16 << 10 // the longest response header line
	maxRespHead = 1 << 20  // a response head larger than this is refused
)

var (
	clientReaders = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, clientBuf) }}
	clientWriters = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, clientBuf) }}
	crlfcrlf      = []byte("\r\n\r\n")
)

// h1conn is a client connection served by the loop.
type h1conn struct {
	p      *Proxy
	c      net.Conn
	br     *bufio.Reader
	bw     *bufio.Writer
	remote string // the client's address, for X-Forwarded-For
	// The upstream connection of the last request, kept for the next
	// one to the same port.
	up     *upConn
	upID   string
	upPort int
	// scratch holds a response head while it is read.
	scratch []byte
	// deadline is the client connection's read deadline (zero: none).
	deadline time.Time
	// underWay is the sandbox whose request is under way until its
	// answer begins (see underWay in proxy.go); "" when none.
	underWay string
	// The watch of the client's connection while an answer is awaited
	// (awaitAnswer): its timer, the upstream connection waited on, its
	// end, and whether it saw the client go.
	watch    *time.Timer
	watching atomic.Pointer[upConn]
	watchEnd chan struct{}
	gone     atomic.Bool
}

// answerBegins ends the count of the request under way, if any.
func (h *h1conn) answerBegins() {
	if h.underWay != "" {
		h.p.eng.RequestEnded(h.underWay)
		h.underWay = ""
	}
}

func (p *Proxy) serveConn(c net.Conn) {
	if !p.track(c) {
		c.Close()
		return
	}
	h := &h1conn{p: p, c: c, br: clientReaders.Get().(*bufio.Reader), bw: clientWriters.Get().(*bufio.Writer),
		watchEnd: make(chan struct{}, 1)}
	h.br.Reset(c)
	h.bw.Reset(c)
	if ip, _, err := net.SplitHostPort(c.RemoteAddr().String()); err == nil {
		h.remote = ip
	}
	handOver := h.safeLoop()
	if h.watch != nil {
		h.watch.Stop()
	}
	p.untrack(c)
	h.keepUpstream(nil, "", 0)
	h.bw.Reset(nil)
	clientWriters.Put(h.bw)
	if handOver {
		_ = c.SetReadDeadline(time.Time{})
		p.handoff.put(&bufferedConn{Conn: c, r: h.br})
		return
	}
	c.Close()
	h.br.Reset(nil)
	clientReaders.Put(h.br)
}

// safeLoop is loop that survives a panic: the connection ends, and
// nothing is counted as under way any more.
func (h *h1conn) safeLoop() (handOver bool) {
	defer func() {
		if r := recover(); r != nil {
			h.p.log.Error("proxy: panic serving a connection", "panic", r, "stack", string(debug.Stack()))
			h.answerBegins()
			if h.up != nil {
				h.up.close()
				h.up = nil
			}
			handOver = false
		}
	}()
	return h.loop()
}

// loop serves requests until the connection ends (false) or one is for
// net/http (true).
func (h *h1conn) loop() bool {
	for {
		head, err := h.readHead()
		if err != nil {
			return false
		}
		if head == nil {
			return true
		}
		rq, ok := parseRequest(head)
		if !ok {
			return true
		}
		t, err := h.p.routeTo(string(rq.sandboxID), string(rq.sandboxPort), string(rq.host), false)
		if err != nil || h.p.services[t.port] != nil || h.p.remote(t.id) {
			return true
		}
		out := replay
		for mayReplay := true; out == replay; mayReplay = false {
			sb, err := h.p.reach(context.Background(), t, string(rq.token), false)
			if err != nil {
				out = h.refuse(&rq, err)
				break
			}
			h.underWay = sb.ID
			out = h.forward(&rq, sb, t.port, mayReplay)
			h.answerBegins()
		}
		switch out {
		case handOver:
			return true
		case closeConn:
			return false
		}
	}
}

// readHead waits for a whole request head in the client's buffer and
// returns it, unconsumed; nil when net/http should read it (too large,
// or lines that end in a bare LF).
func (h *h1conn) readHead() ([]byte, error) {
	if h.br.Buffered() == 0 {
		// Wait at most keepAliveIdle, give or take half of it: moving
		// the deadline at every request would cost a timer each.
		if now := time.Now(); h.deadline.Sub(now) < keepAliveIdle/2 {
			h.setDeadline(now.Add(keepAliveIdle))
		}
		if _, err := h.br.Peek(1); err != nil {
			return nil, err
		}
	}
	slow := false
	for {
		buf, _ := h.br.Peek(h.br.Buffered())
		if i := bytes.Index(buf, crlfcrlf); i >= 0 {
			return buf[:i+4], nil
		}
		if len(buf) == h.br.Size() || bytes.Contains(buf, []byte("\n\n")) {
			return nil, nil
		}
		if !slow {
			slow = true
			h.setDeadline(time.Now().Add(headerTimeout))
		}
		if _, err := h.br.Peek(len(buf) + 1); err != nil {
			return nil, err
		}
	}
}

func (h *h1conn) setDeadline(t time.Time) {
	h.deadline = t
	_ = h.c.SetReadDeadline(t)
}

// What forward did with the connection.
type outcome int

const (
	keepConn outcome = iota // serve the next request
	closeConn
	handOver // nothing consumed: net/http takes the connection
	// replay: the sandbox stopped under the request before it was
	// answered, and the request, still whole in the buffer, may go again
	// once the sandbox is reached again.
	replay
)

// forward sends the request to the sandbox's port and its answer back.
// When the sandbox stops running under the request (a restart, a
// hibernation) before the answer begins, it asks for a replay where
// mayReplay allows and the request can go again, and otherwise answers
// with the conflict (or, deleted, the gone) that says so.
func (h *h1conn) forward(rq *request, sb *torpor.Sandbox, port int, mayReplay bool) outcome {
	p := h.p
	total := int64(len(rq.head)) + rq.contentLength
	buffered := total <= int64(h.br.Size())
	uc, reused := h.takeUpstream(sb.ID, port)
	if uc == nil {
		var err error
		if uc, err = p.dialUp(context.Background(), upstream{sb: sb, port: port}); err != nil {
			return handOver // net/http's path dials again and answers why not
		}
	}
	var body []byte
	if buffered {
		// The whole request fits the buffer: it stays there until the
		// answer begins, so it can go again on a new connection.
		b, err := h.br.Peek(int(total))
		if err != nil {
			uc.close()
			return closeConn
		}
		if &b[0] != &rq.head[0] {
			// Reading the body moved the buffer's bytes: read the head
			// again where it is now.
			*rq, _ = parseRequest(b[:len(rq.head)])
		}
		body = b[len(rq.head):]
	}
	partial := false // the sandbox answered before it took the whole body
	for {
		err := h.send(uc, rq, body, buffered)
		if err == nil {
			err = h.awaitAnswer(uc)
		}
		if err == nil {
			break
		}
		if h.gone.Load() {
			uc.close()
			return closeConn
		}
		if !buffered {
			// Its body is not all read: the connection cannot go on. The
			// sandbox may have answered already (413) and closed.
			rq.close = true
			if partial = answered(uc); partial {
				break
			}
		}
		uc.close()
		// A kept-alive connection the server closed meanwhile: once more
		// on a new one when the request can be sent again, as a client
		// would.
		if reused && buffered && rq.contentLength == 0 && rq.replayable {
			reused = false
			if uc, err = p.dialUp(context.Background(), upstream{sb: sb, port: port}); err == nil {
				continue
			}
		}
		p.log.Debug("proxy: upstream", "sandbox", sb.ID, "port", port, "err", err)
		answer := error(&torpor.Error{Code: torpor.EUnavailable, RetryAfter: time.Second,
			Message: "port " + strconv.Itoa(port) + " of the sandbox did not answer"})
		if serr := p.stoppedUnder(sb); serr != nil {
			if mayReplay && buffered && rq.replayable {
				return replay
			}
			answer = serr
		}
		if buffered {
			h.br.Discard(int(total))
		}
		return h.answerError(rq, answer)
	}
	h.answerBegins()
	if buffered {
		h.br.Discard(int(total))
	}
	upKeep, clientKeep, headSent, err := h.copyResponse(uc, rq)
	if err != nil {
		p.log.Debug("proxy: response", "sandbox", sb.ID, "port", port, "err", err)
		uc.close()
		if !headSent {
			return h.answerError(rq, &torpor.Error{Code: torpor.EUnavailable, RetryAfter: time.Second,
				Message: "port " + strconv.Itoa(port) + " of the sandbox did not answer in HTTP/1.1"})
		}
		// The client got part of a response: end its connection too.
		p.obs.ProxyRequest(string(torpor.EUnavailable))
		return closeConn
	}
	p.obs.ProxyRequest("ok")
	if upKeep && !partial {
		h.keepUpstream(uc, sb.ID, port)
	} else {
		uc.close()
	}
	if !clientKeep || rq.close {
		return closeConn
	}
	return keepConn
}

// send writes the request to the sandbox: the head, and the body from
// the buffer or, when larger, streamed from the client.
func (h *h1conn) send(uc *upConn, rq *request, body []byte, buffered bool) error {
	if err := h.writeRequest(uc, rq, body); err != nil || buffered {
		return err
	}
	h.br.Discard(len(rq.head))
	h.setDeadline(time.Time{})
	if err := pump(uc.bw, h.br, rq.contentLength); err != nil {
		return err
	}
	return uc.bw.Flush()
}

// answered tells whether the sandbox sent an answer (within a second)
// on a connection that failed while the request was being sent.
func answered(uc *upConn) bool {
	_ = uc.c.SetReadDeadline(time.Now().Add(time.Second))
	_, err := uc.br.Peek(1)
	_ = uc.c.SetReadDeadline(time.Time{})
	return err == nil
}

// clientWatchAfter is how long the loop waits for an answer before it
// also watches the client's connection.
const clientWatchAfter = time.Second

// awaitAnswer waits for the answer to begin. When the sandbox thinks for
// longer than clientWatchAfter, it also watches the client's connection:
// a client that goes away ends the wait (and with it the request under
// way, which would otherwise keep the sandbox awake). A client that sends
// its next request meanwhile is not watched further.
func (h *h1conn) awaitAnswer(uc *upConn) error {
	if uc.br.Buffered() > 0 {
		return nil
	}
	h.watching.Store(uc)
	if h.watch == nil {
		h.watch = time.AfterFunc(clientWatchAfter, h.watchClient)
	} else {
		h.watch.Reset(clientWatchAfter)
	}
	_, err := uc.br.Peek(1)
	if !h.watch.Stop() {
		// The watch began: end it, and give the client's connection its
		// deadline back.
		_ = h.c.SetReadDeadline(time.Unix(1, 0))
		<-h.watchEnd
		h.setDeadline(time.Now().Add(keepAliveIdle))
	}
	return err
}

// watchClient waits until the client's connection can be read: at its
// end (the client went away), it ends the wait for the answer.
func (h *h1conn) watchClient() {
	defer func() { h.watchEnd <- struct{}{} }()
	sc, ok := h.c.(syscall.Conn)
	if !ok {
		return
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return
	}
	gone := false
	var b [1]byte
	_ = rc.Read(func(fd uintptr) bool {
		n, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		if errors.Is(err, unix.EAGAIN) {
			return false // nothing yet: wait until there is
		}
		gone = err != nil || n == 0
		return true
	})
	if gone {
		h.gone.Store(true)
		_ = h.watching.Load().c.SetReadDeadline(time.Unix(1, 0))
	}
}

// takeUpstream returns a kept-alive connection to the port, the last
// request's or one from the pool, and whether it is one; nil if none.
// Each is checked first: one the server closed, or that holds bytes
// nobody asked for, is dropped.
func (h *h1conn) takeUpstream(id string, port int) (*upConn, bool) {
	var uc *upConn
	if h.up != nil && h.upID == id && h.upPort == port {
		uc, h.up = h.up, nil
	} else {
		h.keepUpstream(nil, "", 0)
		uc = h.p.pool.get(poolKey(id, port))
	}
	for uc != nil && !uc.alive() {
		uc.close()
		uc = h.p.pool.get(poolKey(id, port))
	}
	if uc != nil {
		park(uc.c, false)
	}
	return uc, uc != nil
}

// keepUpstream keeps uc for the next request, and puts the one it
// replaces back in the pool.
func (h *h1conn) keepUpstream(uc *upConn, id string, port int) {
	if h.up != nil {
		h.p.pool.put(poolKey(h.upID, h.upPort), h.up)
	}
	if uc != nil {
		park(uc.c, true) // between requests: no one's open connection
	}
	h.up, h.upID, h.upPort = uc, id, port
}

// refuse answers a request the proxy does not forward with err, reading
// the request first (one with a body larger than the buffer is left
// unread, and the connection ends after the answer).
func (h *h1conn) refuse(rq *request, err error) outcome {
	if total := len(rq.head) + int(rq.contentLength); rq.contentLength <= int64(h.br.Size()) && total <= h.br.Size() {
		if _, perr := h.br.Peek(total); perr != nil {
			return closeConn
		}
		h.br.Discard(total)
	} else {
		h.br.Discard(len(rq.head))
		rq.close = true
	}
	return h.answerError(rq, err)
}

// answerError answers the client with err in the API's error shape.
func (h *h1conn) answerError(rq *request, err error) outcome {
	h.p.obs.ProxyRequest(string(torpor.ErrorCodeOf(err)))
	a := h.p.errorAnswer(err, 0)
	w := h.bw
	w.WriteString("HTTP/1.1 ")
	w.WriteString(strconv.Itoa(a.status))
	w.WriteString(" ")
	w.WriteString(http.StatusText(a.status))
	w.WriteString("\r\nContent-Type: application/json\r\n")
	if a.retryAfter != "" {
		w.WriteString("Retry-After: " + a.retryAfter + "\r\n")
	}
	if rq.close {
		w.WriteString("Connection: close\r\n")
	}
	w.WriteString("Content-Length: " + strconv.Itoa(len(a.body)) + "\r\n\r\n")
	if !rq.isHead {
		w.WriteString(a.body)
	}
	if w.Flush() != nil || rq.close {
		return closeConn
	}
	return keepConn
}
