package wire

import "time"

// The dashboard's session routes (docs/dashboard.md): POST /ui/session
// exchanges an API key for a session cookie; GET /ui/session describes
// the live session; DELETE /ui/session ends it.

// SessionRequest is the body of POST /ui/session. The key travels in the
// body only, never in the URL, so that no access log or browser history
// holds it.
type SessionRequest struct {
	Key string `json:"key"`
}

// Session describes a live session: whose it is, the token every
// state-changing request it authenticates must carry in the
// X-CSRF-Token header, and when it ends.
type Session struct {
	Tenant    string    `json:"tenant"`
	Admin     bool      `json:"admin"`
	CSRFToken string    `json:"csrf_token"`
	ExpiresAt time.Time `json:"expires_at"`
	// ProxyURL is the address of a sandbox's port through the daemon's
	// port proxy, with {port} and {id} to fill in (for the page's links),
	// e.g. http://{port}-{id}.localhost:7071/; empty when the daemon runs
	// no proxy.
	ProxyURL string `json:"proxy_url,omitempty"`
}
