package torpor

import (
	"context"
	"net"
	"net/url"
	"strings"
	"time"
)

// Webhook is an endpoint that receives a tenant's events, each delivery
// signed with the endpoint's secret.
type Webhook struct {
	ID     string `json:"id"`
	Tenant string `json:"tenant"`
	URL    string `json:"url"`
	// Secret signs deliveries; it is shown once, when the webhook is made.
	Secret    string    `json:"-"`
	CreatedAt time.Time `json:"created_at"`
	// Cursor is the last event delivered (acknowledged with a 2xx).
	Cursor int64 `json:"cursor"`
	// Delivery is how its deliveries are going, when the server runs a
	// dispatcher (GET /v1/webhooks); absent elsewhere.
	Delivery *WebhookDelivery `json:"delivery,omitempty"`
}

// WebhookDelivery is a webhook's delivery state. Everything but Behind is
// kept in the dispatcher's memory and starts again at zero when the daemon
// restarts; Behind is counted from the store.
type WebhookDelivery struct {
	// Delivered counts events acknowledged with a 2xx since the daemon
	// started.
	Delivered int64 `json:"delivered"`
	// LastAttemptAt is when the last attempt ended; absent before the
	// first since the daemon started.
	LastAttemptAt *time.Time `json:"last_attempt_at,omitempty"`
	// LastStatus is the HTTP status the endpoint last answered; absent when
	// the last attempt got no answer (LastError says why).
	LastStatus int `json:"last_status,omitempty"`
	// LastError says why the last attempt failed; absent after a success.
	// It never carries the secret, the URL or, for an address the guard
	// refuses, which rule refused it.
	LastError string `json:"last_error,omitempty"`
	// ConsecutiveFailures counts failed attempts since the last success.
	ConsecutiveFailures int `json:"consecutive_failures"`
	// NextRetryAt is when the next attempt is due while backing off.
	NextRetryAt *time.Time `json:"next_retry_at,omitempty"`
	// Behind counts the tenant's stored events after the cursor, up to
	// MaxWebhookBehind (more reads as MaxWebhookBehind).
	Behind int64 `json:"behind"`
}

// MaxWebhookBehind caps WebhookDelivery.Behind, so that listing webhooks
// stays cheap however far one has fallen behind.
const MaxWebhookBehind = 1000

// WebhookDeliveries reads the delivery state of webhooks: what the API
// asks of the dispatcher.
type WebhookDeliveries interface {
	// WebhookDelivery returns w's state; w.Cursor is the stored cursor.
	WebhookDelivery(ctx context.Context, w Webhook) WebhookDelivery
}

// WebhookStore keeps webhooks and how far each has delivered.
type WebhookStore interface {
	// CreateWebhook inserts a webhook; its tenant must exist. Its cursor
	// starts at the newest stored event (w.Cursor is ignored).
	CreateWebhook(ctx context.Context, w Webhook) error
	// ListWebhooks returns a tenant's webhooks ("" for every tenant's).
	ListWebhooks(ctx context.Context, tenant string) ([]Webhook, error)
	// DeleteWebhook removes one of tenant's webhooks, or not_found.
	DeleteWebhook(ctx context.Context, tenant, id string) error
	// SetWebhookCursor records that events up to seq were delivered.
	SetWebhookCursor(ctx context.Context, id string, seq int64) error
}

// ValidateWebhookURL checks an endpoint address: http or https, a host,
// no credentials, and never a link-local or unspecified address (cloud
// metadata services live there).
func ValidateWebhookURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || len(raw) > 2048 {
		return Invalid("url", "must be an http or https URL")
	}
	if u.User != nil {
		return Invalid("url", "must not carry credentials; the signature authenticates deliveries")
	}
	host := strings.Trim(u.Hostname(), "[]")
	if ip := net.ParseIP(host); ip != nil && (ip.IsLinkLocalUnicast() || ip.IsLinkLocalMulticast() || ip.IsUnspecified() || ip.IsMulticast()) {
		return Invalid("url", "link-local, multicast and unspecified addresses are refused")
	}
	return nil
}
