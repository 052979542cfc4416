package api

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"net/http"
	"sync"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/wire"
)

// The dashboard's sessions (docs/dashboard.md). A browser signs in by
// sending an API key once, in the body of POST /ui/session; it gets back
// an HttpOnly cookie naming a session, which the native API accepts in
// place of the key, with the same principal (tenant or admin, tier, key
// id: the same rate limit bucket and the same caller in the records). A
// request the cookie authenticates that may change something (any method
// but GET and HEAD) must also carry the session's CSRF token in the
// X-CSRF-Token header: another site can make the browser send the cookie
// (a same-site page such as a sandbox's own, on the proxy's domain, even
// with SameSite=Strict), but it cannot read the token.
//
// Sessions live in the daemon's memory only: the cookie holds a random
// id, the daemon keeps the SHA-256 of that id with the principal, the
// expiry and the CSRF token (never the key). A daemon restart ends every
// session.
const (
	// SessionCookie is the name of the session cookie.
	SessionCookie = "torpor_session"
	// CSRFHeader carries a session's CSRF token.
	CSRFHeader = "X-CSRF-Token"
	// SessionLifetime is how long a session lasts from its sign-in; it
	// is not extended by use.
	SessionLifetime = 12 * time.Hour
	// MaxSessions bounds the sessions the daemon keeps; a sign-in beyond
	// it (with every session still live) is refused with 503.
	MaxSessions = 10000
	// MaxSessionsPerKey bounds the sessions of one key: a sign-in beyond
	// it ends that key's oldest session, so that one key cannot fill the
	// table.
	MaxSessionsPerKey = 32
	// tokenBytes is the randomness of a session id and a CSRF token.
	tokenBytes = 32
)

// sessionHeaders are set on every answer of the session routes: they hold
// a CSRF token, which no cache may keep, and are no page.
var sessionHeaders = map[string]string{
	"Cache-Control":           "no-store",
	"Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'",
	"X-Content-Type-Options":  "nosniff",
	"Referrer-Policy":         "no-referrer",
}

// session is what the daemon keeps of one.
type session struct {
	p       principal
	csrf    string
	expires time.Time
	// end ends the session's context (p.session) and stops its expiry
	// timer.
	end func()
}

// sessions is the daemon's table of live sessions, by the SHA-256 of
// their id: a lookup takes no time that depends on how much of an id a
// guess got right.
type sessions struct {
	clock  torpor.Clock
	mu     sync.Mutex
	byHash map[string]session
	// perKey counts the sessions of each key id.
	perKey map[string]int
}

func newSessions(clock torpor.Clock) *sessions {
	return &sessions{clock: clock, byHash: map[string]session{}, perKey: map[string]int{}}
}

// newToken is tokenBytes of randomness, as URL-safe base64.
func newToken() string {
	b := make([]byte, tokenBytes)
	_, _ = rand.Read(b) // crypto/rand.Read never fails (it panics instead)
	return base64.RawURLEncoding.EncodeToString(b)
}

func hashID(id string) string {
	sum := sha256.Sum256([]byte(id))
	return hex.EncodeToString(sum[:])
}

// open starts a session for p and returns its id (the cookie's value).
func (ss *sessions) open(p principal) (string, session, error) {
	id := newToken()
	h := hashID(id)
	now := ss.clock.Now()
	ss.mu.Lock()
	defer ss.mu.Unlock()
	if len(ss.byHash) >= MaxSessions {
		// Each session's timer removes it when it expires; one due may
		// not have run yet.
		ss.sweepLocked(now)
	}
	if len(ss.byHash) >= MaxSessions {
		return "", session{}, &torpor.Error{Code: torpor.EUnavailable, Message: "the daemon holds as many dashboard sessions as it keeps; sign in later", RetryAfter: time.Minute}
	}
	if ss.perKey[p.keyID] >= MaxSessionsPerKey {
		oldest := ""
		for k, s := range ss.byHash {
			if s.p.keyID == p.keyID && (oldest == "" || s.expires.Before(ss.byHash[oldest].expires)) {
				oldest = k
			}
		}
		ss.endLocked(oldest)
	}
	// The session's context ends with it (sign-out, eviction, expiry),
	// and with it every request it authenticated that is still running:
	// an event stream stops when its session does.
	ctx, cancel := context.WithCancel(context.Background())
	p.session = ctx
	timer := ss.clock.AfterFunc(SessionLifetime, func() { ss.end(id) })
	sess := session{p: p, csrf: newToken(), expires: now.Add(SessionLifetime), end: func() { timer.Stop(); cancel() }}
	ss.byHash[h] = sess
	ss.perKey[p.keyID]++
	return id, sess, nil
}

// endLocked ends the session of hash h, if any.
func (ss *sessions) endLocked(h string) {
	if s, ok := ss.byHash[h]; ok {
		s.end()
		delete(ss.byHash, h)
		if ss.perKey[s.p.keyID]--; ss.perKey[s.p.keyID] <= 0 {
			delete(ss.perKey, s.p.keyID)
		}
	}
}

// sweepLocked removes the expired sessions.
func (ss *sessions) sweepLocked(now time.Time) {
	for k, s := range ss.byHash {
		if !now.Before(s.expires) {
			ss.endLocked(k)
		}
	}
}

// get returns the live session id names; an expired one is removed.
func (ss *sessions) get(id string) (session, bool) {
	if len(id) != base64.RawURLEncoding.EncodedLen(tokenBytes) {
		return session{}, false
	}
	h := hashID(id)
	now := ss.clock.Now()
	ss.mu.Lock()
	defer ss.mu.Unlock()
	s, ok := ss.byHash[h]
	if ok && !now.Before(s.expires) {
		ss.endLocked(h)
		return session{}, false
	}
	return s, ok
}

// end removes the session id names, if any.
func (ss *sessions) end(id string) {
	h := hashID(id)
	ss.mu.Lock()
	defer ss.mu.Unlock()
	ss.endLocked(h)
}

// sessionRoute is one of the dashboard's session routes: each does its
// own authentication (a key in the body, or the cookie).
type sessionRoute struct {
	method, path string
	h            func(w http.ResponseWriter, r *http.Request) error
}

func (s *Server) sessionRoutes() []sessionRoute {
	return []sessionRoute{
		{"POST", "/ui/session", s.signIn},
		{"GET", "/ui/session", s.describeSession},
		{"DELETE", "/ui/session", s.signOut},
	}
}

// uiRoutes are the dashboard's pages, served by Config.UI.
var uiRoutes = []string{"GET /ui", "GET /ui/"}

// signIn exchanges an API key, sent in the JSON body, for a session
// cookie.
func (s *Server) signIn(w http.ResponseWriter, r *http.Request) error {
	setSessionHeaders(w)
	if !s.ready.Load() {
		return &torpor.Error{Code: torpor.EUnavailable, Message: "the daemon is starting", RetryAfter: time.Second}
	}
	if r.URL.Query().Has("key") {
		return torpor.Invalid("key", `send the key in the JSON body ({"key": "..."}), never in the URL`)
	}
	if err := fromOwnOrigin(r); err != nil {
		return err
	}
	var req wire.SessionRequest
	if err := decodeLimit(r, &req, false, 4<<10); err != nil {
		return err
	}
	if req.Key == "" {
		return torpor.Invalid("key", "required: an API key (tpk_...)")
	}
	p, err := s.keyPrincipal(r.Context(), req.Key)
	if err != nil {
		return err
	}
	if err := s.limit(p); err != nil {
		return err
	}
	// A browser that signs in again leaves its earlier session behind:
	// end it rather than keep it until it expires.
	if c, err := r.Cookie(SessionCookie); err == nil {
		s.sessions.end(c.Value)
	}
	id, sess, err := s.sessions.open(p)
	if err != nil {
		return err
	}
	http.SetCookie(w, sessionCookie(r, id, int(SessionLifetime/time.Second)))
	writeJSON(w, http.StatusOK, s.describe(sess))
	return nil
}

// describeSession answers the live session the cookie names, so that a
// page loaded again learns whose it is and its CSRF token.
func (s *Server) describeSession(w http.ResponseWriter, r *http.Request) error {
	setSessionHeaders(w)
	sess, _, err := s.cookieSession(r)
	if err != nil {
		return err
	}
	if err := s.limit(sess.p); err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, s.describe(sess))
	return nil
}

// signOut ends the session the cookie names and clears the cookie.
func (s *Server) signOut(w http.ResponseWriter, r *http.Request) error {
	setSessionHeaders(w)
	sess, id, err := s.cookieSession(r)
	if err != nil {
		return err
	}
	if err := checkCSRF(r, sess); err != nil {
		return err
	}
	s.sessions.end(id)
	http.SetCookie(w, sessionCookie(r, "", -1))
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func setSessionHeaders(w http.ResponseWriter) {
	for k, v := range sessionHeaders {
		w.Header().Set(k, v)
	}
}

func (s *Server) describe(sess session) wire.Session {
	return wire.Session{Tenant: sess.p.tenant, Admin: sess.p.admin, CSRFToken: sess.csrf, ExpiresAt: sess.expires.UTC(), ProxyURL: s.proxyURL}
}

// sessionCookie is the cookie naming session id for maxAge seconds (a
// negative maxAge clears it). Path=/ because it authenticates /v1 as well
// as /ui; Secure when the browser reached the daemon over TLS (directly,
// or through a proxy that says so: the flag only restricts the cookie).
func sessionCookie(r *http.Request, id string, maxAge int) *http.Cookie {
	return &http.Cookie{Name: SessionCookie, Value: id, Path: "/", MaxAge: maxAge, HttpOnly: true, SameSite: http.SameSiteStrictMode,
		Secure: r.TLS != nil || r.Header.Get("X-Forwarded-Proto") == "https"}
}

// cookieSession returns the live session the request's cookie names, and
// its id.
func (s *Server) cookieSession(r *http.Request) (session, string, error) {
	if err := fromOwnOrigin(r); err != nil {
		return session{}, "", err
	}
	var c *http.Cookie
	for _, ck := range r.Cookies() {
		if ck.Name != SessionCookie {
			continue
		}
		if c != nil {
			// A second one was set by another page of this site (a
			// parent Domain or a longer Path): whichever came first
			// could be a session the page chose.
			return session{}, "", torpor.Errorf(torpor.EUnauthenticated, "more than one dashboard session cookie: sign in again at %s", "/ui/")
		}
		c = ck
	}
	if c == nil {
		return session{}, "", torpor.Errorf(torpor.EUnauthenticated, "no dashboard session: sign in at %s", "/ui/")
	}
	sess, ok := s.sessions.get(c.Value)
	if !ok {
		return session{}, "", torpor.Errorf(torpor.EUnauthenticated, "the dashboard session has ended or expired: sign in again at %s", "/ui/")
	}
	return sess, c.Value, nil
}

// cookiePrincipal authenticates a native API request by its session
// cookie: the session's principal, once a request that may change
// something showed the session's CSRF token.
func (s *Server) cookiePrincipal(r *http.Request) (principal, error) {
	sess, _, err := s.cookieSession(r)
	if err != nil {
		return principal{}, err
	}
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		if err := checkCSRF(r, sess); err != nil {
			return principal{}, err
		}
	}
	return sess.p, nil
}

// checkCSRF refuses a request whose X-CSRF-Token is not the session's.
func checkCSRF(r *http.Request, sess session) error {
	got := r.Header.Get(CSRFHeader)
	if got == "" {
		return &torpor.Error{Code: torpor.EForbidden, Reason: "csrf_token", Message: "the CSRF token is missing: a request authenticated by the session cookie that is not a GET sends the session's csrf_token in the " + CSRFHeader + " header"}
	}
	if subtle.ConstantTimeCompare([]byte(got), []byte(sess.csrf)) != 1 {
		return &torpor.Error{Code: torpor.EForbidden, Reason: "csrf_token", Message: "the " + CSRFHeader + " header is not this session's CSRF token"}
	}
	return nil
}

// fromOwnOrigin refuses a cookie or sign-in request that a browser says
// another site's page made (Sec-Fetch-Site, which pages cannot set):
// "same-site" included, since a sandbox's pages on the proxy's domain may
// be the same site as the daemon. A request without the header (an older
// browser, a script) is left to the CSRF token.
func fromOwnOrigin(r *http.Request) error {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "cross-site", "same-site":
		return torpor.Errorf(torpor.EForbidden, "the dashboard's session is used only by pages of its own origin")
	}
	return nil
}
