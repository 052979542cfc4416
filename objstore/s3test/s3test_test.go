package s3test_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/torpor-dev/torpor/objstore/s3test"
)

// signed returns a request that carries the server's access key the way
// a version 4 signature does (the server checks the key, not the
// signature).
func signed(t *testing.T, method, url string, key string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "AWS4-HMAC-SHA256 Credential="+key+"/20260101/us-east-1/s3/aws4_request, SignedHeaders=host, Signature=00")
	return req
}

func status(t *testing.T, req *http.Request) (int, string) {
	t.Helper()
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res.StatusCode, string(b)
}

func TestFaultsAndKeys(t *testing.T) {
	srv := s3test.Start(t)
	srv.CreateBucket("b")
	bucket := srv.Endpoint() + "/b"

	if code, _ := status(t, signed(t, "GET", bucket, s3test.AccessKey)); code != http.StatusOK {
		t.Fatalf("list with the server's key = %d, want 200", code)
	}
	if code, body := status(t, signed(t, "GET", bucket, "stranger")); code != http.StatusForbidden || !strings.Contains(body, "AccessDenied") {
		t.Fatalf("list with another key = %d %s, want 403 AccessDenied", code, body)
	}
	req, _ := http.NewRequest("GET", bucket, nil)
	if code, _ := status(t, req); code != http.StatusForbidden {
		t.Fatalf("anonymous list = %d, want 403", code)
	}

	srv.Down()
	if code, body := status(t, signed(t, "GET", bucket, s3test.AccessKey)); code != http.StatusServiceUnavailable || !strings.Contains(body, "ServiceUnavailable") {
		t.Fatalf("list while down = %d %s, want 503 ServiceUnavailable", code, body)
	}
	srv.Up()

	srv.FailNext(2)
	for range 2 {
		if code, _ := status(t, signed(t, "GET", bucket, s3test.AccessKey)); code != http.StatusInternalServerError {
			t.Fatalf("list under FailNext = %d, want 500", code)
		}
	}
	if code, _ := status(t, signed(t, "GET", bucket, s3test.AccessKey)); code != http.StatusOK {
		t.Fatalf("list after FailNext = %d, want 200", code)
	}

	if got := srv.Requests(); got["GET"] != 7 {
		t.Fatalf("Requests = %v, want 7 GETs", got)
	}
	if u := srv.URL("c/prefix"); !strings.HasPrefix(u, "s3://c/prefix?") || !strings.Contains(u, "path_style=true") {
		t.Fatalf("URL = %q", u)
	}
	if keys := srv.Keys("c"); len(keys) != 0 {
		t.Fatalf("a new bucket holds %v", keys)
	}
}

// An aws-chunked upload is stored as the bytes it carries, and a malformed
// one is refused.
func TestAWSChunkedUpload(t *testing.T) {
	srv := s3test.Start(t)
	srv.CreateBucket("b")
	sig := ";chunk-signature=" + strings.Repeat("0", 64) + "\r\n"
	for _, tc := range []struct {
		body    string
		decoded string
		ok      bool
	}{
		{"5" + sig + "hello\r\n" + "6" + sig + " world\r\n" + "0" + sig + "\r\n", "11", true},
		{"5" + sig + "hello\r\n" + "0" + sig + "\r\n", "11", false}, // shorter than announced
		{"b" + sig + "hello world\r\n" + "0" + sig, "5", false},     // longer than announced
		{"zz" + sig + "hello\r\n" + "0" + sig + "\r\n", "5", false}, // bad size
		{"5" + sig + "helloXX" + "0" + sig + "\r\n", "5", false},    // no CRLF after the data
	} {
		req := signed(t, "PUT", srv.Endpoint()+"/b/obj", s3test.AccessKey)
		req.Body = io.NopCloser(strings.NewReader(tc.body))
		req.ContentLength = int64(len(tc.body))
		req.Header.Set("X-Amz-Content-Sha256", "STREAMING-AWS4-HMAC-SHA256-PAYLOAD")
		req.Header.Set("X-Amz-Decoded-Content-Length", tc.decoded)
		req.Header.Set("Content-Encoding", "aws-chunked")
		code, body := status(t, req)
		if tc.ok != (code == http.StatusOK) {
			t.Errorf("PUT %q = %d %s, want success %v", tc.body, code, body, tc.ok)
		}
	}
	code, body := status(t, signed(t, "GET", srv.Endpoint()+"/b/obj", s3test.AccessKey))
	if code != http.StatusOK || body != "hello world" {
		t.Fatalf("GET = %d %q, want the decoded body", code, body)
	}
}
