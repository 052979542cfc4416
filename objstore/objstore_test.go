package objstore_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"io"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/objstore"
	"github.com/torpor-dev/torpor/objstore/s3test"
)

// kinds are the stores the behaviour tests run on: a directory and a
// bucket of the test S3 server.
var kinds = []struct {
	name string
	open func(t *testing.T) torpor.ObjectStore
}{
	{"file", func(t *testing.T) torpor.ObjectStore { return mustOpen(t, "file://"+t.TempDir()) }},
	{"s3", func(t *testing.T) torpor.ObjectStore {
		srv := s3test.Start(t)
		srv.Setenv(t)
		return mustOpen(t, srv.URL("torpor"))
	}},
}

func forEachKind(t *testing.T, test func(t *testing.T, st torpor.ObjectStore)) {
	for _, k := range kinds {
		t.Run(k.name, func(t *testing.T) { test(t, k.open(t)) })
	}
}

func mustOpen(t *testing.T, rawURL string) torpor.ObjectStore {
	t.Helper()
	st, err := objstore.Open(context.Background(), rawURL)
	if err != nil {
		t.Fatalf("Open(%q): %v", rawURL, err)
	}
	return st
}

func put(t *testing.T, st torpor.ObjectStore, key, data string) {
	t.Helper()
	if err := st.Put(context.Background(), key, strings.NewReader(data), int64(len(data))); err != nil {
		t.Fatalf("Put(%s): %v", key, err)
	}
}

func get(t *testing.T, st torpor.ObjectStore, key string) string {
	t.Helper()
	rc, err := st.Get(context.Background(), key)
	if err != nil {
		t.Fatalf("Get(%s): %v", key, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("Get(%s): read: %v", key, err)
	}
	return string(b)
}

func wantNotFound(t *testing.T, st torpor.ObjectStore, key string) {
	t.Helper()
	rc, err := st.Get(context.Background(), key)
	if err == nil {
		b, _ := io.ReadAll(rc)
		rc.Close()
		t.Fatalf("Get(%s) = %d bytes, want not_found", key, len(b))
	}
	if !torpor.IsCode(err, torpor.ENotFound) {
		t.Fatalf("Get(%s) = %v, want not_found", key, err)
	}
}

func TestRoundTrip(t *testing.T) {
	forEachKind(t, func(t *testing.T, st torpor.ObjectStore) {
		ctx := context.Background()
		put(t, st, "sandboxes/sb-1/boot-1/disk.tar", "the disk")
		put(t, st, "manifest.json", `{"v":1}`)
		if got := get(t, st, "sandboxes/sb-1/boot-1/disk.tar"); got != "the disk" {
			t.Fatalf("Get = %q, want %q", got, "the disk")
		}
		if got := get(t, st, "manifest.json"); got != `{"v":1}` {
			t.Fatalf("Get = %q", got)
		}
		if err := st.Delete(ctx, "sandboxes/sb-1/boot-1/disk.tar"); err != nil {
			t.Fatalf("Delete: %v", err)
		}
		wantNotFound(t, st, "sandboxes/sb-1/boot-1/disk.tar")
		if err := st.Delete(ctx, "sandboxes/sb-1/boot-1/disk.tar"); err != nil {
			t.Fatalf("Delete of a missing key = %v, want no error", err)
		}
		if got := get(t, st, "manifest.json"); got != `{"v":1}` {
			t.Fatalf("the other key after Delete: Get = %q", got)
		}
	})
}

func TestReplace(t *testing.T) {
	forEachKind(t, func(t *testing.T, st torpor.ObjectStore) {
		put(t, st, "a/b", "a longer first version")
		put(t, st, "a/b", "second")
		if got := get(t, st, "a/b"); got != "second" {
			t.Fatalf("Get after replace = %q, want %q", got, "second")
		}
		put(t, st, "a/b", "")
		if got := get(t, st, "a/b"); got != "" {
			t.Fatalf("Get after replace by empty = %q", got)
		}
	})
}

// Empty objects leave the connection they went on fit for the next
// request (minio-go once sent an empty upload's closing aws-chunked chunk
// past the end of the request, and the next request read the server's 400
// about it).
func TestEmptyObjectsInARow(t *testing.T) {
	forEachKind(t, func(t *testing.T, st torpor.ObjectStore) {
		for i := range 10 {
			put(t, st, "empty", "")
			if got := get(t, st, "empty"); got != "" {
				t.Fatalf("round %d: Get = %q, want an empty object", i, got)
			}
		}
	})
}

func TestNotFound(t *testing.T) {
	forEachKind(t, func(t *testing.T, st torpor.ObjectStore) {
		wantNotFound(t, st, "never/put")
		// A key that is only the prefix of others is no object.
		put(t, st, "dir/obj", "x")
		wantNotFound(t, st, "dir")
		// Nor is a key under one that is an object.
		wantNotFound(t, st, "dir/obj/under")
		if err := st.Delete(context.Background(), "dir"); err != nil {
			t.Fatalf("Delete(prefix) = %v, want no error", err)
		}
		if err := st.Delete(context.Background(), "dir/obj/under"); err != nil {
			t.Fatalf("Delete(under an object) = %v, want no error", err)
		}
		if got := get(t, st, "dir/obj"); got != "x" {
			t.Fatalf("Get = %q after deleting its prefix", got)
		}
	})
}

func TestBadKeys(t *testing.T) {
	bad := []string{"", "/abs", "trailing/", "a//b", "..", "../up", "a/../b", ".", "a/./b",
		"space here", "tab\t", "nul\x00", "ünïcode", "back\\slash", "tilde~", "q?x", strings.Repeat("k", 1025)}
	forEachKind(t, func(t *testing.T, st torpor.ObjectStore) {
		ctx := context.Background()
		for _, key := range bad {
			if err := st.Put(ctx, key, strings.NewReader("x"), 1); !torpor.IsCode(err, torpor.EInvalid) {
				t.Errorf("Put(%q) = %v, want invalid_argument", key, err)
			}
			if _, err := st.Get(ctx, key); !torpor.IsCode(err, torpor.EInvalid) {
				t.Errorf("Get(%q) = %v, want invalid_argument", key, err)
			}
			if err := st.Delete(ctx, key); !torpor.IsCode(err, torpor.EInvalid) {
				t.Errorf("Delete(%q) = %v, want invalid_argument", key, err)
			}
		}
		// The characters keys may have are all taken.
		put(t, st, "Az09._-/.hidden/x..y", "ok")
		if got := get(t, st, "Az09._-/.hidden/x..y"); got != "ok" {
			t.Fatalf("Get = %q", got)
		}
	})
}

// random returns n bytes of reproducible noise as a plain io.Reader (no
// Seek, no ReadAt), and their SHA-256.
func random(seed byte, n int64) (io.Reader, [32]byte) {
	h := sha256.New()
	io.Copy(h, io.LimitReader(rand.NewChaCha8([32]byte{seed}), n))
	var sum [32]byte
	h.Sum(sum[:0])
	return io.LimitReader(rand.NewChaCha8([32]byte{seed}), n), sum
}

func getSum(t *testing.T, st torpor.ObjectStore, key string) ([32]byte, int64) {
	t.Helper()
	rc, err := st.Get(context.Background(), key)
	if err != nil {
		t.Fatalf("Get(%s): %v", key, err)
	}
	defer rc.Close()
	h := sha256.New()
	n, err := io.Copy(h, rc)
	if err != nil {
		t.Fatalf("Get(%s): read: %v", key, err)
	}
	var sum [32]byte
	h.Sum(sum[:0])
	return sum, n
}

func TestLargeObjects(t *testing.T) {
	const mib = 1 << 20
	forEachKind(t, func(t *testing.T, st torpor.ObjectStore) {
		ctx := context.Background()
		check := func(key string, n int64, want [32]byte) {
			t.Helper()
			got, size := getSum(t, st, key)
			if size != n || got != want {
				t.Fatalf("Get(%s) = %d bytes (sha256 %x), want %d bytes (sha256 %x)", key, size, got[:8], n, want[:8])
			}
		}

		// A stream of unknown size, longer than two parts.
		r, sum := random(1, 40*mib)
		if err := st.Put(ctx, "unknown-size", r, -1); err != nil {
			t.Fatalf("Put(size -1): %v", err)
		}
		check("unknown-size", 40*mib, sum)

		// A stream of known size, not a whole number of parts.
		r, sum = random(2, 33*mib+5)
		if err := st.Put(ctx, "known-size", r, 33*mib+5); err != nil {
			t.Fatalf("Put(known size): %v", err)
		}
		check("known-size", 33*mib+5, sum)

		// A file, which minio-go reads at offsets, in parallel.
		r, sum = random(3, 33*mib+7)
		f, err := os.Create(filepath.Join(t.TempDir(), "disk"))
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		if _, err := io.Copy(f, r); err != nil {
			t.Fatal(err)
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			t.Fatal(err)
		}
		if err := st.Put(ctx, "from-file", f, 33*mib+7); err != nil {
			t.Fatalf("Put(file): %v", err)
		}
		check("from-file", 33*mib+7, sum)

		// Small and empty streams of unknown size.
		for _, data := range []string{"", "tiny"} {
			if err := st.Put(ctx, "small", io.LimitReader(strings.NewReader(data), 1<<40), -1); err != nil {
				t.Fatalf("Put(%q, size -1): %v", data, err)
			}
			if got := get(t, st, "small"); got != data {
				t.Fatalf("Get = %q, want %q", got, data)
			}
		}
	})
}

func TestShortReaderWritesNothing(t *testing.T) {
	forEachKind(t, func(t *testing.T, st torpor.ObjectStore) {
		ctx := context.Background()
		if err := st.Put(ctx, "short", strings.NewReader("only 12 byte"), 100); err == nil {
			t.Fatal("Put of a reader shorter than its size succeeded")
		}
		wantNotFound(t, st, "short")
		put(t, st, "short", "v1")
		if err := st.Put(ctx, "short", strings.NewReader("only 12 byte"), 100); err == nil {
			t.Fatal("Put of a reader shorter than its size succeeded")
		}
		if got := get(t, st, "short"); got != "v1" {
			t.Fatalf("Get after a failed replace = %q, want the previous %q", got, "v1")
		}
	})
}

func TestCanceledPut(t *testing.T) {
	forEachKind(t, func(t *testing.T, st torpor.ObjectStore) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		r, _ := random(4, 1<<20)
		if err := st.Put(ctx, "canceled", r, -1); err == nil {
			t.Fatal("Put with a canceled context succeeded")
		}
		wantNotFound(t, st, "canceled")
	})
}

func TestFileLeavesNoTemporaryFiles(t *testing.T) {
	dir := t.TempDir()
	st := mustOpen(t, "file://"+dir)
	put(t, st, "k/v", "one")
	st.Put(context.Background(), "k/v", strings.NewReader("short"), 10)
	put(t, st, "k/v", "two")
	entries, err := os.ReadDir(filepath.Join(dir, "k"))
	if err != nil {
		t.Fatal(err)
	}
	if len(entries) != 1 || entries[0].Name() != "v" {
		var names []string
		for _, e := range entries {
			names = append(names, e.Name())
		}
		t.Fatalf("the directory holds %v, want only the object v", names)
	}
}

func TestWhere(t *testing.T) {
	dir := t.TempDir()
	if got := mustOpen(t, "file://"+dir).Where(); got != "file://"+dir {
		t.Errorf("Where = %q, want %q", got, "file://"+dir)
	}

	srv := s3test.Start(t)
	srv.Setenv(t)
	w := mustOpen(t, srv.URL("torpor/fleet-a")).Where()
	for _, secret := range []string{s3test.AccessKey, s3test.SecretKey} {
		if strings.Contains(w, secret) {
			t.Errorf("Where = %q shows a credential", w)
		}
	}
	for _, part := range []string{"s3://torpor/fleet-a", srv.Endpoint()} {
		if !strings.Contains(w, part) {
			t.Errorf("Where = %q does not name %q", w, part)
		}
	}
}

func TestS3Prefix(t *testing.T) {
	srv := s3test.Start(t)
	srv.Setenv(t)
	a := mustOpen(t, srv.URL("shared/fleet-a"))
	b := mustOpen(t, srv.URL("shared/fleet-b/sub"))
	put(t, a, "k", "a")
	put(t, b, "k", "b")
	if got := get(t, a, "k"); got != "a" {
		t.Errorf("fleet-a Get = %q", got)
	}
	if got := get(t, b, "k"); got != "b" {
		t.Errorf("fleet-b Get = %q", got)
	}
	if got := strings.Join(srv.Keys("shared"), " "); got != "fleet-a/k fleet-b/sub/k" {
		t.Errorf("the bucket holds %q, want the keys under their prefixes", got)
	}
}

func TestS3Down(t *testing.T) {
	srv := s3test.Start(t)
	srv.Setenv(t)
	st := mustOpen(t, srv.URL("torpor"))
	put(t, st, "before", "v1")

	srv.Down()
	// The deadline is far beyond the client's own retries: the client,
	// not the deadline, must give up.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	checkErr := func(op string, err error) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s succeeded with the server down", op)
		}
		if errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%s waited for the deadline: %v", op, err)
		}
		if strings.Contains(err.Error(), s3test.SecretKey) || strings.Contains(err.Error(), s3test.AccessKey) {
			t.Fatalf("%s error shows a credential: %v", op, err)
		}
		if !strings.Contains(err.Error(), "after") {
			t.Fatalf("%s error %q does not name the key", op, err)
		}
	}
	checkErr("Put", st.Put(ctx, "after", bytes.NewReader([]byte("v2")), 2))
	r, _ := random(5, 20<<20)
	checkErr("Put(size -1)", st.Put(ctx, "after", r, -1))
	_, err := st.Get(ctx, "after")
	checkErr("Get", err)
	if torpor.IsCode(err, torpor.ENotFound) {
		t.Fatalf("Get with the server down = %v, want a failure, not not_found", err)
	}
	if _, err := objstore.Open(ctx, srv.URL("torpor")); err == nil {
		t.Fatal("Open succeeded with the server down")
	}
	if n := srv.Requests()["PUT"]; n < 2 {
		t.Errorf("the server got %d PUTs, want the client to have tried again", n)
	}

	srv.Up()
	put(t, st, "after", "v2")
	if got := get(t, st, "after"); got != "v2" {
		t.Fatalf("Get after Up = %q", got)
	}
	if got := get(t, st, "before"); got != "v1" {
		t.Fatalf("Get after Up = %q", got)
	}
}

func TestS3FailNext(t *testing.T) {
	srv := s3test.Start(t)
	srv.Setenv(t)
	st := mustOpen(t, srv.URL("torpor"))
	ctx := context.Background()

	before := srv.Requests()["PUT"]
	srv.FailNext(2)
	if err := st.Put(ctx, "k", bytes.NewReader([]byte("v1")), 2); err != nil {
		t.Fatalf("Put after 2 failures: %v, want the client to try again", err)
	}
	if n := srv.Requests()["PUT"] - before; n != 3 {
		t.Errorf("the server got %d PUTs, want 3 (2 failed, 1 stored)", n)
	}
	if got := get(t, st, "k"); got != "v1" {
		t.Fatalf("Get = %q", got)
	}

	srv.FailNext(1000)
	if err := st.Put(ctx, "k", bytes.NewReader([]byte("v2")), 2); err == nil {
		t.Fatal("Put succeeded while every request failed")
	}
	srv.FailNext(0)
	if got := get(t, st, "k"); got != "v1" {
		t.Fatalf("Get after a failed Put = %q, want the previous version", got)
	}
}

func TestS3CutUploads(t *testing.T) {
	srv := s3test.Start(t)
	srv.Setenv(t)
	st := mustOpen(t, srv.URL("torpor"))
	ctx := context.Background()
	put(t, st, "disk", "v1")

	srv.CutUploadsAfter(1 << 20)
	r, _ := random(6, 40<<20)
	if err := st.Put(ctx, "disk", r, -1); err == nil {
		t.Fatal("a multipart Put cut in the middle succeeded")
	}
	if err := st.Put(ctx, "single", bytes.NewReader(make([]byte, 4<<20)), 4<<20); err == nil {
		t.Fatal("a single Put cut in the middle succeeded")
	}
	srv.CutUploadsAfter(-1)

	if got := get(t, st, "disk"); got != "v1" {
		t.Fatalf("Get after a cut replace = %d bytes, want the previous version", len(got))
	}
	wantNotFound(t, st, "single")

	// With the cut over, uploads work again.
	r, sum := random(7, 20<<20)
	if err := st.Put(ctx, "disk", r, -1); err != nil {
		t.Fatalf("Put after the cut: %v", err)
	}
	if got, _ := getSum(t, st, "disk"); got != sum {
		t.Fatal("Get after the cut returned other bytes than were put")
	}
}

func TestS3CutLetsTheFirstBytesThrough(t *testing.T) {
	srv := s3test.Start(t)
	srv.Setenv(t)
	st := mustOpen(t, srv.URL("torpor"))
	// 40 MiB go as parts of 16 MiB: the cut after 20 MiB breaks the
	// second part, and the first stored part is not an object.
	srv.CutUploadsAfter(20 << 20)
	r, _ := random(8, 40<<20)
	if err := st.Put(context.Background(), "disk", r, -1); err == nil {
		t.Fatal("Put cut after 20 of 40 MiB succeeded")
	}
	srv.CutUploadsAfter(-1)
	wantNotFound(t, st, "disk")
	if keys := srv.Keys("torpor"); len(keys) != 0 {
		t.Fatalf("the bucket holds %v after a cut upload", keys)
	}
}

func TestOpenRefuses(t *testing.T) {
	srv := s3test.Start(t)
	srv.Setenv(t)
	ctx := context.Background()
	file := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(file, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	ep := srv.Endpoint()
	for _, tc := range []struct {
		url  string
		code torpor.ErrorCode
	}{
		{"", torpor.EInvalid},
		{"gs://bucket", torpor.EInvalid},
		{"/just/a/path", torpor.EInvalid},
		{"s3://key:SECRETVALUE@bucket?endpoint=" + ep, torpor.EInvalid},
		{"s3://bucket?endpoint=" + ep + "&regoin=x", torpor.EInvalid},
		{"s3://bucket?endpoint=ftp://127.0.0.1:1", torpor.EInvalid},
		{"s3://bucket?endpoint=http://u:SECRETVALUE@127.0.0.1:1", torpor.EInvalid},
		{"s3://bucket?endpoint=" + ep + "/path", torpor.EInvalid},
		{"s3://bucket?endpoint=" + ep + "&path_style=maybe", torpor.EInvalid},
		{"s3://Bad_Bucket?endpoint=" + ep, torpor.EInvalid},
		{"s3://bucket/bad..prefix/../x?endpoint=" + ep, torpor.EInvalid},
		{"s3://missing-bucket?endpoint=" + ep + "&region=us-east-1&path_style=true", torpor.ENotFound},
		{"file://relative/dir", torpor.EInvalid},
		{"file:///" + strings.TrimPrefix(t.TempDir(), "/") + "/missing", torpor.ENotFound},
		{"file://" + file, torpor.EInvalid},
		{"file://" + t.TempDir() + "?create=true", torpor.EInvalid},
	} {
		_, err := objstore.Open(ctx, tc.url)
		if !torpor.IsCode(err, tc.code) {
			t.Errorf("Open(%q) = %v, want %s", tc.url, err, tc.code)
		}
		if err != nil && strings.Contains(err.Error(), "SECRETVALUE") {
			t.Errorf("Open(%q) error shows the secret: %v", tc.url, err)
		}
	}

	// The missing bucket is made on request, and is there for the next
	// Open too.
	u := "s3://made-bucket?endpoint=" + ep + "&region=us-east-1&path_style=true"
	st := mustOpen(t, u+"&create_bucket=true")
	put(t, st, "k", "v")
	if got := get(t, mustOpen(t, u), "k"); got != "v" {
		t.Fatalf("Get = %q", got)
	}
}

func TestS3Credentials(t *testing.T) {
	srv := s3test.Start(t)
	url := srv.URL("torpor")
	ctx := context.Background()
	for _, v := range []string{"TORPOR_S3_ACCESS_KEY", "TORPOR_S3_SECRET_KEY", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"} {
		t.Setenv(v, "")
	}
	if _, err := objstore.Open(ctx, url); !torpor.IsCode(err, torpor.EInvalid) || !strings.Contains(err.Error(), "TORPOR_S3_ACCESS_KEY") {
		t.Fatalf("Open without credentials = %v, want invalid_argument naming the variables", err)
	}
	t.Setenv("TORPOR_S3_ACCESS_KEY", s3test.AccessKey)
	if _, err := objstore.Open(ctx, url); !torpor.IsCode(err, torpor.EInvalid) || !strings.Contains(err.Error(), "TORPOR_S3_SECRET_KEY") {
		t.Fatalf("Open without a secret = %v, want invalid_argument naming it", err)
	}
	t.Setenv("TORPOR_S3_ACCESS_KEY", "someone-else")
	t.Setenv("TORPOR_S3_SECRET_KEY", "WRONGSECRET")
	_, err := objstore.Open(ctx, url)
	if err == nil {
		t.Fatal("Open with a key the server does not know succeeded")
	}
	if strings.Contains(err.Error(), "WRONGSECRET") {
		t.Fatalf("Open error shows the secret: %v", err)
	}

	// The AWS variables are read when torpor's are not set.
	t.Setenv("TORPOR_S3_ACCESS_KEY", "")
	t.Setenv("TORPOR_S3_SECRET_KEY", "")
	t.Setenv("AWS_ACCESS_KEY_ID", s3test.AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", s3test.SecretKey)
	put(t, mustOpen(t, url), "k", "v")
}
