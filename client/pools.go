package client

import (
	"context"
	"net/url"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/wire"
)

// Pools lists the node's warm pools (docs/pools.md): each template's pool
// size, ready members, hits and misses.
func (c *Client) Pools(ctx context.Context) ([]torpor.PoolStatus, error) {
	var out wire.PoolList
	return out.Pools, c.do(ctx, "GET", "/v1/pools", nil, nil, &out)
}

// SetPool sets a template's warm pool size (admin keys only); 0 turns the
// pool off. The server keeps it over a restart and refills the pool in
// the background. The pool's members reach the internet as they did
// before (none for a new pool); SetPoolInternet changes that.
func (c *Client) SetPool(ctx context.Context, template string, size int) (*torpor.PoolStatus, error) {
	return c.putPool(ctx, template, torpor.PoolRequest{Size: &size})
}

// SetPoolInternet is SetPool that also says whether the pool's members
// reach the internet: a create claims only from a pool booted as it asks
// (E2B's creates ask for the internet by default).
func (c *Client) SetPoolInternet(ctx context.Context, template string, size int, internet bool) (*torpor.PoolStatus, error) {
	return c.putPool(ctx, template, torpor.PoolRequest{Size: &size, AllowInternet: &internet})
}

func (c *Client) putPool(ctx context.Context, template string, req torpor.PoolRequest) (*torpor.PoolStatus, error) {
	var st torpor.PoolStatus
	return &st, c.do(ctx, "PUT", "/v1/pools/"+url.PathEscape(template), nil, req, &st)
}
