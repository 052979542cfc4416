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
