// Package envd serves the API of envd, the daemon that E2B's SDKs expect
// inside every sandbox (port 49983): the Connect services process.Process
// and filesystem.Filesystem, GET/POST /files and GET /health. torpor
// serves it from the host, on the port proxy, and carries each call out
// through the lifecycle engine (background processes, confined files), so
// a sandbox needs no agent of E2B's and every call follows the sandbox's
// lifecycle rules (auto-resume, activity, tenants).
//
// The proxy routes a request here once it has found the sandbox, checked
// its access token (X-Access-Token) and woken it when it slept; ServeSandbox
// then answers it for that sandbox.
package envd

import (
	"context"
	"crypto/subtle"
	"fmt"
	"log/slog"
	"net/http"
	"sync"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/lifecycle"
)

// Port is envd's port in an E2B sandbox.
const Port = 49983

// Version is the envd version reported to the SDKs (GET /health and the
// create answer's envdVersion). The SDKs switch features on it: 0.5.7 and
// later take octet-stream uploads, 0.5.2 and later close stdin, 0.3.0 and
// later choose whether a process gets stdin. Report only a version whose
// features are all served here.
const Version = "0.5.7"

// DefaultUser is the user E2B runs commands and file calls as when the
// request names none; its home is the default working directory.
const (
	DefaultUser = "user"
	DefaultHome = "/home/user"
)

// Config is what a Server needs.
type Config struct {
	Engine *lifecycle.Engine
	Logger *slog.Logger
	// MaxUploadBytes bounds what one POST /files writes, after any
	// Content-Encoding is undone (the daemon's max_upload_mib); 0: no
	// limit.
	MaxUploadBytes int64
}

// Server serves envd's API for every sandbox.
type Server struct {
	eng *lifecycle.Engine
	log *slog.Logger
	mux *http.ServeMux
	// maxUpload bounds what one POST /files writes (0: no limit).
	maxUpload int64
	// defaults remembers each sandbox boot's default user (defaultUser).
	defaultsMu sync.Mutex
	defaults   map[string]string
}

// New returns a server.
func New(cfg Config) *Server {
	s := &Server{eng: cfg.Engine, log: cfg.Logger, mux: http.NewServeMux(), maxUpload: cfg.MaxUploadBytes, defaults: map[string]string{}}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.routes()
	return s
}

// HeaderAccessToken carries the sandbox's envd access token (its
// traffic token) on every envd request.
const HeaderAccessToken = "X-Access-Token"

// Authorize tells whether r may reach sb's envd: it carries sb's access
// token, or it is a file transfer signed with it (files.go). Nothing is
// woken before this passes.
func (s *Server) Authorize(r *http.Request, sb *torpor.Sandbox) error {
	token := r.Header.Get(HeaderAccessToken)
	switch {
	case token != "" && subtle.ConstantTimeCompare([]byte(token), []byte(sb.TrafficToken)) == 1:
		return nil
	case token != "":
		return torpor.Errorf(torpor.EForbidden, "wrong envd access token")
	}
	if ok, err := s.signedTransfer(r, sb); ok || err != nil {
		return err
	}
	return torpor.Errorf(torpor.EUnauthenticated, "send the sandbox's envdAccessToken in %s", HeaderAccessToken)
}

// ServeSandbox answers one request for sb, which the proxy found,
// authorized and woke.
func (s *Server) ServeSandbox(w http.ResponseWriter, r *http.Request, sb *torpor.Sandbox) {
	if r.Header.Get(procHeaderTimeout) == "0" {
		// No deadline, as the process calls read it (procTimeout), not
		// one already past, as connect would make it.
		r.Header.Del(procHeaderTimeout)
	}
	s.mux.ServeHTTP(w, r.WithContext(withSandbox(r.Context(), sb)))
}

type sandboxKey struct{}

func withSandbox(ctx context.Context, sb *torpor.Sandbox) context.Context {
	return context.WithValue(ctx, sandboxKey{}, sb)
}

// sandboxOf returns the sandbox a request is for.
func sandboxOf(ctx context.Context) *torpor.Sandbox {
	sb, _ := ctx.Value(sandboxKey{}).(*torpor.Sandbox)
	return sb
}

// defaultUser is who a call that names no user runs as: DefaultUser, or
// root in a sandbox whose template has no such account (torpor's own
// templates), as file calls do (accounts.requestUser). It is read from
// the sandbox's /etc/passwd once per boot.
func (s *Server) defaultUser(ctx context.Context, sb *torpor.Sandbox) string {
	key := fmt.Sprintf("%s/%d", sb.ID, sb.Boots)
	s.defaultsMu.Lock()
	name, ok := s.defaults[key]
	s.defaultsMu.Unlock()
	if ok {
		return name
	}
	fsys, done, err := s.eng.Files(ctx, sb.Tenant, sb.ID, false)
	if err != nil {
		return DefaultUser // the call itself says what is wrong
	}
	name = "root"
	if _, ok := readAccounts(fsys).lookup(DefaultUser); ok {
		name = DefaultUser
	}
	done()
	s.defaultsMu.Lock()
	if len(s.defaults) >= maxDefaults {
		clear(s.defaults)
	}
	s.defaults[key] = name
	s.defaultsMu.Unlock()
	return name
}

// maxDefaults bounds the remembered default users.
const maxDefaults = 4096

func (s *Server) routes() {
	s.mux.HandleFunc("GET /health", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusNoContent)
	})
	s.processRoutes()    // process.go
	s.filesystemRoutes() // filesystem.go
	s.filesRoutes()      // files.go
}
