package client

import (
	"context"
	"net/url"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/wire"
)

// SetSecret creates or rotates the caller's tenant's secret name with
// value (text) and returns its metadata: Version 1 for a new secret, one
// more on each rotation. Sandboxes that use it get the new value at their
// next boot and in their next exec.
func (c *Client) SetSecret(ctx context.Context, name, value string) (*torpor.Secret, error) {
	var out torpor.Secret
	return &out, c.do(ctx, "PUT", "/v1/secrets/"+url.PathEscape(name), nil, wire.SecretRequest{Value: value}, &out)
}

// ListSecrets lists the caller's tenant's secrets by name, without values.
func (c *Client) ListSecrets(ctx context.Context) ([]torpor.Secret, error) {
	var out wire.SecretList
	return out.Secrets, c.do(ctx, "GET", "/v1/secrets", nil, nil, &out)
}

// GetSecret returns one secret's metadata (never its value).
func (c *Client) GetSecret(ctx context.Context, name string) (*torpor.Secret, error) {
	var out torpor.Secret
	return &out, c.do(ctx, "GET", "/v1/secrets/"+url.PathEscape(name), nil, nil, &out)
}

// DeleteSecret removes a secret.
func (c *Client) DeleteSecret(ctx context.Context, name string) error {
	return c.do(ctx, "DELETE", "/v1/secrets/"+url.PathEscape(name), nil, nil, nil)
}
