package envd_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/torpor-dev/torpor/e2b/envd"
	pb "github.com/torpor-dev/torpor/e2b/envd/proto/filesystem"
)

type entry struct {
	Name, Type, Path string
}

type envdError struct {
	Code    int
	Message string
}

// do sends a request to envd, with the access token when token is set.
func (e *env) do(t *testing.T, method, rawQuery, ctype string, body io.Reader, token bool) (*http.Response, []byte) {
	t.Helper()
	req, err := http.NewRequest(method, e.url+"/files?"+rawQuery, body)
	if err != nil {
		t.Fatal(err)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	if token {
		req.Header.Set(envd.HeaderAccessToken, e.token)
	}
	// No transparent gzip: the test sees the bytes envd sends.
	res, err := (&http.Client{Transport: &http.Transport{DisableCompression: true}}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res, b
}

// form builds a multipart body of "file" parts named by path, as the
// SDK's FormData does.
func form(t *testing.T, parts map[string][]byte, order ...string) (string, *bytes.Buffer) {
	var b bytes.Buffer
	mw := multipart.NewWriter(&b)
	for _, name := range order {
		h := make(map[string][]string)
		h["Content-Disposition"] = []string{fmt.Sprintf(`form-data; name="file"; filename=%q`, name)}
		h["Content-Type"] = []string{"application/octet-stream"}
		w, err := mw.CreatePart(h)
		if err != nil {
			t.Fatal(err)
		}
		w.Write(parts[name])
	}
	mw.Close()
	return mw.FormDataContentType(), &b
}

func wantError(t *testing.T, what string, res *http.Response, body []byte, status int) {
	t.Helper()
	var ee envdError
	if res.StatusCode != status || json.Unmarshal(body, &ee) != nil || ee.Code != status || ee.Message == "" {
		t.Fatalf("%s: %d %s, want %d and envd's error body", what, res.StatusCode, body, status)
	}
}

func testFiles(t *testing.T, e *env) {
	// Several files in one form; a relative name is under the user's home.
	bin := []byte{0, 1, 2, 0xff, 0xfe, '\n', '\r', 0}
	ctype, body := form(t, map[string][]byte{"/home/user/up/a.txt": []byte("hello"), "rel/b.bin": bin}, "/home/user/up/a.txt", "rel/b.bin")
	res, b := e.do(t, "POST", "", ctype, body, true)
	var got []entry
	if res.StatusCode != 200 || json.Unmarshal(b, &got) != nil {
		t.Fatalf("multipart upload: %d %s", res.StatusCode, b)
	}
	if len(got) != 2 || got[0] != (entry{"a.txt", "file", "/home/user/up/a.txt"}) || got[1] != (entry{"b.bin", "file", "/home/user/rel/b.bin"}) {
		t.Fatalf("answer %+v", got)
	}
	// What was made belongs to user, who can write to it.
	if out := e.sh(t, "user", "stat -c %U:%G /home/user/up /home/user/up/a.txt && echo more >> /home/user/up/a.txt && touch /home/user/up/new"); out != "user:user\nuser:user\n" {
		t.Fatalf("ownership %q", out)
	}
	res, b = e.do(t, "GET", "path=rel/b.bin", "", nil, true)
	if res.StatusCode != 200 || !bytes.Equal(b, bin) || res.Header.Get("Content-Disposition") != `inline; filename=b.bin` {
		t.Fatalf("binary round trip: %d %q %v", res.StatusCode, b, res.Header)
	}
	// One part to ?path=, as root.
	ctype, body = form(t, map[string][]byte{"ignored": []byte("r")}, "ignored")
	res, b = e.do(t, "POST", "path=/opt/deep/r.txt&username=root", ctype, body, true)
	if res.StatusCode != 200 || !strings.Contains(string(b), `"path":"/opt/deep/r.txt"`) {
		t.Fatalf("upload to ?path=: %d %s", res.StatusCode, b)
	}
	if out := e.sh(t, "", "stat -c %U /opt/deep/r.txt"); out != "root\n" {
		t.Fatalf("root's file: %q", out)
	}

	// An octet-stream body of 10 MiB, streamed both ways.
	big := make([]byte, 10<<20)
	rand.Read(big)
	res, b = e.do(t, "POST", "path=oct/big.bin", "application/octet-stream", bytes.NewReader(big), true)
	if res.StatusCode != 200 || string(b) != `[{"name":"big.bin","type":"file","path":"/home/user/oct/big.bin"}]`+"\n" {
		t.Fatalf("octet-stream upload: %d %s", res.StatusCode, b)
	}
	res, b = e.do(t, "GET", "path=/home/user/oct/big.bin", "", nil, true)
	if res.StatusCode != 200 || !bytes.Equal(b, big) || res.Header.Get("Content-Length") != strconv.Itoa(len(big)) {
		t.Fatalf("download of 10 MiB: %d, %d bytes, same %v", res.StatusCode, len(b), bytes.Equal(b, big))
	}
	req, _ := http.NewRequest("GET", e.url+"/files?path=oct/big.bin", nil)
	req.Header.Set(envd.HeaderAccessToken, e.token)
	req.Header.Set("Accept-Encoding", "gzip")
	gres, err := (&http.Client{Transport: &http.Transport{DisableCompression: true}}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	zr, err := gzip.NewReader(gres.Body)
	if err != nil || gres.Header.Get("Content-Encoding") != "gzip" {
		t.Fatalf("gzip download: %v %v", err, gres.Header)
	}
	if b, err := io.ReadAll(zr); err != nil || !bytes.Equal(b, big) {
		t.Fatalf("gzip download: %d bytes, %v", len(b), err)
	}
	gres.Body.Close()
	// fetch offers several encodings on every request: it gets the bytes
	// as they are (compressing costs more than it saves next to the proxy).
	req.Header.Set("Accept-Encoding", "gzip, deflate, br")
	gres, err = (&http.Client{Transport: &http.Transport{DisableCompression: true}}).Do(req)
	if err != nil || gres.Header.Get("Content-Encoding") != "" {
		t.Fatalf("download offered several encodings: %v %v", err, gres.Header)
	}
	gres.Body.Close()
	if sum := e.sh(t, "user", "sha256sum /home/user/oct/big.bin | cut -d' ' -f1"); sum != fmt.Sprintf("%x\n", sha256.Sum256(big)) {
		t.Fatalf("the sandbox sees other bytes")
	}

	// envd's status codes.
	res, b = e.do(t, "GET", "path=/nope", "", nil, true)
	wantError(t, "a missing file", res, b, 404)
	res, b = e.do(t, "GET", "path=/home/user", "", nil, true)
	wantError(t, "a directory", res, b, 400)
	res, b = e.do(t, "GET", "path=/etc/passwd&username=ghost", "", nil, true)
	wantError(t, "an unknown user", res, b, 401)
	res, b = e.do(t, "POST", "path=/home/user/up", "application/octet-stream", strings.NewReader("x"), true)
	wantError(t, "upload onto a directory", res, b, 400)
	res, b = e.do(t, "POST", "", "application/octet-stream", strings.NewReader("x"), true)
	wantError(t, "octet-stream without a path", res, b, 400)
	res, b = e.do(t, "POST", "path=/x", "text/plain", strings.NewReader("x"), true)
	wantError(t, "another content type", res, b, 400)
	res, b = e.do(t, "GET", "path=/proc/1/environ", "", nil, true)
	wantError(t, "a runtime mount", res, b, 400)
	ctype, body = form(t, map[string][]byte{"/home/user/twice": []byte("1")}, "/home/user/twice", "/home/user/twice")
	res, b = e.do(t, "POST", "", ctype, body, true)
	wantError(t, "one path twice", res, b, 400)
}

// sign computes a transfer signature as the SDK's getSignature does.
func sign(path, op, user, token string, exp int64) string {
	raw := path + ":" + op + ":" + user + ":" + token
	if exp != 0 {
		raw += ":" + strconv.FormatInt(exp, 10)
	}
	sum := sha256.Sum256([]byte(raw))
	return "v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
}

func testSigned(t *testing.T, e *env) {
	q := func(kv ...string) string {
		v := url.Values{}
		for i := 0; i < len(kv); i += 2 {
			v.Set(kv[i], kv[i+1])
		}
		return v.Encode()
	}
	// uploadUrl, then downloadUrl, with no access token.
	up := sign("/home/user/signed.txt", "write", "", e.token, 0)
	ctype, body := form(t, map[string][]byte{"f": []byte("signed")}, "f")
	if res, b := e.do(t, "POST", q("path", "/home/user/signed.txt", "signature", up), ctype, body, false); res.StatusCode != 200 {
		t.Fatalf("signed upload: %d %s", res.StatusCode, b)
	}
	exp := time.Now().Add(time.Minute).Unix()
	down := sign("/home/user/signed.txt", "read", "user", e.token, exp)
	if res, b := e.do(t, "GET", q("path", "/home/user/signed.txt", "username", "user", "signature", down, "signature_expiration", strconv.FormatInt(exp, 10)), "", nil, false); res.StatusCode != 200 || string(b) != "signed" {
		t.Fatalf("signed download: %d %s", res.StatusCode, b)
	}
	past := time.Now().Add(-time.Second).Unix()
	refused := map[string]string{
		"expired":        q("path", "/home/user/signed.txt", "signature", sign("/home/user/signed.txt", "read", "", e.token, past), "signature_expiration", strconv.FormatInt(past, 10)),
		"wrong token":    q("path", "/home/user/signed.txt", "signature", sign("/home/user/signed.txt", "read", "", "other", 0)),
		"other path":     q("path", "/etc/passwd", "signature", sign("/home/user/signed.txt", "read", "", e.token, 0)),
		"other user":     q("path", "/home/user/signed.txt", "username", "root", "signature", sign("/home/user/signed.txt", "read", "", e.token, 0)),
		"write for read": q("path", "/home/user/signed.txt", "signature", up),
		"expiry moved":   q("path", "/home/user/signed.txt", "signature", down, "signature_expiration", strconv.FormatInt(exp+60, 10)),
		"nothing":        q("path", "/home/user/signed.txt"),
	}
	for what, query := range refused {
		if res, _ := e.do(t, "GET", query, "", nil, false); res.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s: %d, want 401", what, res.StatusCode)
		}
	}
}

// testEscapes: paths and symlinks made inside the sandbox that point at
// the host stay inside the sandbox.
func testEscapes(t *testing.T, e *env, ctx context.Context) {
	hostDir := t.TempDir()
	secret := filepath.Join(hostDir, "secret")
	os.WriteFile(secret, []byte("HOST-SECRET"), 0o600)
	e.sh(t, "user", fmt.Sprintf("cd /home/user && ln -s %s abs && ln -s ../../../../../../..%s climb && ln -s %s hostdir", secret, secret, hostDir))
	for _, p := range []string{"/home/user/abs", "/home/user/climb", "/../../../.." + secret, "hostdir/secret"} {
		res, b := e.do(t, "GET", "path="+url.QueryEscape(p), "", nil, true)
		if strings.Contains(string(b), "HOST-SECRET") || res.StatusCode != 404 {
			t.Errorf("GET %s: %d %s", p, res.StatusCode, b)
		}
		if _, err := e.fs.Stat(ctx, asUser(&pb.StatRequest{Path: p}, "")); err == nil && !strings.HasPrefix(p, "/home") {
			t.Errorf("stat %s found something", p)
		}
	}
	// Writing through the link writes the sandbox's path of that name.
	e.sh(t, "user", "mkdir -p "+hostDir)
	if res, b := e.do(t, "POST", "path=/home/user/hostdir/pwn", "application/octet-stream", strings.NewReader("x"), true); res.StatusCode != 200 {
		t.Fatalf("write through a link: %d %s", res.StatusCode, b)
	}
	if _, err := os.Stat(filepath.Join(hostDir, "pwn")); err == nil {
		t.Fatal("a write reached the host")
	}
	if out := e.sh(t, "", "cat "+hostDir+"/pwn"); out != "x" {
		t.Fatalf("the write did not land inside the sandbox: %q", out)
	}
	if _, err := e.fs.Remove(ctx, asUser(&pb.RemoveRequest{Path: "/home/user/hostdir/secret"}, "")); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(secret); string(b) != "HOST-SECRET" {
		t.Fatal("the host file changed")
	}
	if _, err := e.fs.Move(ctx, asUser(&pb.MoveRequest{Source: "/home/user/abs", Destination: "/../../moved"}, "")); err != nil || code(err) != 0 {
		t.Fatalf("move: %v", err)
	}
	if _, err := os.Lstat("/moved"); err == nil {
		t.Fatal("a move reached the host's root")
	}
	_ = connect.CodeNotFound
}
