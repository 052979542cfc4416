package proxy

import (
	"fmt"
	"net/http"

	"github.com/torpor-dev/torpor"
)

// E2B's SDKs address a sandbox's port with these headers when
// E2B_SANDBOX_URL points them at the proxy.
const (
	HeaderE2BSandboxID   = "E2b-Sandbox-Id"
	HeaderE2BSandboxPort = "E2b-Sandbox-Port"
)

// Service is a port that the daemon serves itself for every sandbox
// instead of forwarding it inside (E2B's envd and code interpreter).
// Authorize checks a request before anything can wake the sandbox;
// ServeSandbox answers it once the sandbox runs.
type Service interface {
	Authorize(r *http.Request, sb *torpor.Sandbox) error
	ServeSandbox(w http.ResponseWriter, r *http.Request, sb *torpor.Sandbox)
}

// serveService answers a request for a service port: the sandbox is
// looked up, the service authorizes the request, a sleeping sandbox is
// woken (auto_resume) and the service answers. The request counts as
// traffic when it comes and when it ends; a stream it opens (a process's
// output, a watch) is no request under way, so it does not keep the
// sandbox from an idle pause. Refusals are in the shape E2B's SDKs read:
// {"code": status, "message": ...}, and 502 for a sandbox that is not
// there or not running, which they take as "not running any more".
func (p *Proxy) serveService(w http.ResponseWriter, r *http.Request, t target, svc Service) error {
	sb, _, err := p.lookup(r.Context(), t.id)
	switch {
	case err == nil:
		err = svc.Authorize(r, sb)
	case torpor.IsCode(err, torpor.ENotFound):
		// As in reach: an unknown id is refused as a sandbox that
		// exists refuses a request without its token.
		if aerr := svc.Authorize(r, unknownSandbox(t.id)); aerr != nil {
			err = aerr
		}
	}
	if err == nil && sb.State != torpor.StateRunning {
		if sb.State == torpor.StateTerminated || sb.State == torpor.StateTerminating {
			err = torpor.Errorf(torpor.EGone, "sandbox %s is terminated", sb.ID)
		} else if sb, err = p.wake(r.Context(), t); err == nil {
			p.eng.RequestEnded(sb.ID)
		}
	}
	if err != nil {
		writeServiceError(w, err)
		return nil
	}
	p.eng.NoteTraffic(sb.ID)
	defer p.eng.NoteTraffic(sb.ID)
	svc.ServeSandbox(w, r, sb)
	return nil
}

// writeServiceError answers a refused service request in E2B's error
// shape.
func writeServiceError(w http.ResponseWriter, err error) {
	e := torpor.AsError(err)
	status := http.StatusBadGateway
	switch e.Code {
	case torpor.EInvalid:
		status = http.StatusBadRequest
	case torpor.EUnauthenticated:
		status = http.StatusUnauthorized
	case torpor.EForbidden:
		status = http.StatusForbidden
	case torpor.EInternal:
		status, e.Message = http.StatusInternalServerError, "internal error"
	case torpor.EUnavailable:
		status = http.StatusServiceUnavailable
		w.Header().Set("Retry-After", "1")
	}
	msg := e.Message
	if status == http.StatusBadGateway {
		msg = "the sandbox is not running: " + msg
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, "{\"code\":%d,\"message\":%q}\n", status, msg)
}
