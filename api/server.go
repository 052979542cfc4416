// Package api is torpor's native HTTP API: JSON over /v1, bearer-key
// authentication, tenants, and the error shape of DESIGN.md §3. Handlers
// translate HTTP to calls on the lifecycle engine and back; they hold no
// lifecycle logic.
package api

import (
	"context"
	"log/slog"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/ratelimit"
	"github.com/torpor-dev/torpor/fleet"
	"github.com/torpor-dev/torpor/lifecycle"
	"github.com/torpor-dev/torpor/template"
	"github.com/torpor-dev/torpor/webhook"
)

// Config is what a Server needs.
type Config struct {
	Engine *lifecycle.Engine
	Auth   torpor.AuthStore
	// Templates lists the templates sandboxes can be made from.
	Templates torpor.TemplateStore
	// TemplateManager imports, builds and removes templates; nil answers
	// those routes with 503.
	TemplateManager *template.Manager
	Clock           torpor.Clock
	Logger          *slog.Logger
	// Metrics, when set, is served at GET /metrics (without
	// authentication: it holds only aggregate figures); Requests is told
	// of every request.
	Metrics  http.Handler
	Requests RequestObserver
	// Webhooks keeps webhook endpoints; WebhooksChanged is told when one
	// is added or removed (the dispatcher refreshes its loops).
	Webhooks        torpor.WebhookStore
	WebhooksChanged func()
	// WebhookDeliveries tells how each webhook's deliveries are going (the
	// daemon's dispatcher); nil: GET /v1/webhooks shows no delivery object.
	WebhookDeliveries torpor.WebhookDeliveries
	// WebhookGuard checks an endpoint's address before it is registered;
	// nil: webhook.NewGuard(webhook.GuardConfig{}), the default rule.
	WebhookGuard *webhook.Guard
	// MaxUploadBytes bounds the body of a file or tar upload; 0: no limit.
	MaxUploadBytes int64
	// RateLimit limits the requests of each tenant key (admin keys are
	// exempt); nil: no limit. The daemon shares one with the E2B API.
	RateLimit *ratelimit.Limiter
	// UI serves the dashboard's pages at GET /ui and /ui/ (package ui);
	// with it come the session routes (/ui/session) and the session
	// cookie as a way to authenticate (session.go). nil turns all three
	// off.
	UI http.Handler
	// ProxyURL is the port proxy's address pattern the dashboard's
	// session tells the page (wire.Session.ProxyURL); empty: no proxy.
	ProxyURL string
	// Fleet, in a fleet, checks the requests other nodes forward here and
	// forwards to its owner a request for a sandbox of another node
	// (fleet.go); nil: no fleet. Router says which node serves what (nil:
	// Engine).
	Fleet  *fleet.Fleet
	Router lifecycle.Router
}

// Server serves the native API.
type Server struct {
	// requests is told of every request (metrics).
	requests RequestObserver
	eng      *lifecycle.Engine
	auth     torpor.AuthStore
	tmpls    torpor.TemplateStore
	// tmplMgr imports, builds and removes templates (nil: not offered).
	tmplMgr *template.Manager
	clock   torpor.Clock
	log     *slog.Logger
	mux     *http.ServeMux
	hooks   torpor.WebhookStore
	// hooksChanged is told when a webhook is added or removed.
	hooksChanged func()
	// deliveries reads the dispatcher's state of each webhook; may be nil.
	deliveries torpor.WebhookDeliveries
	// hookGuard refuses endpoints on the host's own networks.
	hookGuard *webhook.Guard
	// maxUpload bounds file and tar uploads (0: no limit).
	maxUpload int64
	// limiter limits each tenant key's requests (nil: none).
	limiter *ratelimit.Limiter
	// sessions are the dashboard's sessions (nil: no dashboard, and no
	// cookie is accepted).
	sessions *sessions
	// proxyURL is the port proxy's address pattern (Config.ProxyURL).
	proxyURL string
	// fleet forwards to other nodes (nil: no fleet); router says to which.
	fleet  *fleet.Fleet
	router lifecycle.Router
	ready  atomic.Bool
}

// principal is who made a request.
type principal struct {
	tenant string
	admin  bool
	tier   string
	keyID  string
	// session is the context of the dashboard session that
	// authenticated the request (nil for a key): it ends when the
	// session does.
	session context.Context
}

type handler func(w http.ResponseWriter, r *http.Request, p principal) error

// route is one endpoint. The table in routes() is the single list of
// endpoints; docs/api.md is checked against it.
type route struct {
	method, path string
	h            handler
	admin        bool
	// tenant says whether the route takes ?tenant= (actAs).
	tenant tenantScope
}

// tenantScope says whether a route takes the query parameter tenant, with
// which an admin key acts as another tenant (docs/api.md, "Acting as a
// tenant").
type tenantScope int

const (
	// tenantNone: the route takes no tenant; one sent is refused.
	tenantNone tenantScope = iota
	// tenantOwn: the handler reads tenant itself (GET /v1/usage).
	tenantOwn
	// tenantOne: an admin may name one tenant; the request runs as it.
	tenantOne
	// tenantAny: as tenantOne, or tenant=* for every tenant's sandboxes
	// but the warm pools' (lifecycle.AllTenants).
	tenantAny
)

// Routes returns "METHOD PATH" of every endpoint, for documentation checks.
func Routes() []string {
	var s *Server
	var out []string
	for _, rt := range s.routes() {
		out = append(out, rt.method+" "+rt.path)
	}
	for _, rt := range s.sessionRoutes() {
		out = append(out, rt.method+" "+rt.path)
	}
	out = append(out, uiRoutes...)
	return append(out, "GET /healthz", "GET /metrics")
}

func (s *Server) routes() []route {
	return []route{
		{"POST", "/v1/sandboxes", s.create, false, tenantNone},
		{"GET", "/v1/sandboxes", s.list, false, tenantAny},
		{"GET", "/v1/sandboxes/{id}", s.get, false, tenantOne},
		{"PATCH", "/v1/sandboxes/{id}", s.update, false, tenantOne},
		{"DELETE", "/v1/sandboxes/{id}", s.delete, false, tenantOne},
		{"POST", "/v1/sandboxes/{id}/pause", s.pause, false, tenantOne},
		{"POST", "/v1/sandboxes/{id}/start", s.start, false, tenantOne},
		{"POST", "/v1/sandboxes/{id}/resume", s.start, false, tenantOne},
		{"POST", "/v1/sandboxes/{id}/connect", s.start, false, tenantOne},
		{"POST", "/v1/sandboxes/{id}/hibernate", s.verb((*lifecycle.Engine).Hibernate), false, tenantOne},
		{"POST", "/v1/sandboxes/{id}/archive", s.verb((*lifecycle.Engine).Archive), false, tenantOne},
		{"POST", "/v1/sandboxes/{id}/restart", s.verb((*lifecycle.Engine).Restart), false, tenantOne},
		{"POST", "/v1/sandboxes/{id}/checkpoints", s.createCheckpoint, false, tenantOne},
		{"GET", "/v1/sandboxes/{id}/checkpoints", s.listCheckpoints, false, tenantOne},
		{"GET", "/v1/sandboxes/{id}/checkpoints/{name}", s.getCheckpoint, false, tenantOne},
		{"DELETE", "/v1/sandboxes/{id}/checkpoints/{name}", s.deleteCheckpoint, false, tenantOne},
		{"POST", "/v1/sandboxes/{id}/fork", s.fork, false, tenantOne},
		{"POST", "/v1/sandboxes/{id}/restore", s.restore, false, tenantOne},
		{"POST", "/v1/sandboxes/{id}/touch", s.verb((*lifecycle.Engine).Touch), false, tenantOne},
		{"POST", "/v1/sandboxes/{id}/exec", s.exec, false, tenantOne},
		{"POST", "/v1/sandboxes/{id}/code", s.runCode, false, tenantOne},
		{"POST", "/v1/sandboxes/{id}/processes", s.startProcess, false, tenantOne},
		{"GET", "/v1/sandboxes/{id}/processes", s.listProcesses, false, tenantOne},
		{"GET", "/v1/sandboxes/{id}/processes/{pid}/output", s.processOutput, false, tenantOne},
		{"POST", "/v1/sandboxes/{id}/processes/{pid}/stdin", s.processStdin, false, tenantOne},
		{"POST", "/v1/sandboxes/{id}/processes/{pid}/signal", s.signalProcess, false, tenantOne},
		{"GET", "/v1/sandboxes/{id}/files", s.readFile, false, tenantOne},
		{"PUT", "/v1/sandboxes/{id}/files", s.writeFile, false, tenantOne},
		{"DELETE", "/v1/sandboxes/{id}/files", s.removeFile, false, tenantOne},
		{"GET", "/v1/sandboxes/{id}/files/list", s.listFiles, false, tenantOne},
		{"GET", "/v1/sandboxes/{id}/files/stat", s.statFile, false, tenantOne},
		{"POST", "/v1/sandboxes/{id}/files/mkdir", s.mkdir, false, tenantOne},
		{"POST", "/v1/sandboxes/{id}/files/rename", s.rename, false, tenantOne},
		{"GET", "/v1/sandboxes/{id}/files/tar", s.downloadTar, false, tenantOne},
		{"PUT", "/v1/sandboxes/{id}/files/tar", s.uploadTar, false, tenantOne},
		{"GET", "/v1/sandboxes/{id}/events", s.sandboxEvents, false, tenantOne},
		{"GET", "/v1/sandboxes/{id}/wakeups", s.listWakeups, false, tenantOne},
		{"PUT", "/v1/sandboxes/{id}/wakeups", s.setWakeups, false, tenantOne},
		{"POST", "/v1/sandboxes/{id}/wakeups", s.addWakeup, false, tenantOne},
		{"DELETE", "/v1/sandboxes/{id}/wakeups", s.clearWakeups, false, tenantOne},
		{"DELETE", "/v1/sandboxes/{id}/wakeups/{wakeup}", s.removeWakeup, false, tenantOne},
		{"GET", "/v1/events", s.events, false, tenantAny},
		{"GET", "/v1/usage", s.usage, false, tenantOwn},
		{"GET", "/v1/runtimes", s.listRuntimes, false, tenantNone},
		{"GET", "/v1/templates", s.templates, false, tenantNone},
		{"GET", "/v1/templates/{name}", s.getTemplate, false, tenantNone},
		{"GET", "/v1/pools", s.listPools, false, tenantNone},
		{"PUT", "/v1/pools/{template}", s.setPool, true, tenantNone},
		{"GET", "/v1/nodes", s.listNodes, true, tenantNone},
		{"POST", "/v1/nodes/{name}/drain", s.drainNode, true, tenantNone},
		{"POST", "/v1/nodes/{name}/undrain", s.undrainNode, true, tenantNone},
		{"DELETE", "/v1/templates/{name}", s.deleteTemplate, true, tenantNone},
		{"POST", "/v1/templates", s.importTemplate, true, tenantNone},
		{"POST", "/v1/templates/build", s.buildTemplate, true, tenantNone},
		{"GET", "/v1/tenants", s.listTenants, true, tenantNone},
		{"POST", "/v1/tenants", s.createTenant, true, tenantNone},
		{"PATCH", "/v1/tenants/{name}", s.updateTenant, true, tenantNone},
		{"POST", "/v1/keys", s.createKey, true, tenantNone},
		{"POST", "/v1/webhooks", s.createWebhook, false, tenantNone},
		{"GET", "/v1/webhooks", s.listWebhooks, false, tenantNone},
		{"DELETE", "/v1/webhooks/{id}", s.deleteWebhook, false, tenantNone},
		{"GET", "/v1/secrets", s.listSecrets, false, tenantOne},
		{"GET", "/v1/secrets/{name}", s.getSecret, false, tenantOne},
		{"PUT", "/v1/secrets/{name}", s.setSecret, false, tenantOne},
		{"DELETE", "/v1/secrets/{name}", s.deleteSecret, false, tenantOne},
		{"POST", "/v1/volumes", s.createVolume, false, tenantOne},
		{"GET", "/v1/volumes", s.listVolumes, false, tenantOne},
		{"GET", "/v1/volumes/{name}", s.getVolume, false, tenantOne},
		{"PATCH", "/v1/volumes/{name}", s.resizeVolume, false, tenantOne},
		{"DELETE", "/v1/volumes/{name}", s.deleteVolume, false, tenantOne},
		{"GET", "/v1/volumes/{name}/files", s.readFile, false, tenantOne},
		{"PUT", "/v1/volumes/{name}/files", s.writeFile, false, tenantOne},
		{"DELETE", "/v1/volumes/{name}/files", s.removeFile, false, tenantOne},
		{"GET", "/v1/volumes/{name}/files/list", s.listFiles, false, tenantOne},
		{"GET", "/v1/volumes/{name}/files/stat", s.statFile, false, tenantOne},
		{"POST", "/v1/volumes/{name}/files/mkdir", s.mkdir, false, tenantOne},
		{"POST", "/v1/volumes/{name}/files/rename", s.rename, false, tenantOne},
		{"GET", "/v1/volumes/{name}/files/tar", s.downloadTar, false, tenantOne},
		{"PUT", "/v1/volumes/{name}/files/tar", s.uploadTar, false, tenantOne},
	}
}

// New returns a server. It answers 503 until SetReady is called.
func New(cfg Config) *Server {
	s := &Server{requests: cfg.Requests, hooks: cfg.Webhooks, hooksChanged: cfg.WebhooksChanged, eng: cfg.Engine, auth: cfg.Auth, tmpls: cfg.Templates, clock: cfg.Clock, log: cfg.Logger, mux: http.NewServeMux()}
	s.maxUpload = cfg.MaxUploadBytes
	s.limiter = cfg.RateLimit
	s.tmplMgr = cfg.TemplateManager
	s.proxyURL = cfg.ProxyURL
	s.fleet, s.router = cfg.Fleet, cfg.Router
	if s.router == nil && cfg.Engine != nil {
		s.router = cfg.Engine
	}
	s.hookGuard = cfg.WebhookGuard
	s.deliveries = cfg.WebhookDeliveries
	if s.hookGuard == nil {
		s.hookGuard = webhook.NewGuard(webhook.GuardConfig{})
	}
	if s.clock == nil {
		s.clock = torpor.SystemClock{}
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		if !s.ready.Load() {
			s.writeError(w, r, &torpor.Error{Code: torpor.EUnavailable, Message: "starting", RetryAfter: time.Second})
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok\n"))
	})
	for _, rt := range s.routes() {
		s.mux.Handle(rt.method+" "+rt.path, s.wrap(rt))
	}
	if cfg.Metrics != nil {
		s.mux.Handle("GET /metrics", cfg.Metrics)
	}
	if cfg.UI != nil {
		s.sessions = newSessions(s.clock)
		for _, rt := range s.sessionRoutes() {
			pattern := rt.method + " " + rt.path
			s.mux.Handle(pattern, s.observe(pattern, rt.h))
		}
		for _, pattern := range uiRoutes {
			s.mux.Handle(pattern, cfg.UI)
		}
	}
	s.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		s.writeError(w, r, torpor.Errorf(torpor.ENotFound, "no endpoint %s %s", r.Method, r.URL.Path))
	})
	return s
}

// SetReady makes the server answer requests (after recovery finished).
func (s *Server) SetReady() { s.ready.Store(true) }

// Ready tells whether SetReady was called.
func (s *Server) Ready() bool { return s.ready.Load() }

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	// The fleet headers go first: nothing after reads them unchecked.
	s.mux.ServeHTTP(w, s.checkFleet(r))
}

// wrap authenticates, checks readiness and admin rights, and turns a
// handler's error into the error response.
func (s *Server) wrap(rt route) http.Handler {
	return s.observe(rt.method+" "+rt.path, func(w http.ResponseWriter, r *http.Request) error {
		return s.serve(w, r, rt)
	})
}

// observe serves h as the route pattern: it writes h's error in the error
// shape, logs the request and tells the metrics.
func (s *Server) observe(pattern string, h func(w http.ResponseWriter, r *http.Request) error) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		rec := &statusRecorder{ResponseWriter: w, status: http.StatusOK}
		err := h(rec, r)
		if err != nil {
			s.writeError(rec, r, err)
		}
		s.log.Debug("request", "method", r.Method, "path", r.URL.Path, "took", time.Since(start), "code", torpor.ErrorCodeOf(err))
		if s.requests != nil {
			s.requests.Request(pattern, rec.status, time.Since(start))
		}
	})
}

// RequestObserver is told of every API request, for metrics.
type RequestObserver interface {
	Request(route string, status int, took time.Duration)
}

// statusRecorder remembers the status a handler wrote.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (r *statusRecorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

// Unwrap lets http.ResponseController reach the real writer (flushes of
// streams).
func (r *statusRecorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

func (s *Server) serve(w http.ResponseWriter, r *http.Request, rt route) error {
	if !s.ready.Load() {
		return &torpor.Error{Code: torpor.EUnavailable, Message: "the daemon is starting", RetryAfter: time.Second}
	}
	p, forwarded, err := s.whoSent(r)
	if err != nil {
		return err
	}
	if !forwarded { // a forwarded request was limited where it came in
		if err := s.limit(p); err != nil {
			return err
		}
	}
	who := p
	if rt.admin && !p.admin {
		return torpor.Errorf(torpor.EForbidden, "this needs an admin key")
	}
	if p, err = actAs(r, rt.tenant, p); err != nil {
		return err
	}
	if p.session != nil {
		// What a session reads is its tenant's: no cache keeps it (a
		// stream or a handler may say otherwise).
		w.Header().Set("Cache-Control", "private, no-store")
		// A request of a session ends when the session does (an
		// event stream at sign-out), as if its client went away.
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		defer context.AfterFunc(p.session, cancel)()
		r = r.WithContext(ctx)
	}
	if s.fleet != nil {
		if done, err := s.toOwner(w, r, rt, who, p, forwarded); done {
			return err
		}
	}
	return rt.h(w, r, p)
}

// actAs applies the query parameter tenant of a request to its principal:
// an admin key (or an admin's session) acts as the tenant it names, or as
// every tenant (tenant=*) where the route lists or follows. A tenant key
// may name only its own tenant: any other is refused with 403 before
// anything is read, as GET /v1/usage does, so that it learns nothing of
// the tenant it named, not even whether it exists. Without the parameter
// nothing changes (an admin key acts as its own tenant, "default").
func actAs(r *http.Request, scope tenantScope, p principal) (principal, error) {
	q := r.URL.Query()
	vs, ok := q["tenant"]
	if !ok || scope == tenantOwn {
		return p, nil
	}
	if scope == tenantNone {
		return p, torpor.Invalid("tenant", "%s %s takes no tenant", r.Method, r.URL.Path)
	}
	if len(vs) != 1 {
		return p, torpor.Invalid("tenant", "name one tenant")
	}
	name := vs[0]
	switch {
	case name == p.tenant:
		return p, nil
	case !p.admin:
		return p, torpor.Errorf(torpor.EForbidden, "a tenant key acts only as its own tenant")
	case name == lifecycle.AllTenants && scope == tenantAny:
	case name == lifecycle.AllTenants:
		return p, torpor.Invalid("tenant", "tenant=%s (every tenant) is for the list and the event stream; name the sandbox's tenant", lifecycle.AllTenants)
	default:
		// The name rule also refuses the warm pools' tenant
		// (torpor.PoolTenant starts with '_'): its members are no
		// one's, an admin's included.
		if err := torpor.ValidateTenantName(name); err != nil {
			return p, err
		}
	}
	p.tenant = name
	return p, nil
}

// authenticate finds who sent a request: the bearer key of its
// Authorization header or, when it has none and the dashboard is on, the
// session its cookie names (session.go).
func (s *Server) authenticate(ctx context.Context, r *http.Request) (principal, error) {
	const prefix = "Bearer "
	h := r.Header.Get("Authorization")
	if h == "" && s.sessions != nil {
		if _, err := r.Cookie(SessionCookie); err == nil {
			return s.cookiePrincipal(r)
		}
	}
	if len(h) <= len(prefix) || h[:len(prefix)] != prefix {
		return principal{}, torpor.Errorf(torpor.EUnauthenticated, "send an API key as 'Authorization: Bearer KEY'")
	}
	return s.keyPrincipal(ctx, h[len(prefix):])
}

// keyPrincipal is the principal of an API key's secret.
func (s *Server) keyPrincipal(ctx context.Context, secret string) (principal, error) {
	k, err := s.auth.APIKeyByHash(ctx, torpor.HashKey(secret))
	if err != nil {
		if torpor.IsCode(err, torpor.ENotFound) {
			return principal{}, torpor.Errorf(torpor.EUnauthenticated, "unknown API key")
		}
		return principal{}, err
	}
	return principal{tenant: k.Tenant, admin: k.Admin, tier: k.Tier, keyID: k.ID}, nil
}
