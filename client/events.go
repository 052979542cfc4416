package client

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/wire"
)

// LatestEvent returns the cursor of the caller's newest event (of one
// sandbox when id is not empty), 0 when there is none: FollowEvents from
// it sees only what happens next.
func (c *Client) LatestEvent(ctx context.Context, id string) (int64, error) {
	p := "/v1/events"
	if id != "" {
		p = "/v1/sandboxes/" + url.PathEscape(id) + "/events"
	}
	var out wire.EventList
	err := c.do(ctx, "GET", p, url.Values{"latest": {"true"}}, nil, &out)
	return out.Next, err
}

// FollowEvents streams events after the cursor since (of one sandbox when
// id is not empty) to fn as they happen, until ctx ends, fn returns an
// error, or the connection drops. It returns the cursor of the last event
// passed to fn, so a caller can follow again from there and miss nothing.
func (c *Client) FollowEvents(ctx context.Context, id string, since int64, fn func(torpor.Event) error) (int64, error) {
	p := "/v1/events"
	if id != "" {
		p = "/v1/sandboxes/" + url.PathEscape(id) + "/events"
	}
	resp, err := c.send(ctx, "GET", p, url.Values{"since": {strconv.FormatInt(since, 10)}}, nil, "text/event-stream")
	if err != nil {
		return since, err
	}
	defer resp.Body.Close()
	err = readEvents(resp.Body, func(_ string, data []byte) (bool, error) {
		var ev torpor.Event
		if err := json.Unmarshal(data, &ev); err != nil {
			return true, fmt.Errorf("client: bad event: %w", err)
		}
		if err := fn(ev); err != nil {
			return true, err
		}
		since = ev.Seq
		return false, nil
	})
	if ctx.Err() != nil {
		return since, ctx.Err()
	}
	return since, err
}
