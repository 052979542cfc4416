package ui_test

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/torpor-dev/torpor/ui"
)

func hashOf(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:8])
}

const (
	testJS  = "console.log('dashboard');\n"
	testCSS = "body { color: black; }\n"
	testSVG = "<svg xmlns='http://www.w3.org/2000/svg'/>"
)

func testFS() fstest.MapFS {
	return fstest.MapFS{
		"index.html": {Data: []byte(`<!doctype html><html><head>
<link rel="stylesheet" href="./style.css">
<link rel="icon" href='img/logo.svg'>
<link rel="preconnect" href="https://example.com/style.css">
<script src="app.js" defer></script>
<script src="missing.js"></script>
</head><body><a href="#sandboxes">x</a></body></html>`)},
		"app.js":       {Data: []byte(testJS)},
		"style.css":    {Data: []byte(testCSS)},
		"img/logo.svg": {Data: []byte(testSVG)},
	}
}

func get(t *testing.T, h http.Handler, target string, hdr ...string) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest("GET", target, nil)
	for i := 0; i+1 < len(hdr); i += 2 {
		req.Header.Set(hdr[i], hdr[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec
}

// checkSecurityHeaders: every answer carries the strict policy.
func checkSecurityHeaders(t *testing.T, what string, rec *httptest.ResponseRecorder) {
	t.Helper()
	h := rec.Header()
	if got := h.Get("Content-Security-Policy"); got != ui.ContentSecurityPolicy {
		t.Errorf("%s: Content-Security-Policy %q", what, got)
	}
	if h.Get("X-Content-Type-Options") != "nosniff" || h.Get("Referrer-Policy") != "no-referrer" {
		t.Errorf("%s: headers %v", what, h)
	}
}

// TestHashedReferences: the page names each asset it references by a
// hash of the asset's content; other references stay as written.
func TestHashedReferences(t *testing.T) {
	h, err := ui.NewHandler(testFS())
	if err != nil {
		t.Fatal(err)
	}
	rec := get(t, h, "/ui/")
	if rec.Code != 200 || rec.Header().Get("Content-Type") != "text/html; charset=utf-8" {
		t.Fatalf("page: %d %v", rec.Code, rec.Header())
	}
	page := rec.Body.String()
	for _, want := range []string{
		`href="/ui/assets/style.` + hashOf(testCSS) + `.css"`,
		`href='/ui/assets/img/logo.` + hashOf(testSVG) + `.svg'`,
		`src="/ui/assets/app.` + hashOf(testJS) + `.js" defer`,
		// Not a file of the dashboard: left alone.
		`href="https://example.com/style.css"`,
		`src="missing.js"`,
		`href="#sandboxes"`,
	} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %s:\n%s", want, page)
		}
	}
	// Another content, another name.
	fsys := testFS()
	fsys["app.js"] = &fstest.MapFile{Data: []byte(testJS + "//v2\n")}
	h2, err := ui.NewHandler(fsys)
	if err != nil {
		t.Fatal(err)
	}
	if page2 := get(t, h2, "/ui/").Body.String(); !strings.Contains(page2, "app."+hashOf(testJS+"//v2\n")+".js") || strings.Contains(page2, hashOf(testJS)) {
		t.Errorf("a changed script kept its name:\n%s", page2)
	}
}

// TestCaching: hashed assets are immutable for a year; the page and the
// plain names are revalidated, with an ETag that answers 304.
func TestCaching(t *testing.T) {
	h, err := ui.NewHandler(testFS())
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		target, cache, ctype, body string
	}{
		{"/ui/", "no-cache", "text/html; charset=utf-8", ""},
		{"/ui/assets/app." + hashOf(testJS) + ".js", ui.ImmutableCache, "text/javascript; charset=utf-8", testJS},
		{"/ui/assets/style." + hashOf(testCSS) + ".css", ui.ImmutableCache, "text/css; charset=utf-8", testCSS},
		{"/ui/assets/img/logo." + hashOf(testSVG) + ".svg", ui.ImmutableCache, "image/svg+xml", testSVG},
		{"/ui/assets/app.js", "no-cache", "text/javascript; charset=utf-8", testJS},
	} {
		rec := get(t, h, c.target)
		checkSecurityHeaders(t, c.target, rec)
		if rec.Code != 200 || rec.Header().Get("Cache-Control") != c.cache || rec.Header().Get("Content-Type") != c.ctype {
			t.Errorf("%s: %d %v", c.target, rec.Code, rec.Header())
		}
		if c.body != "" && rec.Body.String() != c.body {
			t.Errorf("%s: body %q", c.target, rec.Body)
		}
		etag := rec.Header().Get("ETag")
		if etag == "" {
			t.Errorf("%s: no ETag", c.target)
			continue
		}
		if again := get(t, h, c.target, "If-None-Match", etag); again.Code != http.StatusNotModified {
			t.Errorf("%s with If-None-Match: %d", c.target, again.Code)
		}
	}
}

// TestOtherPaths: /ui redirects to /ui/; an unknown page or asset is a
// 404 in the API's error shape, with the same headers; the page is not an
// asset; only GET and HEAD are served.
func TestOtherPaths(t *testing.T) {
	h, err := ui.NewHandler(testFS())
	if err != nil {
		t.Fatal(err)
	}
	rec := get(t, h, "/ui")
	if rec.Code != http.StatusMovedPermanently || rec.Header().Get("Location") != "/ui/" {
		t.Errorf("/ui: %d %v", rec.Code, rec.Header())
	}
	checkSecurityHeaders(t, "/ui", rec)
	for _, target := range []string{"/ui/assets/nope.js", "/ui/assets/index.html", "/ui/assets/app.0000000000000000.js", "/ui/other", "/ui/assets/../index.html"} {
		rec := get(t, h, target)
		checkSecurityHeaders(t, target, rec)
		if rec.Code != 404 || !strings.Contains(rec.Body.String(), `"code":"not_found"`) {
			t.Errorf("%s: %d %s", target, rec.Code, rec.Body)
		}
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("POST", "/ui/", nil))
	if rec.Code != 400 || rec.Header().Get("Allow") != "GET, HEAD" {
		t.Errorf("POST /ui/: %d %v", rec.Code, rec.Header())
	}
	rec = httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("HEAD", "/ui/assets/app.js", nil))
	if rec.Code != 200 || rec.Body.Len() != 0 {
		t.Errorf("HEAD: %d %q", rec.Code, rec.Body)
	}
}

// TestEmbeddedDashboard: the embedded page loads, every asset it names is
// served, and it holds nothing the policy would block.
func TestEmbeddedDashboard(t *testing.T) {
	h := ui.Handler()
	rec := get(t, h, "/ui/")
	if rec.Code != 200 {
		t.Fatalf("/ui/: %d %s", rec.Code, rec.Body)
	}
	page := rec.Body.String()
	refs := regexp.MustCompile(`(?:src|href)=["'](/ui/assets/[^"']+)["']`).FindAllStringSubmatch(page, -1)
	if len(refs) == 0 {
		t.Fatalf("the page names no asset:\n%s", page)
	}
	for _, m := range refs {
		rec := get(t, h, m[1])
		if rec.Code != 200 || rec.Header().Get("Cache-Control") != ui.ImmutableCache {
			t.Errorf("%s: %d %v", m[1], rec.Code, rec.Header())
		}
	}
	for _, m := range regexp.MustCompile(`(?i)<script\b[^>]*>`).FindAllString(page, -1) {
		if !regexp.MustCompile(`\ssrc=`).MatchString(m) {
			t.Errorf("inline script %s: the policy blocks it", m)
		}
	}
	for _, bad := range []*regexp.Regexp{regexp.MustCompile(`(?i)\son[a-z]+\s*=`), regexp.MustCompile(`(?i)\sstyle\s*=|<style\b`), regexp.MustCompile(`(?i)javascript:`)} {
		if m := bad.FindString(page); m != "" {
			t.Errorf("the page holds %q, which the policy blocks", m)
		}
	}
}
