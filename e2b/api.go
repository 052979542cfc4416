// Package e2b serves E2B's REST control plane (its own paths, no /v1) on
// torpor's API listener, so that E2B's SDKs create, list, pause, connect
// and kill torpor sandboxes unchanged. Handlers translate E2B's requests
// and answers to calls on the lifecycle engine; E2B sandbox ids are
// torpor's ids, and its keys are ordinary torpor API keys (X-API-KEY), so
// tenants and their isolation are torpor's.
//
// E2B's timeout is an end time, not an idle timer: a sandbox made here
// runs until endAt (create + timeout, moved by setTimeout, refreshes and
// connect), then is killed, or paused when the create asked for
// auto-pause (Sandbox.EndAt and OnEnd in the engine).
package e2b

import (
	"context"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/ratelimit"
	"github.com/torpor-dev/torpor/fleet"
	"github.com/torpor-dev/torpor/lifecycle"
)

// Templates maps the template names E2B programs ask for ("base",
// "code-interpreter-v1") to torpor templates, making them on first use
// when needed. A template being made is an error of kind unavailable
// (with RetryAfter) or conflict; an unknown one is invalid_argument or
// not_found.
type Templates interface {
	Resolve(ctx context.Context, e2bName string) (string, error)
}

// TemplateNamer is optionally implemented by a Templates: the E2B name
// that maps to a torpor template, shown as a sandbox's and a template's
// alias.
type TemplateNamer interface {
	E2BName(torporTemplate string) (string, bool)
}

// Config is what an API needs.
type Config struct {
	Engine *lifecycle.Engine
	Auth   torpor.AuthStore
	// TemplateStore lists the templates (GET /templates).
	TemplateStore torpor.TemplateStore
	// Templates maps E2B template names; nil uses the name as it is.
	Templates Templates
	Logger    *slog.Logger
	// Domain is the proxy's domain, returned as each sandbox's domain
	// (the SDK then reaches envd at <port>-<id>.<domain>); empty: none.
	Domain string
	// AllowInternetByDefault is what a create that does not say
	// allow_internet_access gets (E2B's default is true; torpor's false).
	AllowInternetByDefault bool
	// DefaultResources are what a sandbox gets when neither its request
	// nor its template says (the daemon's default_* settings), shown in
	// GET /templates; zero: torpor.DefaultLimits.Default.
	DefaultResources torpor.Resources
	// Ready, when set, says whether the daemon serves yet; until then
	// every request is 503 with Retry-After.
	Ready func() bool
	// RateLimit limits the requests of each tenant key (admin keys are
	// exempt), 429 with Retry-After beyond; nil: no limit. The daemon
	// shares one with the native API, so a key has one rate.
	RateLimit *ratelimit.Limiter
	// VolumeTokenKey signs the tokens that open a volume's files
	// (volumes.go); nil: a random key, whose tokens end with the process.
	VolumeTokenKey []byte
	// Fleet, in a fleet, checks the requests other nodes forward here and
	// forwards to its owner a request for a sandbox of another node
	// (fleet.go); nil: no fleet. Router says which node serves what (nil:
	// Engine).
	Fleet  *fleet.Fleet
	Router lifecycle.Router
}

// API serves E2B's control plane. It is an http.Handler for exactly the
// paths of Routes.
type API struct {
	eng       *lifecycle.Engine
	auth      torpor.AuthStore
	tmplStore torpor.TemplateStore
	tmpls     Templates
	log       *slog.Logger
	domain    string
	internet  bool
	ready     func() bool
	defRes    torpor.Resources
	limiter   *ratelimit.Limiter
	fleet     *fleet.Fleet
	router    lifecycle.Router
	mux       *http.ServeMux
	volKey    []byte

	// cpu keeps each sandbox's last CPU sample, for cpuUsedPct.
	cpuMu sync.Mutex
	cpu   map[string]cpuSample

	// secMu makes the E2B calls' check-then-set of a secret one step
	// (E2B's create refuses a name that exists; torpor's set replaces).
	secMu sync.Mutex
}

type handler func(w http.ResponseWriter, r *http.Request, tenant string, caller torpor.Caller) error

type route struct {
	method, path string
	h            handler
}

func (a *API) routes() []route {
	return []route{
		{"POST", "/sandboxes", a.createV1},
		{"POST", "/v2/sandboxes", a.createV2},
		{"GET", "/sandboxes", a.listV1},
		{"GET", "/v2/sandboxes", a.listV2},
		{"GET", "/sandboxes/{id}", a.get},
		{"DELETE", "/sandboxes/{id}", a.kill},
		{"POST", "/sandboxes/{id}/pause", a.pause},
		{"POST", "/sandboxes/{id}/resume", a.resume},
		{"POST", "/sandboxes/{id}/connect", a.connectV1},
		{"POST", "/v2/sandboxes/{id}/connect", a.connectV2},
		{"POST", "/sandboxes/{id}/timeout", a.setTimeout},
		{"PUT", "/sandboxes/{id}/network", a.updateNetwork},
		{"POST", "/sandboxes/{id}/refreshes", a.refresh},
		{"GET", "/sandboxes/{id}/metrics", a.metrics},
		{"GET", "/templates", a.templates},
		{"POST", "/sandboxes/{id}/snapshots", a.createSnapshot},
		{"GET", "/snapshots", a.listSnapshots},
		{"DELETE", "/templates/{templateID}", a.deleteTemplate},
		{"GET", "/secrets", a.listSecrets},
		{"POST", "/secrets", a.createSecret},
		{"GET", "/secrets/{secretID}", a.getSecret},
		{"POST", "/secrets/{secretID}", a.updateSecret},
		{"DELETE", "/secrets/{secretID}", a.deleteSecret},
		{"POST", "/volumes", a.createVolume},
		{"GET", "/volumes", a.listVolumes},
		{"GET", "/volumes/{volumeID}", a.getVolume},
		{"DELETE", "/volumes/{volumeID}", a.deleteVolume},
		{"GET", "/volumecontent/{volumeID}/dir", a.volumeListDir},
		{"POST", "/volumecontent/{volumeID}/dir", a.volumeMakeDir},
		{"GET", "/volumecontent/{volumeID}/path", a.volumeStat},
		{"PATCH", "/volumecontent/{volumeID}/path", a.volumeUpdateMetadata},
		{"DELETE", "/volumecontent/{volumeID}/path", a.volumeRemove},
		{"GET", "/volumecontent/{volumeID}/file", a.volumeReadFile},
		{"PUT", "/volumecontent/{volumeID}/file", a.volumeWriteFile},
	}
}

// Routes returns "METHOD PATH" of every endpoint, for the daemon's mux
// and documentation checks.
func Routes() []string {
	var a *API
	var out []string
	for _, rt := range a.routes() {
		out = append(out, rt.method+" "+rt.path)
	}
	return out
}

// New returns the API.
func New(cfg Config) *API {
	a := &API{
		eng: cfg.Engine, auth: cfg.Auth, tmplStore: cfg.TemplateStore, tmpls: cfg.Templates,
		log: cfg.Logger, domain: cfg.Domain, internet: cfg.AllowInternetByDefault, ready: cfg.Ready,
		mux: http.NewServeMux(), cpu: map[string]cpuSample{}, defRes: cfg.DefaultResources, limiter: cfg.RateLimit,
	}
	a.fleet, a.router = cfg.Fleet, cfg.Router
	if a.volKey = cfg.VolumeTokenKey; len(a.volKey) == 0 {
		a.volKey = newVolumeKey()
	}
	if a.router == nil && cfg.Engine != nil {
		a.router = cfg.Engine
	}
	if a.defRes == (torpor.Resources{}) {
		a.defRes = torpor.DefaultLimits.Default
	}
	if a.log == nil {
		a.log = slog.New(slog.DiscardHandler)
	}
	for _, rt := range a.routes() {
		a.mux.Handle(rt.method+" "+rt.path, a.wrap(rt))
	}
	a.mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		a.writeError(w, r, torpor.Errorf(torpor.ENotFound, "no endpoint %s %s", r.Method, r.URL.Path))
	})
	return a
}

// ServeHTTP implements http.Handler.
func (a *API) ServeHTTP(w http.ResponseWriter, r *http.Request) { a.mux.ServeHTTP(w, r) }

func (a *API) wrap(rt route) http.Handler {
	perSandbox := strings.Contains(rt.path, "{id}")
	content := strings.HasPrefix(rt.path, "/volumecontent/")
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		var err error
		served := false
		if content {
			served, err = a.serveVolumeContent(w, r, rt.h)
		}
		if !served {
			err = a.serve(w, r, rt.h, perSandbox)
		}
		if err != nil {
			a.writeError(w, r, err)
		}
		a.log.Debug("e2b request", "method", r.Method, "path", r.URL.Path, "took", time.Since(start), "code", torpor.ErrorCodeOf(err))
	})
}

func (a *API) serve(w http.ResponseWriter, r *http.Request, h handler, perSandbox bool) error {
	// The fleet headers go first: nothing after reads them unchecked.
	from, forwarded, ferr := a.fleet.Verify(r)
	if a.ready != nil && !a.ready() {
		return &torpor.Error{Code: torpor.EUnavailable, Message: "the daemon is starting", RetryAfter: time.Second}
	}
	if ferr != nil {
		return ferr
	}
	k, err := a.whoSent(r, from, forwarded)
	if err != nil {
		return err
	}
	if !k.Admin && !forwarded {
		// Admin keys are exempt, as on the native API; a forwarded
		// request was limited where it came in.
		if err := a.limiter.Take(k.ID); err != nil {
			return err
		}
	}
	if a.fleet != nil {
		if perSandbox {
			if done, err := a.toOwner(w, r, k, forwarded); done {
				return err
			}
		}
		r = r.WithContext(context.WithValue(r.Context(), sentKey{}, sent{key: k, forwarded: forwarded}))
	}
	return h(w, r, k.Tenant, torpor.Caller{KeyID: k.ID, Tier: k.Tier})
}

// authenticate reads the key from X-API-KEY (what E2B's SDKs send), or
// from Authorization: Bearer.
func (a *API) authenticate(r *http.Request) (*torpor.APIKey, error) {
	key := r.Header.Get("X-API-KEY")
	if key == "" {
		if h, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
			key = h
		}
	}
	if key == "" {
		return nil, torpor.Errorf(torpor.EUnauthenticated, "send a torpor API key in the X-API-KEY header (E2B_API_KEY)")
	}
	k, err := a.auth.APIKeyByHash(r.Context(), torpor.HashKey(key))
	if err != nil {
		if torpor.IsCode(err, torpor.ENotFound) {
			return nil, torpor.Errorf(torpor.EUnauthenticated, "invalid API key")
		}
		return nil, err
	}
	return k, nil
}

// sandboxID reads the path's sandbox id. E2B's older ids carry the client
// id after a dash ("<id>-<client>"); only the part before it names the
// sandbox.
func sandboxID(r *http.Request) string {
	id, _, _ := strings.Cut(r.PathValue("id"), "-")
	return id
}
