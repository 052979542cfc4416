package client

import (
	"context"
	"net/url"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/wire"
)

// CreateWebhook registers an endpoint for the caller's tenant's events. The
// result's Secret signs deliveries and is shown only once.
func (c *Client) CreateWebhook(ctx context.Context, endpoint string) (*wire.WebhookCreated, error) {
	var out wire.WebhookCreated
	return &out, c.do(ctx, "POST", "/v1/webhooks", nil, wire.WebhookRequest{URL: endpoint}, &out)
}

// Webhooks lists the caller's tenant's webhooks, each with its Delivery
// state when the server runs a dispatcher (a daemon does).
func (c *Client) Webhooks(ctx context.Context) ([]torpor.Webhook, error) {
	var out wire.WebhookList
	return out.Webhooks, c.do(ctx, "GET", "/v1/webhooks", nil, nil, &out)
}

// DeleteWebhook removes a webhook.
func (c *Client) DeleteWebhook(ctx context.Context, id string) error {
	return c.do(ctx, "DELETE", "/v1/webhooks/"+url.PathEscape(id), nil, nil, nil)
}
