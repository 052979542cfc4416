package proxy

import (
	"bytes"
	"errors"
	"iter"
	"strconv"
)

// The HTTP/1.1 grammar of the proxy's own loop (h1.go): request and
// response heads, header names and values, tokens, lengths and chunk
// sizes. Everything here reads byte slices and does no I/O, so that the
// fuzz targets beside it (h1grammar_test.go) can hold it against
// net/http's parser directly, input by input.

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
		case hTransferEncoding, hUpgrade, hExpect, hH2Settings, hE2B, hFleet:
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
	hFleet     // a request signed by another node (fleet.go): net/http's path checks it
)

var headerNames = map[string]header{
	"host": hHost, "content-length": hContentLength, "transfer-encoding": hTransferEncoding,
	"connection": hConnection, "upgrade": hUpgrade, "expect": hExpect, "te": hTE, "trailer": hTrailer,
	"keep-alive": hKeepAlive, "proxy-connection": hProxyConnection, "proxy-authenticate": hProxyAuthenticate,
	"proxy-authorization": hProxyAuthorization, "http2-settings": hH2Settings,
	"x-sandbox-id": hSandboxID, "x-sandbox-port": hSandboxPort, "x-torpor-token": hToken,
	"e2b-sandbox-id": hE2B, "e2b-sandbox-port": hE2B,
	"x-forwarded-for": hForwarded, "x-forwarded-host": hForwarded, "x-forwarded-proto": hForwarded, "forwarded": hForwarded,
	"x-torpor-fleet-node": hFleet, "x-torpor-fleet-identity": hFleet, "x-torpor-fleet-time": hFleet, "x-torpor-fleet-signature": hFleet,
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

// response is what the loop reads of a response head.
type response struct {
	status        int
	contentLength int64 // -1: none
	chunked       bool
	hasTE         bool // a Transfer-Encoding header
	close         bool
	connTokens    [][]byte // headers the Connection header names
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
