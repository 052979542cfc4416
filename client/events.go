package client

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/torpor-dev/torpor"
)

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
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue // id:, event:, comments and blank lines
		}
		var ev torpor.Event
		if err := json.Unmarshal([]byte(data), &ev); err != nil {
			return since, fmt.Errorf("client: bad event: %w", err)
		}
		if err := fn(ev); err != nil {
			return since, err
		}
		since = ev.Seq
	}
	if ctx.Err() != nil {
		return since, ctx.Err()
	}
	return since, sc.Err()
}
