package api_test

import (
	"archive/tar"
	"bufio"
	"bytes"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api"
	"github.com/torpor-dev/torpor/client"
	"github.com/torpor-dev/torpor/files"
	"github.com/torpor-dev/torpor/lifecycle"
	"github.com/torpor-dev/torpor/runtime/fake"
	"github.com/torpor-dev/torpor/store/sqlite"
)

// filesFixture is a fixture whose fake runtime keeps each sandbox's files
// in a temporary directory.
func filesFixture(t *testing.T) (*fixture, string) {
	t.Helper()
	f := newFixture(t)
	f.host.FilesDir = t.TempDir()
	return f, f.host.FilesDir
}

// mustRead returns a function that reads a whole stream, failing the test
// on any error; call it as mustRead(t)(cl.ReadFile(...)).
func mustRead(t *testing.T) func(io.ReadCloser, error) string {
	return func(rc io.ReadCloser, err error) string {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		defer rc.Close()
		b, err := io.ReadAll(rc)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
}

func TestFilesThroughTheClient(t *testing.T) {
	f, _ := filesFixture(t)
	cl := f.tenantCl
	sb, err := cl.Create(ctx, torpor.CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	info, err := cl.WriteFile(ctx, sb.ID, "/root/a/b.txt", strings.NewReader("hello"), &client.WriteOptions{Mode: client.Mode(0o600)})
	if err != nil || info.Size != 5 || info.Mode != 0o600 || info.Path != "/root/a/b.txt" {
		t.Fatalf("write %+v %v", info, err)
	}
	if got := mustRead(t)(cl.ReadFile(ctx, sb.ID, "root/a/b.txt")); got != "hello" {
		t.Fatalf("read %q", got)
	}
	if st, err := cl.StatFile(ctx, sb.ID, "/root/a"); err != nil || st.Type != files.TypeDir {
		t.Fatalf("stat %+v %v", st, err)
	}
	if _, err := cl.Mkdir(ctx, sb.ID, "/root/x/y", &client.MkdirOptions{Parents: true, Mode: client.Mode(0o700)}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Rename(ctx, sb.ID, "/root/a/b.txt", "/root/x/y/c.txt", false); err != nil {
		t.Fatal(err)
	}
	l, err := cl.ListFiles(ctx, sb.ID, "/root", 3)
	if err != nil || len(l.Entries) != 4 || l.Entries[3].Path != "/root/x/y/c.txt" || l.Truncated {
		t.Fatalf("list %+v %v", l, err)
	}
	if err := cl.RemoveFile(ctx, sb.ID, "/root/x", false); !client.IsConflict(err) {
		t.Fatalf("rm of a non-empty dir: %v", err)
	}
	if err := cl.RemoveFile(ctx, sb.ID, "/root/x", true); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.StatFile(ctx, sb.ID, "/root/x"); !client.IsNotFound(err) {
		t.Fatalf("stat after rm: %v", err)
	}
	// Large bodies stream, with and without a declared length.
	big := strings.Repeat("0123456789abcdef", 1<<17) // 2 MiB: over the JSON limit
	if _, err := cl.WriteFile(ctx, sb.ID, "/big", io.MultiReader(strings.NewReader(big)), nil); err != nil {
		t.Fatal(err)
	}
	if got := mustRead(t)(cl.ReadFile(ctx, sb.ID, "/big")); got != big {
		t.Fatalf("big read %d bytes", len(got))
	}
	// Tar round trip.
	tr := mustRead(t)(cl.DownloadTar(ctx, sb.ID, "/root"))
	res, err := cl.UploadTar(ctx, sb.ID, "/copy", strings.NewReader(tr))
	if err != nil || res.Entries != 1 || res.SkippedCount != 0 {
		t.Fatalf("upload %+v %v", res, err)
	}
	if st, err := cl.StatFile(ctx, sb.ID, "/copy/a"); err != nil || st.Type != files.TypeDir {
		t.Fatalf("after the round trip: %+v %v", st, err)
	}
	// Another tenant sees nothing.
	if _, err := f.adminCl.StatFile(ctx, sb.ID, "/big"); !client.IsNotFound(err) {
		t.Fatalf("another tenant: %v", err)
	}
	if _, err := cl.StatFile(ctx, "nosuchsandbox", "/"); !client.IsNotFound(err) {
		t.Fatalf("unknown sandbox: %v", err)
	}
	cl.Delete(ctx, sb.ID)
	if _, err := cl.StatFile(ctx, sb.ID, "/"); !client.IsGone(err) {
		t.Fatalf("a terminated sandbox: %v", err)
	}
}

// TestFilesOfAPausedSandbox: reads leave a paused sandbox paused; writes
// wake it by its auto_resume rule, and are refused with it off.
func TestFilesOfAPausedSandbox(t *testing.T) {
	f, _ := filesFixture(t)
	cl := f.tenantCl
	off := false
	for _, autoResume := range []bool{true, false} {
		req := torpor.CreateRequest{Template: "base"}
		if !autoResume {
			req.Lifecycle = &torpor.Lifecycle{AutoResume: &off}
		}
		sb, err := cl.Create(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cl.WriteFile(ctx, sb.ID, "/f", strings.NewReader("x"), nil); err != nil {
			t.Fatal(err)
		}
		cl.Pause(ctx, sb.ID, "")
		if got := mustRead(t)(cl.ReadFile(ctx, sb.ID, "/f")); got != "x" {
			t.Fatalf("read %q", got)
		}
		if _, err := cl.ListFiles(ctx, sb.ID, "/", 1); err != nil {
			t.Fatal(err)
		}
		if got, _ := cl.Get(ctx, sb.ID); got.State != torpor.StatePaused || f.host.State(sb.ID) != torpor.InstanceFrozen {
			t.Fatalf("a read woke the sandbox: %s", got.State)
		}
		_, err = cl.WriteFile(ctx, sb.ID, "/f", strings.NewReader("y"), nil)
		got, _ := cl.Get(ctx, sb.ID)
		if autoResume && (err != nil || got.State != torpor.StateRunning || got.Meters.AutoResumed != 1) {
			t.Fatalf("a write with auto_resume: %v %s", err, got.State)
		}
		if !autoResume && (!client.IsConflict(err) || got.State != torpor.StatePaused) {
			t.Fatalf("a write with auto_resume off: %v %s", err, got.State)
		}
	}
}

// TestFilesBadInput: every bad input is a 4xx naming the parameter, never
// a 500, and does not wake a paused sandbox.
func TestFilesBadInput(t *testing.T) {
	f, _ := filesFixture(t)
	sb, _ := f.tenantCl.Create(ctx, torpor.CreateRequest{Template: "base"})
	f.tenantCl.WriteFile(ctx, sb.ID, "/dir/file", strings.NewReader("x"), nil)
	f.tenantCl.Pause(ctx, sb.ID, "")
	base := "/v1/sandboxes/" + sb.ID + "/files"
	long := "/" + strings.Repeat("a", files.MaxPath)
	cases := []struct {
		method, path, ctype, body string
		status                    int
		param                     string
	}{
		{"GET", base, "", "", 400, "path"},
		{"GET", base + "?path=%2Fa%00b", "", "", 400, "path"},
		{"GET", base + "?path=" + long, "", "", 400, "path"},
		{"GET", base + "?path=/proc/1/environ", "", "", 400, "path"},
		{"GET", base + "?path=/.torpor/run", "", "", 400, "path"},
		{"GET", base + "?path=/dev/../sys", "", "", 400, "path"},
		{"PUT", base + "?path=/x&mode=8", "", "x", 400, "mode"},
		{"PUT", base + "?path=/x&mode=17777", "", "x", 400, "mode"},
		{"PUT", base + "?path=/", "", "x", 400, "path"},
		{"PUT", base + "?path=/dev/null", "", "x", 400, "path"},
		{"DELETE", base + "?path=/", "", "", 400, "path"},
		{"DELETE", base + "?path=/dir&recursive=maybe", "", "", 400, "recursive"},
		{"GET", base + "/list?depth=0", "", "", 400, "depth"},
		{"GET", base + "/list?depth=11", "", "", 400, "depth"},
		{"GET", base + "/list?depth=x", "", "", 400, "depth"},
		{"GET", base + "/stat", "", "", 400, "path"},
		{"POST", base + "/mkdir", "application/json", `{"path":"/a","mode":"999"}`, 400, "mode"},
		{"POST", base + "/mkdir", "application/json", `{"path":"/a","nope":1}`, 400, "nope"},
		{"POST", base + "/mkdir", "application/json", `{"path":""}`, 400, "path"},
		{"POST", base + "/mkdir", "text/plain", `{"path":"/a"}`, 400, "Content-Type"},
		{"POST", base + "/rename", "application/json", `{"from":"/dir"}`, 400, "to"},
		{"POST", base + "/rename", "application/json", `{"from":"/sys","to":"/x"}`, 400, "from"},
		{"GET", base + "/tar", "", "", 400, "path"},
		{"PUT", base + "/tar?path=/proc", "", "", 400, "path"},
		{"GET", base + "?path=/nope", "", "", 404, ""},
		{"GET", base + "?path=/dir", "", "", 409, ""},
		{"GET", base + "/list?path=/dir/file", "", "", 409, ""},
		{"GET", base + "/tar?path=/nope", "", "", 404, ""},
		{"POST", base + "/rename", "application/json", `{"from":"/","to":"/x"}`, 400, "from"},
		{"POST", base + "/rename", "application/json", `{"from":"/dir","to":"/"}`, 400, "to"},
		{"DELETE", "/v1/sandboxes/nosuch/files?path=/x", "", "", 404, "id"},
	}
	for _, c := range cases {
		status, eb := f.raw(t, c.method, c.path, f.acmeKey, c.ctype, c.body)
		if status != c.status || eb.Error.Param != c.param {
			t.Errorf("%s %s: %d %+v, want %d param %q", c.method, c.path, status, eb.Error, c.status, c.param)
		}
	}
	if got, _ := f.tenantCl.Get(ctx, sb.ID); got.State != torpor.StatePaused {
		t.Fatalf("bad input woke the sandbox: %s", got.State)
	}
}

// TestFilesCannotEscapeThroughTheAPI: a symlink the sandbox made to a host
// file reads as nothing.
func TestFilesCannotEscapeThroughTheAPI(t *testing.T) {
	f, dir := filesFixture(t)
	sb, _ := f.tenantCl.Create(ctx, torpor.CreateRequest{Template: "base"})
	secret := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(secret, []byte("HOST-SECRET"), 0o600)
	root := filepath.Join(dir, sb.ID)
	os.Symlink(secret, filepath.Join(root, "abs"))
	os.Symlink("../../../../../../.."+secret, filepath.Join(root, "rel"))
	for _, p := range []string{"/abs", "/rel", "/../../../.." + secret} {
		rc, err := f.tenantCl.ReadFile(ctx, sb.ID, p)
		if err == nil {
			b, _ := io.ReadAll(rc)
			rc.Close()
			t.Fatalf("%s read %q", p, b)
		}
		if !client.IsNotFound(err) {
			t.Fatalf("%s: %v", p, err)
		}
	}
	tr := mustRead(t)(f.tenantCl.DownloadTar(ctx, sb.ID, "/"))
	if strings.Contains(tr, "HOST-SECRET") {
		t.Fatal("the tar of / holds the host's file")
	}
	if b, _ := os.ReadFile(secret); string(b) != "HOST-SECRET" {
		t.Fatal("the host file changed")
	}
}

func TestFilesUploadLimitAndBrokenArchives(t *testing.T) {
	cl := limitedClient(t, 1000)
	sb, err := cl.Create(ctx, torpor.CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := cl.WriteFile(ctx, sb.ID, "/ok", strings.NewReader(strings.Repeat("x", 1000)), nil); err != nil {
		t.Fatal(err)
	}
	// Declared too large: refused up front. Streamed too large: cut, and
	// nothing is left.
	_, err = cl.WriteFile(ctx, sb.ID, "/big", strings.NewReader(strings.Repeat("x", 1001)), nil)
	if !client.IsInvalid(err) {
		t.Fatalf("declared over the limit: %v", err)
	}
	_, err = cl.WriteFile(ctx, sb.ID, "/big", io.MultiReader(strings.NewReader(strings.Repeat("x", 5000))), nil)
	if !client.IsInvalid(err) {
		t.Fatalf("streamed over the limit: %v", err)
	}
	if _, err := cl.StatFile(ctx, sb.ID, "/big"); !client.IsNotFound(err) {
		t.Fatalf("a refused upload left a file: %v", err)
	}
	if _, err := cl.UploadTar(ctx, sb.ID, "/t", strings.NewReader(strings.Repeat("not a tar ", 50))); !client.IsInvalid(err) {
		t.Fatalf("garbage archive: %v", err)
	}
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	tw.WriteHeader(&tar.Header{Name: "f", Size: 500, Mode: 0o644, Typeflag: tar.TypeReg})
	tw.Write(make([]byte, 500))
	tw.Close()
	if _, err := cl.UploadTar(ctx, sb.ID, "/t", bytes.NewReader(buf.Bytes()[:700])); !client.IsInvalid(err) {
		t.Fatalf("cut archive: %v", err)
	}
	if _, err := cl.StatFile(ctx, sb.ID, "/t/f"); !client.IsNotFound(err) {
		t.Fatalf("a cut archive left a partial file: %v", err)
	}
}

// limitedClient returns a client of a fresh server whose uploads are
// limited to limit bytes, with the fake runtime keeping files.
func limitedClient(t *testing.T, limit int64) *client.Client {
	t.Helper()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "torpor.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	now := time.Now().UTC()
	st.PutTemplate(ctx, torpor.Template{Name: "base", RootFS: "/x", CreatedAt: now})
	st.CreateTenant(ctx, torpor.Tenant{Name: "default", CreatedAt: now})
	secret, k := torpor.NewAPIKey("default", true, now)
	if err := st.CreateAPIKey(ctx, k); err != nil {
		t.Fatal(err)
	}
	host := fake.NewHost()
	host.FilesDir = t.TempDir()
	eng, err := lifecycle.New(lifecycle.Config{Store: st, Runtimes: []torpor.Runtime{fake.New(host)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(eng.Close)
	if err := eng.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	srv := api.New(api.Config{Engine: eng, Auth: st, Templates: st, MaxUploadBytes: limit})
	srv.SetReady()
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	cl, _ := client.New(hs.URL, secret)
	return cl
}

// TestFilesReadSupportsRanges: a download can resume where it stopped.
func TestFilesReadSupportsRanges(t *testing.T) {
	f, _ := filesFixture(t)
	sb, _ := f.tenantCl.Create(ctx, torpor.CreateRequest{Template: "base"})
	f.tenantCl.WriteFile(ctx, sb.ID, "/r", strings.NewReader("0123456789"), nil)
	req, _ := http.NewRequest("GET", f.url+"/v1/sandboxes/"+sb.ID+"/files?path="+url.QueryEscape("/r"), nil)
	req.Header.Set("Authorization", "Bearer "+f.acmeKey)
	req.Header.Set("Range", "bytes=4-")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusPartialContent || string(b) != "456789" || resp.Header.Get("Content-Type") != "application/octet-stream" {
		t.Fatalf("%d %q %q", resp.StatusCode, b, resp.Header.Get("Content-Type"))
	}
	if lm := resp.Header.Get("Last-Modified"); lm == "" {
		t.Fatal("no Last-Modified")
	} else if _, err := time.Parse(http.TimeFormat, lm); err != nil {
		t.Fatal(err)
	}
}

// TestFilesShortBodyLeavesNothing: a body shorter than its Content-Length
// (the client died) is a 400, and no file, not even part of one, is left.
func TestFilesShortBodyLeavesNothing(t *testing.T) {
	f, _ := filesFixture(t)
	sb, _ := f.tenantCl.Create(ctx, torpor.CreateRequest{Template: "base"})
	u, _ := url.Parse(f.url)
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	fmt.Fprintf(conn, "PUT /v1/sandboxes/%s/files?path=/short HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Length: 100000\r\n\r\n%s",
		sb.ID, f.acmeKey, strings.Repeat("x", 50000))
	conn.(*net.TCPConn).CloseWrite()
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if _, err := f.tenantCl.StatFile(ctx, sb.ID, "/short"); !client.IsNotFound(err) {
		t.Fatalf("a short body left a file: %v", err)
	}
	if l, _ := f.tenantCl.ListFiles(ctx, sb.ID, "/", 1); len(l.Entries) != 0 {
		t.Fatalf("leftovers: %+v", l.Entries)
	}
}
