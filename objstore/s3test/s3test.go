// Package s3test runs a real S3-compatible server for tests: Versity's S3
// gateway (github.com/versity/versitygw) with its POSIX backend, built
// from tools/s3server and run as a separate process with its data in a
// temporary directory, behind a proxy on a loopback TCP port that can make
// it fail on purpose. It speaks real S3 over HTTP and checks signatures,
// so a test can point objstore.Open at it, and so can torpor daemons that
// a test runs as separate processes (give them URL and Env).
//
// The server is built once per machine (see CachedPath); where it cannot
// be (no go tool, no network to the module proxy and no built binary),
// Start skips the test with what is missing.
//
// Everything is lost when the test ends.
package s3test

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"log"
	"maps"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// The credentials the server accepts, and its region.
const (
	AccessKey = "torpor-test-access"
	SecretKey = "torpor-test-secret"
	Region    = "us-east-1"
)

// Server is a running test S3 server. Its methods are safe for concurrent
// use.
type Server struct {
	tb       testing.TB
	proc     *serverProcess
	proxy    *httputil.ReverseProxy
	admin    *minio.Client // straight to the server, past the faults
	srv      *http.Server
	endpoint string

	mu       sync.Mutex
	down     bool
	failNext int
	cutLeft  int64 // bytes of upload bodies let through before the cut; <0: no cut
	requests map[string]int64
}

// Start starts a server, with its proxy on 127.0.0.1, and stops it when
// tb ends.
func Start(tb testing.TB) *Server {
	tb.Helper()
	proc := startServer(tb)
	dial := func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", proc.socket())
	}
	transport := &http.Transport{
		DialContext:         dial,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     30 * time.Second,
		// The client's Accept-Encoding, whatever it is, goes to the
		// server as it came; the proxy adds none.
		DisableCompression: true,
	}
	s := &Server{
		tb:       tb,
		proc:     proc,
		cutLeft:  -1,
		requests: map[string]int64{},
	}
	s.proxy = &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) {
			r.Out.URL.Scheme = "http"
			r.Out.URL.Host = r.In.Host
			// The Host header is part of what the client signed.
			r.Out.Host = r.In.Host
		},
		Transport:    transport,
		ErrorLog:     log.New(io.Discard, "", 0),
		ErrorHandler: s.proxyError,
	}
	admin, err := minio.New("localhost", &minio.Options{
		Creds:        credentials.NewStaticV4(AccessKey, SecretKey, ""),
		Region:       Region,
		BucketLookup: minio.BucketLookupPath,
		Transport:    &http.Transport{DialContext: dial, DisableCompression: true},
	})
	if err != nil {
		tb.Fatalf("s3test: %v", err)
	}
	s.admin = admin
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("s3test: listen: %v", err)
	}
	s.endpoint = "http://" + ln.Addr().String()
	s.srv = &http.Server{
		Handler: s,
		// A cut upload leaves the handler writing to a hijacked
		// connection, which the server would log on every cut.
		ErrorLog: log.New(io.Discard, "", 0),
	}
	go s.srv.Serve(ln)
	// Cleanups run last in, first out: the proxy stops before the server.
	tb.Cleanup(func() {
		s.srv.Close()
		transport.CloseIdleConnections()
	})
	return s
}

// Endpoint is the server's base URL, http://127.0.0.1:PORT.
func (s *Server) Endpoint() string { return s.endpoint }

// URL makes the bucket if it does not exist and returns the objstore URL
// of it: s3://BUCKET?endpoint=...&path_style=true&region=us-east-1.
// bucket may be followed by a prefix (BUCKET/PREFIX), which the URL keeps.
func (s *Server) URL(bucket string) string {
	s.tb.Helper()
	name, prefix, _ := strings.Cut(bucket, "/")
	s.CreateBucket(name)
	q := url.Values{"endpoint": {s.endpoint}, "region": {Region}, "path_style": {"true"}}
	u := url.URL{Scheme: "s3", Host: name, RawQuery: q.Encode()}
	if prefix != "" {
		u.Path = "/" + prefix
	}
	return u.String()
}

// CreateBucket makes the bucket if it does not exist.
func (s *Server) CreateBucket(name string) {
	s.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	err := s.admin.MakeBucket(ctx, name, minio.MakeBucketOptions{Region: Region})
	if code := minio.ToErrorResponse(err).Code; code == "BucketAlreadyOwnedByYou" || code == "BucketAlreadyExists" {
		err = nil
	}
	if err != nil {
		s.tb.Fatalf("s3test: create bucket %q: %v", name, err)
	}
}

// Keys lists the keys of the objects in the bucket, in order, whatever the
// server's faults.
func (s *Server) Keys(bucket string) []string {
	s.tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var keys []string
	for obj := range s.admin.ListObjects(ctx, bucket, minio.ListObjectsOptions{Recursive: true}) {
		if obj.Err != nil {
			s.tb.Fatalf("s3test: list bucket %q: %v", bucket, obj.Err)
		}
		keys = append(keys, obj.Key)
	}
	slices.Sort(keys)
	if keys == nil {
		keys = []string{}
	}
	return keys
}

// Env is the environment a torpor daemon needs to use the server:
// TORPOR_S3_ACCESS_KEY and TORPOR_S3_SECRET_KEY, as KEY=VALUE pairs to
// add to an exec.Cmd's Env.
func (s *Server) Env() []string {
	return []string{"TORPOR_S3_ACCESS_KEY=" + AccessKey, "TORPOR_S3_SECRET_KEY=" + SecretKey}
}

// Setenv sets the environment of Env in this process for the rest of tb
// (tb.Setenv: not in a parallel test).
func (s *Server) Setenv(tb testing.TB) {
	tb.Setenv("TORPOR_S3_ACCESS_KEY", AccessKey)
	tb.Setenv("TORPOR_S3_SECRET_KEY", SecretKey)
}

// Down makes every request answer 503 ServiceUnavailable (after its body
// is read) until Up. minio-go takes a 503 for a passing failure and tries
// again, up to its retry limit, so a client sees a store that stays
// unreachable. (A 503 rather than a closed listener, so that the port stays
// the server's and connections already open fail too.)
func (s *Server) Down() { s.mu.Lock(); s.down = true; s.mu.Unlock() }

// Up ends Down.
func (s *Server) Up() { s.mu.Lock(); s.down = false; s.mu.Unlock() }

// FailNext makes the next n requests answer 500 InternalError, which
// minio-go tries again; 0 ends it.
func (s *Server) FailNext(n int) { s.mu.Lock(); s.failNext = n; s.mu.Unlock() }

// CutUploadsAfter lets the next n bytes of upload bodies (PutObject and
// UploadPart requests, all of them together, counted as sent) through,
// then closes the connection of the upload that goes past them in the
// middle of its body, and does the same to every later upload as soon as
// its body starts, until CutUploadsAfter(-1). The cut upload stores
// nothing. Other requests are not cut.
func (s *Server) CutUploadsAfter(n int64) {
	s.mu.Lock()
	s.cutLeft = max(n, -1)
	s.mu.Unlock()
}

// Requests counts the requests the server got, by HTTP method, those it
// failed on purpose included.
func (s *Server) Requests() map[string]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.requests)
}

// ServeHTTP applies the faults, then hands the request to the server.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	s.mu.Lock()
	s.requests[r.Method]++
	down := s.down
	fail := !down && s.failNext > 0
	if fail {
		s.failNext--
	}
	cut := s.cutLeft >= 0
	s.mu.Unlock()

	switch {
	case down:
		s.refuse(w, r, http.StatusServiceUnavailable, "ServiceUnavailable", "the test server is down (s3test Down)")
		return
	case fail:
		s.refuse(w, r, http.StatusInternalServerError, "InternalError", "a failure on purpose (s3test FailNext)")
		return
	}
	if cut && isUpload(r) {
		c := &cutReader{s: s, body: r.Body, size: r.ContentLength}
		r.Body = c
		r = r.WithContext(context.WithValue(r.Context(), cutKey{}, c))
	}
	s.proxy.ServeHTTP(w, r)
}

type cutKey struct{}

// proxyError answers a request the proxy could not pass on. A cut upload's
// connection is reset, so that the client learns at once that its upload
// broke, in the middle of sending it.
func (s *Server) proxyError(w http.ResponseWriter, r *http.Request, err error) {
	if c, _ := r.Context().Value(cutKey{}).(*cutReader); c != nil && c.cut.Load() {
		if conn, _, err := http.NewResponseController(w).Hijack(); err == nil {
			if tcp, ok := conn.(*net.TCPConn); ok {
				tcp.SetLinger(0)
			}
			conn.Close()
			return
		}
	}
	if errors.Is(err, context.Canceled) {
		return // the client went away
	}
	w.Header().Set("Content-Type", "application/xml")
	w.WriteHeader(http.StatusBadGateway)
	fmt.Fprintf(w, "%s<Error><Code>BadGateway</Code><Message>s3test: %s</Message></Error>", xml.Header, xmlEscape(err.Error()))
}

// errorResponse is an S3 error's body.
type errorResponse struct {
	XMLName xml.Name `xml:"Error"`
	Code    string
	Message string
}

func xmlEscape(s string) string {
	var b strings.Builder
	xml.EscapeText(&b, []byte(s))
	return b.String()
}

// refuse answers an S3 error, reading the request's body first so that the
// client sees the answer rather than a connection closed under its upload.
func (s *Server) refuse(w http.ResponseWriter, r *http.Request, status int, code, msg string) {
	io.Copy(io.Discard, io.LimitReader(r.Body, 1<<30))
	w.Header().Set("Content-Type", "application/xml")
	w.WriteHeader(status)
	if r.Method == http.MethodHead {
		return
	}
	io.WriteString(w, xml.Header)
	xml.NewEncoder(w).Encode(errorResponse{Code: code, Message: msg})
}

// isUpload tells a request that sends an object's bytes (a PutObject or an
// UploadPart, not a bucket's PUT nor a copy).
func isUpload(r *http.Request) bool {
	if r.Method != http.MethodPut || r.Header.Get("X-Amz-Copy-Source") != "" {
		return false
	}
	_, key, _ := strings.Cut(strings.TrimPrefix(r.URL.Path, "/"), "/")
	return key != ""
}

// cutReader is the body of an upload under CutUploadsAfter: it takes what
// it passes on from the server's budget and, when the budget is spent
// before the body is, fails, which makes the proxy drop the upload to the
// server and reset the client's connection (proxyError).
type cutReader struct {
	s    *Server
	body io.ReadCloser
	size int64 // the body's length, -1 when unknown
	read int64
	cut  atomic.Bool
}

func (c *cutReader) Read(p []byte) (int, error) {
	if c.cut.Load() {
		return 0, errCut
	}
	if c.size >= 0 && c.read >= c.size {
		// All of the body got through; what is left to read is its end.
		return c.body.Read(p)
	}
	c.s.mu.Lock()
	allow := int64(len(p))
	if c.s.cutLeft >= 0 {
		allow = min(allow, c.s.cutLeft)
		c.s.cutLeft -= allow
	}
	c.s.mu.Unlock()
	if allow == 0 && len(p) > 0 {
		c.cut.Store(true)
		return 0, errCut
	}
	n, err := c.body.Read(p[:allow])
	c.read += int64(n)
	if unused := allow - int64(n); unused > 0 {
		c.s.mu.Lock()
		if c.s.cutLeft >= 0 {
			c.s.cutLeft += unused
		}
		c.s.mu.Unlock()
	}
	return n, err
}

// Close closes the body, unless the connection under it is gone.
func (c *cutReader) Close() error {
	if c.cut.Load() {
		return nil
	}
	return c.body.Close()
}

var errCut = fmt.Errorf("s3test: upload cut on purpose (CutUploadsAfter)")
