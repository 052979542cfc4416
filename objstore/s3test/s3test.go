// Package s3test runs an S3-compatible server for tests: gofakes3 with its
// in-memory backend, on a loopback TCP port, behind a handler that can
// make it fail on purpose. It speaks real S3 over HTTP, so a test can point
// objstore.Open at it, and so can torpor daemons that a test runs as
// separate processes (give them URL and Env).
//
// The server checks the access key of each request (Authorization or a
// presigned URL's X-Amz-Credential), not its signature; a request with
// another key, or none, is refused with 403 AccessDenied.
//
// Everything is kept in memory and is lost when the test ends.
package s3test

import (
	"encoding/xml"
	"fmt"
	"io"
	"log"
	"maps"
	"net"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"

	"github.com/johannesboyne/gofakes3"
	"github.com/johannesboyne/gofakes3/backend/s3mem"
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
	backend  *s3mem.Backend
	s3       http.Handler
	srv      *http.Server
	endpoint string

	mu       sync.Mutex
	down     bool
	failNext int
	cutLeft  int64 // bytes of upload bodies let through before the cut; <0: no cut
	requests map[string]int64
}

// Start starts a server on 127.0.0.1 and stops it when tb ends.
func Start(tb testing.TB) *Server {
	tb.Helper()
	backend := s3mem.New()
	s := &Server{
		tb:       tb,
		backend:  backend,
		s3:       gofakes3.New(backend, gofakes3.WithLogger(gofakes3.DiscardLog())).Server(),
		cutLeft:  -1,
		requests: map[string]int64{},
	}
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
	tb.Cleanup(func() { s.srv.Close() })
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
	ok, err := s.backend.BucketExists(name)
	if err == nil && !ok {
		err = s.backend.CreateBucket(name)
	}
	if err != nil {
		s.tb.Fatalf("s3test: create bucket %q: %v", name, err)
	}
}

// Keys lists the keys of the objects in the bucket, in order, whatever the
// server's faults.
func (s *Server) Keys(bucket string) []string {
	s.tb.Helper()
	list, err := s.backend.ListBucket(bucket, &gofakes3.Prefix{}, gofakes3.ListBucketPage{})
	if err != nil {
		s.tb.Fatalf("s3test: list bucket %q: %v", bucket, err)
	}
	keys := make([]string, 0, len(list.Contents))
	for _, c := range list.Contents {
		keys = append(keys, c.Key)
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

// ServeHTTP applies the faults, then hands the request to gofakes3.
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
	if key := accessKey(r); key != AccessKey {
		s.refuse(w, r, http.StatusForbidden, "AccessDenied", fmt.Sprintf("the test server knows no access key %q", key))
		return
	}
	if isUpload(r) {
		if cut {
			r.Body = &cutReader{s: s, body: r.Body, w: w, size: r.ContentLength}
		}
		if err := decodeAWSChunked(r); err != nil {
			s.refuse(w, r, http.StatusBadRequest, "InvalidRequest", err.Error())
			return
		}
	}
	s.s3.ServeHTTP(w, r)
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
	xml.NewEncoder(w).Encode(gofakes3.ErrorResponse{Code: gofakes3.ErrorCode(code), Message: msg})
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

// accessKey returns the access key a request is signed with: the first
// part of the credential scope of a version 4 signature, or the key of a
// version 2 one.
func accessKey(r *http.Request) string {
	if c := r.URL.Query().Get("X-Amz-Credential"); c != "" {
		key, _, _ := strings.Cut(c, "/")
		return key
	}
	if k := r.URL.Query().Get("AWSAccessKeyId"); k != "" {
		return k
	}
	auth := r.Header.Get("Authorization")
	if rest, ok := strings.CutPrefix(auth, "AWS4-HMAC-SHA256 "); ok {
		for field := range strings.SplitSeq(rest, ",") {
			if c, ok := strings.CutPrefix(strings.TrimSpace(field), "Credential="); ok {
				key, _, _ := strings.Cut(c, "/")
				return key
			}
		}
		return ""
	}
	if rest, ok := strings.CutPrefix(auth, "AWS "); ok {
		key, _, _ := strings.Cut(rest, ":")
		return key
	}
	return ""
}

// cutReader is the body of an upload under CutUploadsAfter: it takes what
// it passes on from the server's budget and, when the budget is spent
// before the body is, closes the connection.
type cutReader struct {
	s    *Server
	body io.ReadCloser
	w    http.ResponseWriter
	size int64 // the body's length, -1 when unknown
	read int64
	cut  bool
}

func (c *cutReader) Read(p []byte) (int, error) {
	if c.cut {
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
		c.cut = true
		if conn, _, err := http.NewResponseController(c.w).Hijack(); err == nil {
			// A reset rather than a orderly close: the client learns at
			// once that its upload broke.
			if tcp, ok := conn.(*net.TCPConn); ok {
				tcp.SetLinger(0)
			}
			conn.Close()
		}
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
	if c.cut {
		return nil
	}
	return c.body.Close()
}

var errCut = fmt.Errorf("s3test: upload cut on purpose (CutUploadsAfter)")
