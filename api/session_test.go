package api_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api"
	"github.com/torpor-dev/torpor/api/ratelimit"
	"github.com/torpor-dev/torpor/api/wire"
	"github.com/torpor-dev/torpor/clocktest"
)

// uiSession is a dashboard session a test signed in.
type uiSession struct {
	cookie, csrf string
	desc         wire.Session
}

// sendOpt changes a request before it is sent.
type sendOpt func(*http.Request)

func withCookie(id string) sendOpt {
	return func(r *http.Request) { r.AddCookie(&http.Cookie{Name: api.SessionCookie, Value: id}) }
}

func withHeader(k, v string) sendOpt { return func(r *http.Request) { r.Header.Set(k, v) } }

func withSession(s uiSession) sendOpt {
	return func(r *http.Request) {
		withCookie(s.cookie)(r)
		r.Header.Set(api.CSRFHeader, s.csrf)
	}
}

// send serves one request on the listener and checks that no key of the
// listener appears in the answer, body or headers.
func (l *listener) send(t testing.TB, method, target, ctype, body string, opts ...sendOpt) *httptest.ResponseRecorder {
	t.Helper()
	req := httptest.NewRequest(method, target, strings.NewReader(body))
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	for _, o := range opts {
		o(req)
	}
	rec := httptest.NewRecorder()
	l.h.ServeHTTP(rec, req)
	raw := rec.Body.String() + fmt.Sprint(rec.Header())
	for _, k := range []string{l.keys.a, l.keys.b, l.keys.admin} {
		if strings.Contains(raw, k) || strings.Contains(raw, strings.TrimPrefix(k, torpor.KeyPrefix)) {
			t.Errorf("%s %s: the answer holds a key: %d %s", method, target, rec.Code, raw)
		}
	}
	return rec
}

// signIn opens a session with key on the listener and keeps it for do.
func (l *listener) signIn(t testing.TB, key string) uiSession {
	t.Helper()
	rec := l.send(t, "POST", "/ui/session", jsonType, `{"key":"`+key+`"}`)
	if rec.Code != 200 {
		t.Fatalf("sign-in: %d %s", rec.Code, rec.Body)
	}
	var s uiSession
	if err := json.Unmarshal(rec.Body.Bytes(), &s.desc); err != nil {
		t.Fatal(err)
	}
	s.csrf = s.desc.CSRFToken
	for _, c := range rec.Result().Cookies() {
		if c.Name == api.SessionCookie {
			s.cookie = c.Value
		}
	}
	if s.cookie == "" || s.csrf == "" {
		t.Fatalf("sign-in: no cookie or token: %v %s", rec.Header(), rec.Body)
	}
	if l.sessions == nil {
		l.sessions = map[string]uiSession{}
	}
	l.sessions[key] = s
	return s
}

func newSessionListener(t *testing.T) (*listener, objectsA) {
	t.Helper()
	keys := newPrincipals()
	t.Cleanup(keys.remove)
	l := newListener(t, t.TempDir(), keys)
	t.Cleanup(l.close)
	return l, seedA(t, l)
}

func errorOf(t testing.TB, rec *httptest.ResponseRecorder) wire.ErrorDetail {
	t.Helper()
	var eb wire.ErrorBody
	if err := json.Unmarshal(rec.Body.Bytes(), &eb); err != nil {
		t.Fatalf("not the error shape: %d %s", rec.Code, rec.Body)
	}
	return eb.Error
}

// TestSessionSignIn: a key in the JSON body opens a session: the answer
// names the tenant, the CSRF token and the expiry, and sets an HttpOnly,
// SameSite=Strict cookie on / for 12 hours (Secure over TLS) whose value
// is random and is not the key. The answers hold no key.
func TestSessionSignIn(t *testing.T) {
	l, _ := newSessionListener(t)
	rec := l.send(t, "POST", "/ui/session", jsonType, `{"key":"`+l.keys.a+`"}`)
	if rec.Code != 200 {
		t.Fatalf("%d %s", rec.Code, rec.Body)
	}
	var desc wire.Session
	if err := json.Unmarshal(rec.Body.Bytes(), &desc); err != nil {
		t.Fatal(err)
	}
	if desc.Tenant != tenantA || desc.Admin || len(desc.CSRFToken) != 43 || !desc.ExpiresAt.Equal(listenerEpoch.Add(12*time.Hour)) {
		t.Errorf("session: %+v", desc)
	}
	if !strings.Contains(rec.Body.String(), `"expires_at":"2026-03-04T17:06:07Z"`) {
		t.Errorf("expires_at is not RFC 3339 UTC: %s", rec.Body)
	}
	set := rec.Header().Values("Set-Cookie")
	if len(set) != 1 {
		t.Fatalf("Set-Cookie: %q", set)
	}
	attrs := strings.Split(set[0], "; ")
	name, value, _ := strings.Cut(attrs[0], "=")
	if name != api.SessionCookie || len(value) != 43 || value == desc.CSRFToken {
		t.Errorf("cookie %q", attrs[0])
	}
	for _, want := range []string{"Path=/", "Max-Age=43200", "HttpOnly", "SameSite=Strict"} {
		if !strings.Contains(set[0], "; "+want) {
			t.Errorf("the cookie lacks %s: %s", want, set[0])
		}
	}
	if strings.Contains(set[0], "Secure") {
		t.Errorf("a cookie over plain HTTP is Secure (the browser would drop it): %s", set[0])
	}
	if cc := rec.Header().Get("Cache-Control"); cc != "no-store" || rec.Header().Get("X-Content-Type-Options") != "nosniff" {
		t.Errorf("headers %v", rec.Header())
	}
	// Another sign-in, another id and token.
	again := l.signIn(t, l.keys.a)
	if again.cookie == value || again.csrf == desc.CSRFToken {
		t.Errorf("two sessions share an id or a token")
	}
	// Over TLS, or behind a proxy that terminated it, the cookie is
	// Secure.
	secure := func(opts ...sendOpt) string {
		req := httptest.NewRequest("POST", "https://api.test/ui/session", strings.NewReader(`{"key":"`+l.keys.a+`"}`))
		req.Header.Set("Content-Type", jsonType)
		for _, o := range opts {
			o(req)
		}
		rec := httptest.NewRecorder()
		l.h.ServeHTTP(rec, req)
		return rec.Header().Get("Set-Cookie")
	}
	if c := secure(); !strings.Contains(c, "; Secure") {
		t.Errorf("over TLS: %s", c)
	}
	if c := l.send(t, "POST", "/ui/session", jsonType, `{"key":"`+l.keys.a+`"}`, withHeader("X-Forwarded-Proto", "https")).Header().Get("Set-Cookie"); !strings.Contains(c, "; Secure") {
		t.Errorf("behind a TLS proxy: %s", c)
	}
	// The admin's key opens an admin session.
	if s := l.signIn(t, l.keys.admin); !s.desc.Admin || s.desc.Tenant != "default" {
		t.Errorf("admin session: %+v", s.desc)
	}
}

// TestSessionSignInRefusals: an unknown key is 401; a key in the URL, an
// empty one, a body that is not JSON and a sign-in another site's page
// made are refused; none sets a cookie.
func TestSessionSignInRefusals(t *testing.T) {
	l, _ := newSessionListener(t)
	for _, c := range []struct {
		name, target, ctype, body string
		opts                      []sendOpt
		status                    int
		code                      torpor.ErrorCode
		param                     string
	}{
		{"unknown key", "/ui/session", jsonType, `{"key":"tpk_not-a-key"}`, nil, 401, torpor.EUnauthenticated, ""},
		{"key in the URL", "/ui/session?key=" + l.keys.a, jsonType, `{"key":"` + l.keys.a + `"}`, nil, 400, torpor.EInvalid, "key"},
		{"empty key", "/ui/session", jsonType, `{"key":""}`, nil, 400, torpor.EInvalid, "key"},
		{"no body", "/ui/session", jsonType, ``, nil, 400, torpor.EInvalid, "body"},
		{"unknown field", "/ui/session", jsonType, `{"key":"` + l.keys.a + `","tenant":"bravo"}`, nil, 400, torpor.EInvalid, ""},
		{"a form", "/ui/session", "application/x-www-form-urlencoded", `key=` + l.keys.a, nil, 400, torpor.EInvalid, "Content-Type"},
		{"text/plain", "/ui/session", "text/plain", `{"key":"` + l.keys.a + `"}`, nil, 400, torpor.EInvalid, "Content-Type"},
		{"cross-site", "/ui/session", jsonType, `{"key":"` + l.keys.a + `"}`, []sendOpt{withHeader("Sec-Fetch-Site", "cross-site")}, 403, torpor.EForbidden, ""},
		{"same-site", "/ui/session", jsonType, `{"key":"` + l.keys.a + `"}`, []sendOpt{withHeader("Sec-Fetch-Site", "same-site")}, 403, torpor.EForbidden, ""},
	} {
		rec := l.send(t, "POST", c.target, c.ctype, c.body, c.opts...)
		e := errorOf(t, rec)
		if rec.Code != c.status || e.Code != c.code || (c.param != "" && e.Param != c.param) {
			t.Errorf("%s: %d %s", c.name, rec.Code, rec.Body)
		}
		if sc := rec.Header().Get("Set-Cookie"); sc != "" {
			t.Errorf("%s: set a cookie %s", c.name, sc)
		}
	}
	// From the dashboard's own page, the browser says same-origin.
	if rec := l.send(t, "POST", "/ui/session", jsonType, `{"key":"`+l.keys.a+`"}`, withHeader("Sec-Fetch-Site", "same-origin")); rec.Code != 200 {
		t.Errorf("same-origin: %d %s", rec.Code, rec.Body)
	}
}

// TestSessionCookieAuthenticates: the cookie reads the API as its key
// does; every method that may change something needs the session's CSRF
// token in X-CSRF-Token (403 forbidden without it or with another), and
// a refused request changes nothing; a bearer key needs no token.
func TestSessionCookieAuthenticates(t *testing.T) {
	l, a := newSessionListener(t)
	s := l.signIn(t, l.keys.a)
	rec := l.send(t, "GET", "/v1/sandboxes", "", "", withCookie(s.cookie))
	if rec.Code != 200 || !strings.Contains(rec.Body.String(), a.running.ID) {
		t.Fatalf("list by cookie: %d %s", rec.Code, rec.Body)
	}
	if rec := l.send(t, "HEAD", "/v1/sandboxes/"+a.running.ID, "", "", withCookie(s.cookie)); rec.Code != 200 {
		t.Errorf("HEAD by cookie: %d", rec.Code)
	}
	otherToken := l.signIn(t, l.keys.a).csrf
	changes := []struct{ method, target, ctype, body string }{
		{"POST", "/v1/sandboxes", jsonType, `{"template":"base"}`},
		{"PATCH", "/v1/sandboxes/" + a.running.ID, jsonType, `{"metadata":{"k":"changed"}}`},
		{"PUT", "/v1/sandboxes/" + a.running.ID + "/files?path=/root/csrf.txt", "application/octet-stream", "written"},
		{"POST", "/v1/sandboxes/" + a.running.ID + "/pause", "", ""},
		{"DELETE", "/v1/sandboxes/" + a.running.ID, "", ""},
	}
	before := stateOf(t, l, []string{a.running.ID, a.paused.ID, a.gone.ID})
	for _, c := range changes {
		for _, csrf := range []string{"", "wrong", otherToken, s.csrf + "x", strings.ToUpper(s.csrf)} {
			opts := []sendOpt{withCookie(s.cookie)}
			if csrf != "" {
				opts = append(opts, withHeader(api.CSRFHeader, csrf))
			}
			rec := l.send(t, c.method, c.target, c.ctype, c.body, opts...)
			e := errorOf(t, rec)
			if rec.Code != 403 || e.Code != torpor.EForbidden || e.Reason != "csrf_token" || !strings.Contains(e.Message, "CSRF token") {
				t.Errorf("%s %s with CSRF %q: %d %s", c.method, c.target, csrf, rec.Code, rec.Body)
			}
		}
	}
	if after := stateOf(t, l, []string{a.running.ID, a.paused.ID, a.gone.ID}); strings.Join(after, "\n") != strings.Join(before, "\n") {
		t.Errorf("a refused request changed something:\n%s", lineDiff(before, after))
	}
	// With the token each goes through.
	for _, c := range changes {
		if rec := l.send(t, c.method, c.target, c.ctype, c.body, withSession(s)); rec.Code < 200 || rec.Code > 299 {
			t.Errorf("%s %s with the token: %d %s", c.method, c.target, rec.Code, rec.Body)
		}
	}
	// A bearer key needs no token, and wins over a cookie.
	if rec := l.send(t, "POST", "/v1/sandboxes", jsonType, `{"template":"base"}`, withHeader("Authorization", "Bearer "+l.keys.a)); rec.Code != 201 {
		t.Errorf("bearer create: %d %s", rec.Code, rec.Body)
	}
	if rec := l.send(t, "POST", "/v1/sandboxes", jsonType, `{"template":"base"}`, withHeader("Authorization", "Bearer "+l.keys.a), withCookie("bogus")); rec.Code != 201 {
		t.Errorf("bearer create beside a stale cookie: %d %s", rec.Code, rec.Body)
	}
	if rec := l.send(t, "GET", "/v1/sandboxes", "", "", withHeader("Authorization", "Bearer tpk_not-a-key"), withCookie(s.cookie)); rec.Code != 401 {
		t.Errorf("a bad bearer key beside a good cookie: %d %s", rec.Code, rec.Body)
	}
	// A cookie request another site's page made is refused even for a
	// read.
	for _, site := range []string{"cross-site", "same-site"} {
		if rec := l.send(t, "GET", "/v1/sandboxes", "", "", withCookie(s.cookie), withHeader("Sec-Fetch-Site", site)); rec.Code != 403 {
			t.Errorf("%s read: %d %s", site, rec.Code, rec.Body)
		}
	}
	if rec := l.send(t, "GET", "/v1/sandboxes", "", "", withCookie(s.cookie), withHeader("Sec-Fetch-Site", "same-origin")); rec.Code != 200 {
		t.Errorf("same-origin read: %d %s", rec.Code, rec.Body)
	}
	// An unknown or malformed cookie is 401.
	for _, c := range []string{"", "x", strings.Repeat("A", 43), s.csrf} {
		rec := l.send(t, "GET", "/v1/sandboxes", "", "", withCookie(c))
		if rec.Code != 401 || errorOf(t, rec).Code != torpor.EUnauthenticated {
			t.Errorf("cookie %q: %d %s", c, rec.Code, rec.Body)
		}
	}
}

// TestSessionRights: a tenant's session has its key's rights and sees
// nothing of another tenant; an admin's session has the admin's.
func TestSessionRights(t *testing.T) {
	l, a := newSessionListener(t)
	b := l.signIn(t, l.keys.b)
	rec := l.send(t, "GET", "/v1/sandboxes?all=true", "", "", withCookie(b.cookie))
	if rec.Code != 200 || strings.Contains(rec.Body.String(), tenantA) || strings.Contains(rec.Body.String(), a.running.ID) {
		t.Errorf("B's list: %d %s", rec.Code, rec.Body)
	}
	for _, target := range []string{"/v1/sandboxes/" + a.running.ID, "/v1/sandboxes/" + a.running.ID + "/files?path=" + fileAt} {
		if rec := l.send(t, "GET", target, "", "", withCookie(b.cookie)); rec.Code != 404 || strings.Contains(rec.Body.String(), fileA) {
			t.Errorf("B reads %s: %d %s", target, rec.Code, rec.Body)
		}
	}
	if rec := l.send(t, "GET", "/v1/tenants", "", "", withCookie(b.cookie)); rec.Code != 403 {
		t.Errorf("B lists tenants: %d %s", rec.Code, rec.Body)
	}
	if rec := l.send(t, "POST", "/v1/tenants", jsonType, `{"name":"charlie"}`, withSession(b)); rec.Code != 403 {
		t.Errorf("B creates a tenant: %d %s", rec.Code, rec.Body)
	}
	admin := l.signIn(t, l.keys.admin)
	if rec := l.send(t, "GET", "/v1/tenants", "", "", withCookie(admin.cookie)); rec.Code != 200 || !strings.Contains(rec.Body.String(), tenantA) {
		t.Errorf("the admin lists tenants: %d %s", rec.Code, rec.Body)
	}
	if rec := l.send(t, "POST", "/v1/tenants", jsonType, `{"name":"charlie"}`, withSession(admin)); rec.Code != 201 {
		t.Errorf("the admin creates a tenant: %d %s", rec.Code, rec.Body)
	}
	// A sandbox the session creates is its tenant's, made by its key (the
	// key id the GPU rules and the records read).
	rec = l.send(t, "POST", "/v1/sandboxes", jsonType, `{"template":"base"}`, withSession(b))
	var sb torpor.Sandbox
	if err := json.Unmarshal(rec.Body.Bytes(), &sb); err != nil || rec.Code != 201 {
		t.Fatalf("B creates: %d %s", rec.Code, rec.Body)
	}
	var bKey string
	for _, k := range l.keys.records {
		if k.Tenant == tenantB {
			bKey = k.ID
		}
	}
	if got, err := l.st.GetSandbox(context.Background(), sb.ID); err != nil || got.Tenant != tenantB || got.KeyID != bKey || bKey == "" {
		t.Errorf("B's sandbox: %+v %v (B's key %s)", got, err, bKey)
	}
}

// TestSessionLifetime: GET /ui/session describes the live session; it
// lasts 12 hours from the sign-in, however used, then is 401 everywhere.
func TestSessionLifetime(t *testing.T) {
	l, _ := newSessionListener(t)
	s := l.signIn(t, l.keys.a)
	rec := l.send(t, "GET", "/ui/session", "", "", withCookie(s.cookie))
	var desc wire.Session
	if err := json.Unmarshal(rec.Body.Bytes(), &desc); err != nil || rec.Code != 200 || desc != s.desc {
		t.Fatalf("describe: %d %s", rec.Code, rec.Body)
	}
	if rec.Header().Get("Cache-Control") != "no-store" {
		t.Errorf("describe headers: %v", rec.Header())
	}
	l.clock.Advance(12*time.Hour - time.Second)
	if rec := l.send(t, "GET", "/v1/sandboxes", "", "", withCookie(s.cookie)); rec.Code != 200 {
		t.Fatalf("a second before the end: %d %s", rec.Code, rec.Body)
	}
	l.clock.Advance(time.Second)
	for _, target := range []string{"/v1/sandboxes", "/ui/session"} {
		rec := l.send(t, "GET", target, "", "", withCookie(s.cookie))
		if rec.Code != 401 || !strings.Contains(errorOf(t, rec).Message, "sign in again") {
			t.Errorf("%s after 12 hours: %d %s", target, rec.Code, rec.Body)
		}
	}
	if rec := l.send(t, "GET", "/ui/session", "", ""); rec.Code != 401 {
		t.Errorf("describe without a cookie: %d %s", rec.Code, rec.Body)
	}
}

// TestSessionSignOut: DELETE /ui/session needs the token; it ends the
// session (its cookie is then refused everywhere) and clears the cookie;
// another session of the same key lives on.
func TestSessionSignOut(t *testing.T) {
	l, _ := newSessionListener(t)
	s := l.signIn(t, l.keys.a)
	other := l.signIn(t, l.keys.a)
	for _, opts := range [][]sendOpt{{withCookie(s.cookie)}, {withCookie(s.cookie), withHeader(api.CSRFHeader, other.csrf)}} {
		if rec := l.send(t, "DELETE", "/ui/session", "", "", opts...); rec.Code != 403 || errorOf(t, rec).Reason != "csrf_token" {
			t.Errorf("sign-out without the token: %d %s", rec.Code, rec.Body)
		}
	}
	if rec := l.send(t, "GET", "/ui/session", "", "", withCookie(s.cookie)); rec.Code != 200 {
		t.Fatalf("a refused sign-out ended the session: %d", rec.Code)
	}
	rec := l.send(t, "DELETE", "/ui/session", "", "", withSession(s))
	if rec.Code != 204 {
		t.Fatalf("sign-out: %d %s", rec.Code, rec.Body)
	}
	if c := rec.Header().Get("Set-Cookie"); !strings.HasPrefix(c, api.SessionCookie+"=;") || !strings.Contains(c, "Max-Age=0") || !strings.Contains(c, "HttpOnly") {
		t.Errorf("the cleared cookie: %s", c)
	}
	for _, c := range []struct{ method, target string }{{"GET", "/v1/sandboxes"}, {"GET", "/ui/session"}, {"DELETE", "/ui/session"}} {
		if rec := l.send(t, c.method, c.target, "", "", withSession(s)); rec.Code != 401 {
			t.Errorf("%s %s after sign-out: %d %s", c.method, c.target, rec.Code, rec.Body)
		}
	}
	if rec := l.send(t, "GET", "/v1/sandboxes", "", "", withCookie(other.cookie)); rec.Code != 200 {
		t.Errorf("the other session: %d %s", rec.Code, rec.Body)
	}
	// A sign-in from a browser that holds a session ends that one.
	rec = l.send(t, "POST", "/ui/session", jsonType, `{"key":"`+l.keys.a+`"}`, withCookie(other.cookie))
	if rec.Code != 200 {
		t.Fatal(rec.Code)
	}
	if rec := l.send(t, "GET", "/ui/session", "", "", withCookie(other.cookie)); rec.Code != 401 {
		t.Errorf("the replaced session: %d", rec.Code)
	}
}

// TestSessionsPerKeyBounded: a key holds at most MaxSessionsPerKey
// sessions; the next sign-in ends its oldest. Another key's are left.
func TestSessionsPerKeyBounded(t *testing.T) {
	l, _ := newSessionListener(t)
	b := l.signIn(t, l.keys.b)
	var first uiSession
	for i := range api.MaxSessionsPerKey + 1 {
		s := l.signIn(t, l.keys.a)
		if i == 0 {
			first = s
		}
		l.clock.Advance(time.Second)
	}
	if rec := l.send(t, "GET", "/ui/session", "", "", withCookie(first.cookie)); rec.Code != 401 {
		t.Errorf("the oldest of %d sessions: %d", api.MaxSessionsPerKey+1, rec.Code)
	}
	for _, s := range []uiSession{l.sessions[l.keys.a], b} {
		if rec := l.send(t, "GET", "/ui/session", "", "", withCookie(s.cookie)); rec.Code != 200 {
			t.Errorf("a live session: %d", rec.Code)
		}
	}
}

// TestSessionEventStream: the event streams, which a browser's
// EventSource opens without headers, work with the cookie, and end when
// the session does: at sign-out, and when it expires.
func TestSessionEventStream(t *testing.T) {
	l, a := newSessionListener(t)
	hs := httptest.NewServer(l.h)
	defer hs.Close()
	for _, c := range []struct {
		path string
		end  func(s uiSession)
		how  string
	}{
		{"/v1/events?since=0", func(s uiSession) {
			if rec := l.send(t, "DELETE", "/ui/session", "", "", withSession(s)); rec.Code != 204 {
				t.Errorf("sign-out: %d", rec.Code)
			}
		}, "sign-out"},
		{"/v1/sandboxes/" + a.running.ID + "/events?since=0", func(uiSession) { l.clock.Advance(api.SessionLifetime) }, "expiry"},
	} {
		s := l.signIn(t, l.keys.a)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		req, _ := http.NewRequestWithContext(ctx, "GET", hs.URL+c.path, nil)
		req.Header.Set("Accept", "text/event-stream")
		req.AddCookie(&http.Cookie{Name: api.SessionCookie, Value: s.cookie})
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			b, _ := io.ReadAll(resp.Body)
			t.Errorf("%s: %d %s", c.path, resp.StatusCode, b)
		} else {
			sc := bufio.NewScanner(resp.Body)
			found := false
			for sc.Scan() {
				if strings.Contains(sc.Text(), a.running.ID) {
					found = true
					break
				}
			}
			if !found {
				t.Errorf("%s: no event of A's sandbox", c.path)
			}
			c.end(s)
			for sc.Scan() {
			}
			if ctx.Err() != nil {
				t.Errorf("%s: the stream went on after the session's %s", c.path, c.how)
			}
		}
		cancel()
		resp.Body.Close()
	}
}

// TestSessionSharesTheKeysRateLimit: a request by cookie takes its token
// from the bucket of the key that opened the session, the sign-in too.
func TestSessionSharesTheKeysRateLimit(t *testing.T) {
	clock := clocktest.New(time.Date(2026, 5, 6, 7, 8, 9, 0, time.UTC))
	lim := ratelimit.New(ratelimit.Config{PerSecond: 1, Burst: 3, Clock: clock})
	f := newFixture(t, func(c *api.Config) { c.RateLimit = lim; c.UI = http.NotFoundHandler() })
	do := func(method, path, body string, cookie string) *http.Response {
		req, _ := http.NewRequest(method, f.url+path, strings.NewReader(body))
		if body != "" {
			req.Header.Set("Content-Type", jsonType)
		}
		if cookie != "" {
			req.AddCookie(&http.Cookie{Name: api.SessionCookie, Value: cookie})
		} else {
			req.Header.Set("Authorization", "Bearer "+f.acmeKey)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		return resp
	}
	resp := do("POST", "/ui/session", `{"key":"`+f.acmeKey+`"}`, "none")
	var cookie string
	for _, c := range resp.Cookies() {
		cookie = c.Value
	}
	if resp.StatusCode != 200 || cookie == "" {
		t.Fatalf("sign-in: %d", resp.StatusCode)
	}
	if r := do("GET", "/v1/sandboxes", "", cookie); r.StatusCode != 200 {
		t.Fatalf("by cookie: %d", r.StatusCode)
	}
	if r := do("GET", "/v1/sandboxes", "", ""); r.StatusCode != 200 {
		t.Fatalf("by key: %d", r.StatusCode)
	}
	if r := do("GET", "/v1/sandboxes", "", cookie); r.StatusCode != http.StatusTooManyRequests {
		t.Errorf("by cookie past the key's burst: %d", r.StatusCode)
	}
	if r := do("GET", "/ui/session", "", cookie); r.StatusCode != http.StatusTooManyRequests {
		t.Errorf("describe past the key's burst: %d", r.StatusCode)
	}
}

// TestSessionsOffWithoutUI: without a dashboard there is no session
// route, and a cookie authenticates nothing.
func TestSessionsOffWithoutUI(t *testing.T) {
	f := newFixture(t)
	if code, _ := f.raw(t, "POST", "/ui/session", "", jsonType, `{"key":"`+f.acmeKey+`"}`); code != 404 {
		t.Errorf("sign-in without a dashboard: %d", code)
	}
	if code, _ := f.raw(t, "GET", "/ui/", "", "", ""); code != 404 {
		t.Errorf("the page without a dashboard: %d", code)
	}
	req, _ := http.NewRequest("GET", f.url+"/v1/sandboxes", nil)
	req.AddCookie(&http.Cookie{Name: api.SessionCookie, Value: strings.Repeat("A", 43)})
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 401 {
		t.Errorf("a cookie without a dashboard: %d", resp.StatusCode)
	}
}

// TestDashboardOnTheListener: the listener serves the embedded page at
// /ui/ with its policy, redirects /ui, and a session route beats the
// page's subtree.
func TestDashboardOnTheListener(t *testing.T) {
	l, _ := newSessionListener(t)
	rec := l.send(t, "GET", "/ui/", "", "")
	if rec.Code != 200 || !strings.Contains(rec.Header().Get("Content-Security-Policy"), "script-src 'self'") || !strings.Contains(rec.Body.String(), "/ui/assets/") {
		t.Errorf("/ui/: %d %v", rec.Code, rec.Header())
	}
	if rec := l.send(t, "GET", "/ui", "", ""); rec.Code != 301 || rec.Header().Get("Location") != "/ui/" {
		t.Errorf("/ui: %d %v", rec.Code, rec.Header())
	}
	if rec := l.send(t, "GET", "/ui/session", "", ""); rec.Code != 401 || errorOf(t, rec).Code != torpor.EUnauthenticated {
		t.Errorf("/ui/session: %d %s", rec.Code, rec.Body)
	}
	if rec := l.send(t, "PUT", "/ui/session", "", ""); rec.Code != 404 {
		t.Errorf("PUT /ui/session: %d %s", rec.Code, rec.Body)
	}
}

// A page of the same site (a sandbox's, on the proxy's domain) can set a
// second session cookie, with a parent Domain or a longer Path, that the
// browser sends first: a request with two is refused, so that no page
// can make the dashboard act in a session of its choosing. What a session
// reads is not kept by any cache.
func TestSessionRefusesTwoCookiesAndIsNotCached(t *testing.T) {
	l, a := newSessionListener(t)
	victim := l.signIn(t, l.keys.a)
	planted := l.signIn(t, l.keys.b)
	both := withHeader("Cookie", api.SessionCookie+"="+planted.cookie+"; "+api.SessionCookie+"="+victim.cookie)
	if rec := l.send(t, "GET", "/ui/session", "", "", both); rec.Code != http.StatusUnauthorized {
		t.Errorf("GET /ui/session with two session cookies: %d %s, want 401", rec.Code, rec.Body)
	}
	rec := l.send(t, "PUT", "/v1/sandboxes/"+a.running.ID+"/files?path=/root/planted", "application/octet-stream", "x",
		both, withHeader(api.CSRFHeader, planted.csrf))
	if rec.Code != http.StatusUnauthorized {
		t.Errorf("a write with two session cookies: %d %s, want 401", rec.Code, rec.Body)
	}
	rec = l.send(t, "GET", "/v1/sandboxes/"+a.running.ID, "", "", withCookie(victim.cookie))
	if rec.Code != http.StatusOK || rec.Header().Get("Cache-Control") != "private, no-store" {
		t.Errorf("a read by session: %d, Cache-Control %q, want private, no-store", rec.Code, rec.Header().Get("Cache-Control"))
	}
}
