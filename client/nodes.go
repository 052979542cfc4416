package client

import (
	"context"
	"net/url"

	"github.com/torpor-dev/torpor/api/wire"
)

// Nodes lists the fleet's nodes (admin keys only; docs/fleet.md): each
// one's addresses, labels, state, capacity, what its sandboxes use and
// how many it holds in each state. The node that answered is Self.
func (c *Client) Nodes(ctx context.Context) ([]wire.Node, error) {
	var out wire.NodeList
	return out.Nodes, c.do(ctx, "GET", "/v1/nodes", nil, nil, &out)
}

// DrainNode asks node name to move its sandboxes to other nodes and take
// no new ones (admin keys only), and returns the node as it is then: the
// moves go on in the background; Nodes tells when it holds none.
func (c *Client) DrainNode(ctx context.Context, name string) (*wire.Node, error) {
	return c.nodeVerb(ctx, name, "drain")
}

// UndrainNode lets a draining node take sandboxes again (admin keys
// only).
func (c *Client) UndrainNode(ctx context.Context, name string) (*wire.Node, error) {
	return c.nodeVerb(ctx, name, "undrain")
}

func (c *Client) nodeVerb(ctx context.Context, name, verb string) (*wire.Node, error) {
	var n wire.Node
	if err := c.do(ctx, "POST", "/v1/nodes/"+url.PathEscape(name)+"/"+verb, nil, nil, &n); err != nil {
		return nil, err
	}
	return &n, nil
}
