package s3test_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/minio/minio-go/v7/pkg/signer"
	"github.com/torpor-dev/torpor/objstore/s3test"
)

// signed returns a request signed (version 4) with the access key and,
// for the server's key, its secret.
func signed(t *testing.T, method, url string, key string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	secret := "not-the-secret"
	if key == s3test.AccessKey {
		secret = s3test.SecretKey
	}
	req.Header.Set("X-Amz-Content-Sha256", "UNSIGNED-PAYLOAD")
	return signer.SignV4(*req, key, secret, "", s3test.Region)
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
	srv.CreateBucket("bkt")
	bucket := srv.Endpoint() + "/bkt"

	if code, _ := status(t, signed(t, "GET", bucket, s3test.AccessKey)); code != http.StatusOK {
		t.Fatalf("list with the server's key = %d, want 200", code)
	}
	// AWS answers 403 InvalidAccessKeyId; Versity's gateway 404
	// XAdminUserNotFound.
	if code, body := status(t, signed(t, "GET", bucket, "stranger")); code/100 != 4 || !strings.Contains(body, "<Error>") {
		t.Fatalf("list with another key = %d %s, want a 4xx S3 error", code, body)
	}
	req := signed(t, "GET", bucket, s3test.AccessKey)
	req.Header.Set("Authorization", strings.Replace(req.Header.Get("Authorization"), "Signature=", "Signature=00", 1))
	if code, body := status(t, req); code != http.StatusForbidden || !strings.Contains(body, "SignatureDoesNotMatch") {
		t.Fatalf("list with a bad signature = %d %s, want 403 SignatureDoesNotMatch", code, body)
	}
	req, _ = http.NewRequest("GET", bucket, nil)
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

	if got := srv.Requests(); got["GET"] != 8 {
		t.Fatalf("Requests = %v, want 8 GETs", got)
	}
	if u := srv.URL("cbk/prefix"); !strings.HasPrefix(u, "s3://cbk/prefix?") || !strings.Contains(u, "path_style=true") {
		t.Fatalf("URL = %q", u)
	}
	if keys := srv.Keys("cbk"); len(keys) != 0 {
		t.Fatalf("a new bucket holds %v", keys)
	}
}
