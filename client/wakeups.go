package client

import (
	"context"
	"net/url"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/wire"
)

// Wakeups returns a sandbox's scheduled wake-ups (docs/schedule.md).
func (c *Client) Wakeups(ctx context.Context, id string) ([]torpor.Wakeup, error) {
	var out wire.WakeupList
	return out.Wakeups, c.do(ctx, "GET", wakeupsPath(id), nil, nil, &out)
}

// SetWakeups replaces a sandbox's wake-ups with specs (none removes them
// all) and returns them as the server keeps them.
func (c *Client) SetWakeups(ctx context.Context, id string, specs []torpor.WakeupSpec) ([]torpor.Wakeup, error) {
	if specs == nil {
		specs = []torpor.WakeupSpec{}
	}
	var out wire.WakeupList
	return out.Wakeups, c.do(ctx, "PUT", wakeupsPath(id), nil, wire.WakeupsRequest{Wakeups: specs}, &out)
}

// AddWakeup adds one wake-up to a sandbox and returns it, with its id and
// its first time.
func (c *Client) AddWakeup(ctx context.Context, id string, spec torpor.WakeupSpec) (*torpor.Wakeup, error) {
	var out torpor.Wakeup
	return &out, c.do(ctx, "POST", wakeupsPath(id), nil, spec, &out)
}

// ClearWakeups removes every wake-up of a sandbox.
func (c *Client) ClearWakeups(ctx context.Context, id string) error {
	return c.do(ctx, "DELETE", wakeupsPath(id), nil, nil, nil)
}

// RemoveWakeup removes one of a sandbox's wake-ups by its id.
func (c *Client) RemoveWakeup(ctx context.Context, id, wakeup string) error {
	return c.do(ctx, "DELETE", wakeupsPath(id)+"/"+url.PathEscape(wakeup), nil, nil, nil)
}

func wakeupsPath(id string) string { return "/v1/sandboxes/" + url.PathEscape(id) + "/wakeups" }
