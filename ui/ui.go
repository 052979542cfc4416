// Package ui serves torpor's web dashboard: the static page, script and
// style sheet of ui/static, embedded in the binary. The page talks to the
// native API (/v1) only, authenticated by the session cookie the API's
// /ui/session route hands out (docs/dashboard.md), so the dashboard can do
// nothing a script with the same key could not.
//
// Assets are served under names that carry a hash of their content
// (/ui/assets/app.<hash>.js), cached for a year; the page itself
// (/ui/) is revalidated on every load, so a new binary's assets are picked
// up at once. Every answer carries a strict Content-Security-Policy: no
// inline script or style, nothing from another origin, no framing.
package ui

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"regexp"
	"strings"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/wire"
)

//go:embed static
var static embed.FS

// Headers every answer of the dashboard carries.
const (
	// ContentSecurityPolicy lets the page load its own script, style
	// sheet and images and talk to its own origin, and nothing else: no
	// inline script or style, no eval, no framing by another page, no
	// <base> that moves relative URLs, no form posted elsewhere.
	ContentSecurityPolicy = "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'"
	// ImmutableCache is the Cache-Control of an asset under its hashed
	// name: its content never changes under that name.
	ImmutableCache = "public, max-age=31536000, immutable"
	// Revalidate is the Cache-Control of the page and of assets under
	// their plain names: a browser may keep them but asks every time
	// (a 304 when the ETag still matches).
	Revalidate = "no-cache"
)

// Prefix is where the dashboard lives on the API listener, and
// AssetPrefix where its assets do.
const (
	Prefix      = "/ui/"
	AssetPrefix = Prefix + "assets/"
)

// asset is one file served by the handler.
type asset struct {
	data        []byte
	contentType string
	etag        string
	cache       string
}

// handler serves the page and its assets from memory.
type handler struct {
	index  asset
	assets map[string]asset // by the name after AssetPrefix
}

// Handler serves the embedded dashboard (ui/static). It panics if the
// embedded files cannot be read, which only a broken build can cause.
func Handler() http.Handler {
	sub, err := fs.Sub(static, "static")
	if err != nil {
		panic(err)
	}
	h, err := NewHandler(sub)
	if err != nil {
		panic(fmt.Sprintf("ui: the embedded dashboard: %v", err))
	}
	return h
}

// NewHandler serves the dashboard in fsys: index.html at /ui/, every other
// file under /ui/assets/, both under its plain name and under its hashed
// one (name.<hash>.ext). References in index.html to those files (src and
// href attributes naming them relatively, such as src="app.js") are
// rewritten to the hashed names, so that a browser caches each version of
// an asset for good and never mixes one build's page with another's
// script.
func NewHandler(fsys fs.FS) (http.Handler, error) {
	h := &handler{assets: map[string]asset{}}
	hashed := map[string]string{} // plain name -> hashed name
	err := fs.WalkDir(fsys, ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || p == "index.html" {
			return err
		}
		data, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(data)
		hash := hex.EncodeToString(sum[:8])
		ext := path.Ext(p)
		name := strings.TrimSuffix(p, ext) + "." + hash + ext
		hashed[p] = name
		a := asset{data: data, contentType: contentType(p, data), etag: `"` + hash + `"`}
		a.cache = Revalidate
		h.assets[p] = a
		a.cache = ImmutableCache
		h.assets[name] = a
		return nil
	})
	if err != nil {
		return nil, err
	}
	page, err := fs.ReadFile(fsys, "index.html")
	if err != nil {
		return nil, err
	}
	page = rewriteRefs(page, hashed)
	sum := sha256.Sum256(page)
	h.index = asset{data: page, contentType: "text/html; charset=utf-8", etag: `"` + hex.EncodeToString(sum[:8]) + `"`, cache: Revalidate}
	return h, nil
}

// refRe finds the src and href attributes of index.html, with the value
// quoted either way.
var refRe = regexp.MustCompile(`\b(src|href)=("[^"]*"|'[^']*')`)

// rewriteRefs replaces each attribute value that names a file of hashed
// relatively ("app.js", "./app.js") with that file's hashed URL; other
// values (absolute URLs, fragments, unknown names) stay as they are.
func rewriteRefs(page []byte, hashed map[string]string) []byte {
	return refRe.ReplaceAllFunc(page, func(m []byte) []byte {
		sub := refRe.FindSubmatch(m)
		quote := sub[2][:1]
		val := string(sub[2][1 : len(sub[2])-1])
		name, ok := hashed[strings.TrimPrefix(val, "./")]
		if !ok {
			return m
		}
		return []byte(string(sub[1]) + "=" + string(quote) + AssetPrefix + name + string(quote))
	})
}

// contentType is a file's type by its extension, else by its content.
func contentType(name string, data []byte) string {
	if t := mime.TypeByExtension(path.Ext(name)); t != "" {
		return t
	}
	return http.DetectContentType(data)
}

// SecurityHeaders sets the headers every dashboard answer carries.
func SecurityHeaders(h http.Header) {
	h.Set("Content-Security-Policy", ContentSecurityPolicy)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
}

// ServeHTTP serves GET /ui (a redirect), /ui/ and /ui/assets/NAME.
func (h *handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	SecurityHeaders(w.Header())
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		writeError(w, torpor.Errorf(torpor.EInvalid, "the dashboard's files are read with GET"))
		return
	}
	switch p := r.URL.Path; {
	case p == strings.TrimSuffix(Prefix, "/"):
		http.Redirect(w, r, Prefix, http.StatusMovedPermanently)
	case p == Prefix:
		serve(w, r, "index.html", h.index)
	case strings.HasPrefix(p, AssetPrefix):
		a, ok := h.assets[strings.TrimPrefix(p, AssetPrefix)]
		if !ok {
			writeError(w, torpor.Errorf(torpor.ENotFound, "no dashboard asset %s", p))
			return
		}
		serve(w, r, p, a)
	default:
		writeError(w, torpor.Errorf(torpor.ENotFound, "no dashboard page %s (the dashboard is at %s)", p, Prefix))
	}
}

// serve writes a with its type, caching and ETag; http.ServeContent
// answers If-None-Match with 304 and HEAD without a body.
func serve(w http.ResponseWriter, r *http.Request, name string, a asset) {
	h := w.Header()
	h.Set("Content-Type", a.contentType)
	h.Set("Cache-Control", a.cache)
	h.Set("ETag", a.etag)
	http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(a.data))
}

// writeError writes e in the API's error shape.
func writeError(w http.ResponseWriter, e *torpor.Error) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(wire.Status(e.Code))
	_ = json.NewEncoder(w).Encode(wire.ErrorBody{Error: wire.ErrorDetail{Code: e.Code, Message: e.Message}})
}
