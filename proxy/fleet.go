package proxy

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httputil"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/fleet"
	"github.com/torpor-dev/torpor/lifecycle"
)

// In a fleet (docs/fleet.md) any node's proxy serves every sandbox: a
// request for a sandbox of another node goes, as it came (Host, traffic
// token, envd's access token and all), to that node's proxy, signed by
// this node, and its answer comes back as it streams; a CONNECT becomes
// a tunnel through the owner's proxy. The owner checks the tokens, wakes
// the sandbox and counts its traffic as for any request. A request that
// another node forwarded is served here, whatever the engine says.
//
// The proxy's own loop (h1.go) hands a request for another node's
// sandbox, and one signed by another node, to net/http's path, which
// forwards or checks it: only the Route call is added to the loop's path
// for a sandbox of this node.

// Router says which node serves a sandbox's requests; *lifecycle.Engine
// is one.
type Router interface {
	Route(ctx context.Context, tenant, id string) (lifecycle.Route, error)
}

// forwardedKey marks, in a request's context, one that another node
// forwarded.
type forwardedKey struct{}

// remote tells whether the loop should leave a request for sandbox id to
// net/http's path: another node owns the sandbox, or the engine could not
// say (that path answers why).
func (p *Proxy) remote(id string) bool {
	if p.router == nil {
		return false
	}
	to, err := p.router.Route(context.Background(), "", id)
	if err != nil {
		return !torpor.IsCode(err, torpor.ENotFound)
	}
	return !to.Local
}

// toOwner forwards a request for a sandbox of another node to that
// node's proxy, and tells whether it did; err is then the refusal to
// answer (the node could not be reached, or a forwarded request found
// the sandbox moved on). An unknown sandbox stays here, and is refused
// as here.
func (p *Proxy) toOwner(w http.ResponseWriter, r *http.Request, t target, forwarded bool) (bool, error) {
	to, err := p.router.Route(r.Context(), "", t.id)
	switch {
	case torpor.IsCode(err, torpor.ENotFound), err == nil && to.Local:
		return false, nil
	case err != nil:
	case forwarded:
		err = &torpor.Error{Code: torpor.EUnavailable, RetryAfter: time.Second,
			Message: fmt.Sprintf("sandbox %s moved to node %s as the request came; retry", t.id, to.Node.Name)}
	default:
		err = p.fleet.Forward(w, r, to.Node, fleet.Proxy, fleet.Identity{})
	}
	if err != nil && r.Context().Err() != nil {
		return true, nil // the client went away: no one reads an answer
	}
	if err != nil && p.services[t.port] != nil && r.Method != http.MethodConnect {
		// Refused in the shape of the service's SDKs (service.go).
		writeServiceError(w, err)
		return true, nil
	}
	return true, err
}

// forwardedFrom sets the X-Forwarded-* headers of a request that another
// node forwarded to those it signed: the client is the one that came to
// that node, not that node.
func forwardedFrom(pr *httputil.ProxyRequest) {
	for _, h := range []string{"X-Forwarded-For", "X-Forwarded-Proto"} {
		if v := pr.In.Header.Values(h); len(v) > 0 {
			pr.Out.Header[h] = v
		}
	}
	pr.Out.Header.Set("X-Forwarded-Host", pr.In.Host)
}
