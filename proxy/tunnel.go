package proxy

import (
	"encoding/base64"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/fleet"
)

// tunnel answers a CONNECT: it connects to the sandbox's port and copies
// bytes both ways until both sides are done (fleet.ServeTunnel). Over
// HTTP/1.1 the client's connection becomes the tunnel; over HTTP/2, the
// request's stream. The upstream connection reports its traffic like any
// other.
func (p *Proxy) tunnel(w http.ResponseWriter, r *http.Request, sb *torpor.Sandbox, port int, req *underWay) error {
	up, err := p.dial(r.Context(), sb, port)
	req.end() // connected: from now on its bytes count while they flow
	if err != nil {
		p.log.Debug("proxy: tunnel", "sandbox", sb.ID, "port", port, "err", err)
		return &torpor.Error{Code: torpor.EUnavailable, RetryAfter: time.Second,
			Message: fmt.Sprintf("port %d of the sandbox did not answer", port)}
	}
	defer up.Close()
	if err := fleet.ServeTunnel(w, r, up, up); err != nil {
		return fmt.Errorf("proxy: %w", err)
	}
	return nil
}

// parseProxyAuth reads a Basic Proxy-Authorization (user and password).
func parseProxyAuth(h string) (user, password string, ok bool) {
	scheme, cred, found := strings.Cut(h, " ")
	if !found || !strings.EqualFold(scheme, "Basic") {
		return "", "", false
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(cred))
	if err != nil {
		return "", "", false
	}
	return strings.Cut(string(b), ":")
}
