package proxy

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"iter"
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
// thinks is noticed when the answer comes.

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
		if err != nil || h.p.services[t.port] != nil {
			return true
		}
		sb, err := h.p.reach(context.Background(), t, string(rq.token), false)
		if err != nil {
			if h.refuse(&rq, err) == closeConn {
				return false
			}
			continue
		}
		h.underWay = sb.ID
		out := h.forward(&rq, sb, t.port)
		h.answerBegins()
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

// request is what the loop reads of a request head (slices of it).
type request struct {
	head                         []byte // the whole head, up to its blank line
	line                         []byte // the request line, without CRLF
	host, sandboxID, sandboxPort []byte
	token                        []byte
	contentLength                int64
	close                        bool
	isHead                       bool // a HEAD request: its answer has no body
	replayable                   bool // may be sent again (GET, HEAD, OPTIONS, TRACE)
	teTrailers                   bool
}

// parseRequest reads a head the loop can take; false for anything else.
func parseRequest(head []byte) (request, bool) {
	rq := request{head: head}
	lineEnd := bytes.Index(head, []byte("\r\n"))
	rq.line = head[:lineEnd]
	method, rest, ok1 := bytes.Cut(rq.line, []byte(" "))
	uri, proto, ok2 := bytes.Cut(rest, []byte(" "))
	if !ok1 || !ok2 || !isToken(method) || string(proto) != "HTTP/1.1" ||
		len(uri) == 0 || uri[0] != '/' || !validURI(uri) ||
		string(method) == "CONNECT" || bytes.Contains(uri, []byte(QueryToken)) {
		return rq, false
	}
	rq.isHead = string(method) == "HEAD"
	switch string(method) {
	case "GET", "HEAD", "OPTIONS", "TRACE":
		rq.replayable = true
	}
	haveHost, haveLength := false, false
	for lines := head[lineEnd+2 : len(head)-2]; len(lines) > 0; {
		var line []byte
		line, lines, _ = bytes.Cut(lines, []byte("\r\n"))
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok || !isToken(name) || !validValue(value) {
			return rq, false // also a folded line (it starts with a space)
		}
		value = bytes.Trim(value, " \t")
		switch headerOf(name) {
		case hHost:
			if haveHost {
				return rq, false
			}
			haveHost, rq.host = true, value
		case hContentLength:
			n, ok := parseLength(value)
			if haveLength || !ok {
				return rq, false
			}
			haveLength, rq.contentLength = true, n
		case hConnection:
			// Only close and keep-alive: a header named here would be
			// hop-by-hop too, which net/http's path handles.
			for f := range bytes.SplitSeq(value, []byte(",")) {
				switch f = bytes.Trim(f, " \t"); {
				case bytes.EqualFold(f, []byte("close")):
					rq.close = true
				case bytes.EqualFold(f, []byte("keep-alive")), len(f) == 0:
				default:
					return rq, false
				}
			}
		case hTE:
			rq.teTrailers = bytes.EqualFold(value, []byte("trailers"))
		case hTransferEncoding, hUpgrade, hExpect, hH2Settings, hE2B:
			return rq, false
		case hSandboxID:
			rq.sandboxID = value
		case hSandboxPort:
			rq.sandboxPort = value
		case hToken:
			rq.token = value
		}
	}
	return rq, haveHost && validHost(rq.host)
}

// The headers the loop reads or drops.
type header int

const (
	hOther header = iota
	hHost
	hContentLength
	hTransferEncoding
	hConnection
	hUpgrade
	hExpect
	hTE
	hTrailer
	hKeepAlive
	hProxyConnection
	hProxyAuthenticate
	hProxyAuthorization
	hH2Settings
	hSandboxID
	hSandboxPort
	hToken
	hE2B       // E2B's routing headers: such requests go to net/http (service.go)
	hForwarded // the client's X-Forwarded-* and Forwarded: the proxy sets its own
)

var headerNames = map[string]header{
	"host": hHost, "content-length": hContentLength, "transfer-encoding": hTransferEncoding,
	"connection": hConnection, "upgrade": hUpgrade, "expect": hExpect, "te": hTE, "trailer": hTrailer,
	"keep-alive": hKeepAlive, "proxy-connection": hProxyConnection, "proxy-authenticate": hProxyAuthenticate,
	"proxy-authorization": hProxyAuthorization, "http2-settings": hH2Settings,
	"x-sandbox-id": hSandboxID, "x-sandbox-port": hSandboxPort, "x-torpor-token": hToken,
	"e2b-sandbox-id": hE2B, "e2b-sandbox-port": hE2B,
	"x-forwarded-for": hForwarded, "x-forwarded-host": hForwarded, "x-forwarded-proto": hForwarded, "forwarded": hForwarded,
}

// headerOf names a header, case-insensitively, without allocating.
func headerOf(name []byte) header {
	if len(name) > 24 {
		return hOther
	}
	var low [24]byte
	for i, c := range name {
		if 'A' <= c && c <= 'Z' {
			c += 'a' - 'A'
		}
		low[i] = c
	}
	return headerNames[string(low[:len(name)])]
}

// isToken: RFC 9110 token characters, at least one.
func isToken(b []byte) bool {
	if len(b) == 0 {
		return false
	}
	for _, c := range b {
		if c >= 0x80 || tokenChars[c] == 0 {
			return false
		}
	}
	return true
}

var tokenChars = func() (t [128]byte) {
	for c := '0'; c <= '9'; c++ {
		t[c] = 1
	}
	for c := 'a'; c <= 'z'; c++ {
		t[c], t[c-'a'+'A'] = 1, 1
	}
	for _, c := range "!#$%&'*+-.^_`|~" {
		t[c] = 1
	}
	return t
}()

// validValue: no control characters but tab (so no bare CR or LF).
func validValue(b []byte) bool {
	for _, c := range b {
		if (c < ' ' && c != '\t') || c == 0x7f {
			return false
		}
	}
	return true
}

// validURI: printable ASCII, no spaces, every % followed by two hex
// digits (net/http refuses other escapes).
func validURI(b []byte) bool {
	for i, c := range b {
		if c <= ' ' || c >= 0x7f {
			return false
		}
		if c == '%' && (i+2 >= len(b) || !isHex(b[i+1]) || !isHex(b[i+2])) {
			return false
		}
	}
	return true
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

// validHost: the characters of a host name, an IP address and a port.
func validHost(b []byte) bool {
	for _, c := range b {
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
			c == '-' || c == '.' || c == ':' || c == '[' || c == ']' || c == '_') {
			return false
		}
	}
	return len(b) > 0
}

// What forward did with the connection.
type outcome int

const (
	keepConn outcome = iota // serve the next request
	closeConn
	handOver // nothing consumed: net/http takes the connection
)

// forward sends the request to the sandbox's port and its answer back.
func (h *h1conn) forward(rq *request, sb *torpor.Sandbox, port int) outcome {
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
		if buffered {
			h.br.Discard(int(total))
		}
		return h.answerError(rq, &torpor.Error{Code: torpor.EUnavailable, RetryAfter: time.Second,
			Message: "port " + strconv.Itoa(port) + " of the sandbox did not answer"})
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

// writeRequest writes the request head, and body when it is buffered,
// to the sandbox.
func (h *h1conn) writeRequest(uc *upConn, rq *request, body []byte) error {
	w := uc.bw
	w.Write(rq.line)
	w.WriteString("\r\n")
	for lines := rq.head[len(rq.line)+2 : len(rq.head)-2]; len(lines) > 0; {
		var line []byte
		line, lines, _ = bytes.Cut(lines, []byte("\r\n"))
		name, _, _ := bytes.Cut(line, []byte(":"))
		switch headerOf(name) {
		case hConnection, hKeepAlive, hProxyConnection, hProxyAuthenticate, hProxyAuthorization,
			hTrailer, hToken, hForwarded:
			continue
		case hTE:
			if rq.teTrailers {
				w.WriteString("Te: trailers\r\n")
			}
			continue
		}
		w.Write(line)
		w.WriteString("\r\n")
	}
	if h.remote != "" {
		w.WriteString("X-Forwarded-For: ")
		w.WriteString(h.remote)
		w.WriteString("\r\n")
	}
	w.WriteString("X-Forwarded-Host: ")
	w.Write(rq.host)
	w.WriteString("\r\nX-Forwarded-Proto: http\r\n\r\n")
	w.Write(body)
	return w.Flush()
}

// response is what the loop reads of a response head.
type response struct {
	status        int
	contentLength int64 // -1: none
	chunked       bool
	hasTE         bool // a Transfer-Encoding header
	close         bool
	connTokens    [][]byte // headers the Connection header names
}

// copyResponse reads the sandbox's answer and sends it to the client. It
// tells whether the upstream and the client connections can serve
// another request, and whether the client got anything of the answer.
func (h *h1conn) copyResponse(uc *upConn, rq *request) (upKeep, clientKeep, headSent bool, err error) {
	for {
		head, err := readHeadLines(h.scratch[:0], uc.br)
		h.scratch = head[:0]
		if err != nil {
			return false, false, headSent, err
		}
		rs, err := parseResponse(head)
		if err == nil && rs.status == 101 {
			err = errors.New("an upgrade nobody asked for")
		}
		if err != nil {
			return false, false, headSent, err
		}
		noBody := rq.isHead || rs.status < 200 || rs.status == 204 || rs.status == 304
		untilClose := !noBody && !rs.chunked && rs.contentLength < 0
		h.writeResponseHead(head, &rs, untilClose)
		headSent = true
		switch {
		case rs.status < 200:
			// 1xx (103 Early Hints): pass it on; the final answer follows.
			if err := h.bw.Flush(); err != nil {
				return false, false, true, err
			}
			continue
		case noBody:
		case rs.chunked:
			err = pumpChunked(h.bw, uc.br)
		case rs.contentLength >= 0:
			err = pump(h.bw, uc.br, rs.contentLength)
		default:
			err = pump(h.bw, uc.br, -1)
		}
		if err == nil {
			err = h.bw.Flush()
		}
		return err == nil && !rs.close && !untilClose, !untilClose, true, err
	}
}

// writeResponseHead writes the response head to the client, less the
// hop-by-hop headers; "Connection: close" when the body ends with the
// connection.
func (h *h1conn) writeResponseHead(head []byte, rs *response, untilClose bool) {
	w := h.bw
	line, lines, _ := bytes.Cut(head, []byte("\n"))
	w.WriteString("HTTP/1.1")
	w.Write(bytes.TrimRight(line[len("HTTP/1.x"):], "\r"))
	w.WriteString("\r\n")
	for line := range headerLines(lines) {
		name, _, _ := bytes.Cut(line, []byte(":"))
		switch headerOf(name) {
		case hConnection, hKeepAlive, hProxyConnection, hUpgrade, hTE:
			continue
		case hContentLength:
			if rs.hasTE {
				continue
			}
		}
		if named(rs.connTokens, name) {
			continue
		}
		w.Write(line)
		w.WriteString("\r\n")
	}
	if untilClose {
		w.WriteString("Connection: close\r\n")
	}
	w.WriteString("\r\n")
}

func named(tokens [][]byte, name []byte) bool {
	for _, t := range tokens {
		if bytes.EqualFold(t, name) {
			return true
		}
	}
	return false
}

// headerLines yields the header lines of a response head (after its
// status line), without their line ends, up to the blank line.
func headerLines(lines []byte) iter.Seq[[]byte] {
	return func(yield func([]byte) bool) {
		for len(lines) > 0 {
			var line []byte
			line, lines, _ = bytes.Cut(lines, []byte("\n"))
			if line = bytes.TrimRight(line, "\r"); len(line) == 0 || !yield(line) {
				return
			}
		}
	}
}

// readHeadLines appends a response head, up to and with its blank line,
// to dst.
func readHeadLines(dst []byte, r *bufio.Reader) ([]byte, error) {
	for {
		line, err := r.ReadSlice('\n')
		if err != nil {
			return dst, err
		}
		dst = append(dst, line...)
		if len(dst) > maxRespHead {
			return dst, errors.New("response head too large")
		}
		if len(line) == 1 || (len(line) == 2 && line[0] == '\r') {
			return dst, nil
		}
	}
}

// parseResponse reads the status and framing of a response head.
func parseResponse(head []byte) (response, error) {
	rs := response{contentLength: -1}
	line, lines, _ := bytes.Cut(head, []byte("\n"))
	line = bytes.TrimRight(line, "\r")
	if len(line) < len("HTTP/1.x 200") || string(line[:7]) != "HTTP/1." || (line[7] != '0' && line[7] != '1') ||
		line[8] != ' ' || (len(line) > 12 && line[12] != ' ') || !validValue(line) {
		return rs, errors.New("malformed status line")
	}
	status, err := strconv.Atoi(string(line[9:12]))
	if err != nil || status < 100 || status > 999 {
		return rs, errors.New("malformed status code")
	}
	rs.status = status
	http10 := line[7] == '0'
	keepAlive := false
	for line := range headerLines(lines) {
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok || !isToken(name) || !validValue(value) {
			return rs, errors.New("malformed header line")
		}
		value = bytes.Trim(value, " \t")
		switch headerOf(name) {
		case hContentLength:
			n, ok := parseLength(value)
			if !ok || (rs.contentLength >= 0 && n != rs.contentLength) {
				return rs, errors.New("malformed Content-Length")
			}
			rs.contentLength = n
		case hTransferEncoding:
			// chunked last: the body is chunked; otherwise it ends with
			// the connection. Either way Content-Length does not count
			// (and is not passed on).
			codings := bytes.Split(value, []byte(","))
			rs.hasTE = true
			rs.chunked = bytes.EqualFold(bytes.Trim(codings[len(codings)-1], " \t"), []byte("chunked"))
			if !rs.chunked {
				rs.close = true
			}
		case hConnection:
			for f := range bytes.SplitSeq(value, []byte(",")) {
				switch f = bytes.Trim(f, " \t"); {
				case bytes.EqualFold(f, []byte("close")):
					rs.close = true
				case bytes.EqualFold(f, []byte("keep-alive")):
					keepAlive = true
				case len(f) > 0:
					rs.connTokens = append(rs.connTokens, f)
				}
			}
		}
	}
	if rs.hasTE {
		rs.contentLength = -1
	}
	if http10 && !keepAlive {
		rs.close = true
	}
	return rs, nil
}

// pump copies n bytes (n < 0: up to the end of src) from src to dst,
// flushing dst whenever src has nothing more buffered, so what a slow
// sender wrote arrives before the next piece.
func pump(dst *bufio.Writer, src *bufio.Reader, n int64) error {
	for n != 0 {
		if src.Buffered() == 0 {
			if err := dst.Flush(); err != nil {
				return err
			}
			if _, err := src.Peek(1); err != nil {
				if n < 0 && errors.Is(err, io.EOF) {
					return nil
				}
				return err
			}
		}
		k := src.Buffered()
		if n > 0 && int64(k) > n {
			k = int(n)
		}
		b, _ := src.Peek(k)
		if _, err := dst.Write(b); err != nil {
			return err
		}
		src.Discard(k)
		if n > 0 {
			n -= int64(k)
		}
	}
	return nil
}

// pumpChunked copies a chunked body, writing its framing anew: each
// chunk's size in hex and CRLF (extensions dropped), its data, CRLF, and
// the trailers after the last, each checked as a header line. What the
// client reads is therefore framed exactly as the proxy read it.
func pumpChunked(dst *bufio.Writer, src *bufio.Reader) error {
	line := func() ([]byte, error) {
		if src.Buffered() == 0 {
			if err := dst.Flush(); err != nil {
				return nil, err
			}
		}
		l, err := src.ReadSlice('\n')
		if err != nil {
			return nil, err
		}
		return bytes.TrimSuffix(bytes.TrimSuffix(l, []byte("\n")), []byte("\r")), nil
	}
	for {
		l, err := line()
		if err != nil {
			return err
		}
		size, ok := chunkSize(l)
		if !ok {
			return errors.New("malformed chunk size")
		}
		dst.WriteString(strconv.FormatInt(size, 16))
		dst.WriteString("\r\n")
		if size == 0 {
			for { // trailers, up to a blank line
				l, err := line()
				if err != nil {
					return err
				}
				if len(l) == 0 {
					_, err = dst.WriteString("\r\n")
					return err
				}
				name, value, ok := bytes.Cut(l, []byte(":"))
				if !ok || !isToken(name) || !validValue(value) {
					return errors.New("malformed trailer")
				}
				dst.Write(l)
				dst.WriteString("\r\n")
			}
		}
		if err := pump(dst, src, size); err != nil {
			return err
		}
		if end, err := src.Peek(2); err != nil || string(end) != "\r\n" {
			return errors.New("malformed chunk end") // net/http's reader wants CRLF too
		}
		src.Discard(2)
		dst.WriteString("\r\n")
	}
}

// chunkSize reads a chunk-size line (without its line end): hex digits,
// then maybe extensions.
func chunkSize(l []byte) (int64, bool) {
	if i := bytes.IndexByte(l, ';'); i >= 0 {
		if !validValue(l[i:]) {
			return 0, false
		}
		l = bytes.TrimRight(l[:i], " \t")
	}
	if len(l) == 0 || len(l) > 15 {
		return 0, false
	}
	var n int64
	for _, c := range l {
		var d byte
		switch {
		case '0' <= c && c <= '9':
			d = c - '0'
		case 'a' <= c && c <= 'f':
			d = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			d = c - 'A' + 10
		default:
			return 0, false
		}
		n = n<<4 | int64(d)
	}
	return n, true
}

// parseLength reads a Content-Length: decimal digits only (no sign, no
// spaces), at most 18 of them.
func parseLength(b []byte) (int64, bool) {
	if len(b) == 0 || len(b) > 18 {
		return 0, false
	}
	var n int64
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int64(c-'0')
	}
	return n, true
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
