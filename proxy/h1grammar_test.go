package proxy

import (
	"bufio"
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"
)

// TestTheLoopTakesOnlyWhatItReadsWithCertainty: a request head the
// proxy's own loop takes, or leaves to net/http (which answers errors,
// upgrades, odd framings, and reads what two parsers could read apart).
func TestTheLoopTakesOnlyWhatItReadsWithCertainty(t *testing.T) {
	const host = "Host: 8080-abc.localhost\r\n"
	for _, tc := range []struct {
		name, head string
		taken      bool
		length     int64
	}{
		{"a GET", "GET / HTTP/1.1\r\n" + host + "\r\n", true, 0},
		{"a POST with a length", "POST /x?a=b HTTP/1.1\r\n" + host + "Content-Length: 12\r\n\r\n", true, 12},
		{"header names in any case", "GET / HTTP/1.1\r\nhOsT: 8080-abc.localhost\r\ncontent-LENGTH: 3\r\n\r\n", true, 3},
		{"keep-alive and close", "GET / HTTP/1.1\r\n" + host + "Connection: keep-alive, close\r\n\r\n", true, 0},
		{"no Host", "GET / HTTP/1.1\r\nX: y\r\n\r\n", false, 0},
		{"two Hosts", "GET / HTTP/1.1\r\n" + host + host + "\r\n", false, 0},
		{"HTTP/1.0", "GET / HTTP/1.0\r\n" + host + "\r\n", false, 0},
		{"HTTP/2 preface", "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", false, 0},
		{"absolute form", "GET http://x/ HTTP/1.1\r\n" + host + "\r\n", false, 0},
		{"CONNECT", "CONNECT abc:22 HTTP/1.1\r\n" + host + "\r\n", false, 0},
		{"an upgrade", "GET / HTTP/1.1\r\n" + host + "Upgrade: websocket\r\nConnection: Upgrade\r\n\r\n", false, 0},
		{"h2c upgrade", "GET / HTTP/1.1\r\n" + host + "Upgrade: h2c\r\nHTTP2-Settings: AAMAAABkAAQAoAAAAAIAAAAA\r\nConnection: Upgrade, HTTP2-Settings\r\n\r\n", false, 0},
		{"Expect", "PUT / HTTP/1.1\r\n" + host + "Expect: 100-continue\r\nContent-Length: 1\r\n\r\n", false, 0},
		{"chunked upload", "POST / HTTP/1.1\r\n" + host + "Transfer-Encoding: chunked\r\n\r\n", false, 0},
		{"length and chunked", "POST / HTTP/1.1\r\n" + host + "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n", false, 0},
		{"two lengths", "POST / HTTP/1.1\r\n" + host + "Content-Length: 4\r\nContent-Length: 40\r\n\r\n", false, 0},
		{"a negative zero length", "POST / HTTP/1.1\r\n" + host + "Content-Length: -0\r\n\r\n", false, 0},
		{"a length too long to be true", "POST / HTTP/1.1\r\n" + host + "Content-Length: 9999999999999999999\r\n\r\n", false, 0},
		{"a signed length", "POST / HTTP/1.1\r\n" + host + "Content-Length: +4\r\n\r\n", false, 0},
		{"a length with spaces inside", "POST / HTTP/1.1\r\n" + host + "Content-Length: 4 4\r\n\r\n", false, 0},
		{"a folded line", "POST / HTTP/1.1\r\n" + host + "X: a\r\n Content-Length: 4\r\n\r\n", false, 0},
		{"space before the colon", "POST / HTTP/1.1\r\n" + host + "Content-Length : 4\r\n\r\n", false, 0},
		{"a bare CR in a value", "GET / HTTP/1.1\r\n" + host + "X: a\rb\r\n\r\n", false, 0},
		{"a NUL in a value", "GET / HTTP/1.1\r\n" + host + "X: a\x00b\r\n\r\n", false, 0},
		{"a header the Connection header names", "GET / HTTP/1.1\r\n" + host + "Connection: X-Mine\r\nX-Mine: 1\r\n\r\n", false, 0},
		{"the token in the query", "GET /?torpor_token=t HTTP/1.1\r\n" + host + "\r\n", false, 0},
		{"a space in the target", "GET /a b HTTP/1.1\r\n" + host + "\r\n", false, 0},
		{"a bad escape", "GET /%zz HTTP/1.1\r\n" + host + "\r\n", false, 0},
		{"a space in the host", "GET / HTTP/1.1\r\nHost: a b\r\n\r\n", false, 0},
		{"a lower-case version", "GET / http/1.1\r\n" + host + "\r\n", false, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rq, ok := parseRequest([]byte(tc.head))
			if ok != tc.taken {
				t.Fatalf("taken = %v, want %v", ok, tc.taken)
			}
			if ok && rq.contentLength != tc.length {
				t.Fatalf("length %d, want %d", rq.contentLength, tc.length)
			}
		})
	}
}

// FuzzRequestHead: whatever head the loop takes, net/http reads the same
// way (method, target, host, length, close): the loop never frames a
// request differently from a standard parser.
func FuzzRequestHead(f *testing.F) {
	for _, s := range []string{
		"GET / HTTP/1.1\r\nHost: 8080-abc.localhost\r\n\r\n",
		"POST /x?y=z HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\nConnection: close\r\n\r\n",
		"PUT /u HTTP/1.1\r\nHost: h:1\r\nX-Sandbox-Id: abc\r\nX-Sandbox-Port: 80\r\nTE: trailers\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nContent-Length: 0\r\nTransfer-Encoding: chunked\r\n\r\n",
		"GET /%41%zz?q=%2 HTTP/1.1\r\nHost: [::1]:80\r\nConnection: keep-alive,close\r\nCookie: a=b; c=d\r\n\r\n",
		"DELETE /x HTTP/1.1\r\nHost: 8080-abc.localhost:7071\r\nContent-Length: 0010\r\nX-Torpor-Token: t\r\n\r\n",
		"OPTIONS * HTTP/1.1\r\nHost: a\r\nExpect: 100-continue\r\nUpgrade: h2c\r\n\r\n",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		i := bytes.Index(b, crlfcrlf)
		if i < 0 {
			return
		}
		head := b[:i+4]
		rq, ok := parseRequest(head)
		if !ok {
			return
		}
		body := strings.Repeat("b", int(min(rq.contentLength, 1<<16)))
		req, err := http.ReadRequest(bufio.NewReader(io.MultiReader(bytes.NewReader(head), strings.NewReader(body))))
		if err != nil {
			t.Fatalf("the loop took %q; net/http refuses it: %v", head, err)
		}
		method, rest, _ := bytes.Cut(rq.line, []byte(" "))
		uri, _, _ := bytes.Cut(rest, []byte(" "))
		if req.Method != string(method) || req.RequestURI != string(uri) || req.Host != string(rq.host) ||
			req.Close != rq.close || (rq.contentLength <= 1<<16 && req.ContentLength != rq.contentLength) {
			t.Fatalf("%q: the loop read %s %s host %q length %d close %v; net/http %s %s host %q length %d close %v",
				head, method, uri, rq.host, rq.contentLength, rq.close, req.Method, req.RequestURI, req.Host, req.ContentLength, req.Close)
		}
	})
}
