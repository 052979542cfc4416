package client

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/wire"
)

// Template returns one template.
func (c *Client) Template(ctx context.Context, name string) (*torpor.Template, error) {
	var t torpor.Template
	return &t, c.do(ctx, "GET", "/v1/templates/"+url.PathEscape(name), nil, nil, &t)
}

// DeleteTemplate removes a template (admin keys only). A template that a
// sandbox which is not terminated uses is a conflict naming it.
func (c *Client) DeleteTemplate(ctx context.Context, name string) error {
	return c.do(ctx, "DELETE", "/v1/templates/"+url.PathEscape(name), nil, nil, nil)
}

// ImportTemplate makes a template from a registry image or a server-local
// OCI layout, docker archive or root filesystem (admin keys only),
// passing each line of progress to progress (nil drops them).
func (c *Client) ImportTemplate(ctx context.Context, req torpor.TemplateImportRequest, progress func(string)) (*torpor.Template, error) {
	return c.makeTemplate(ctx, "/v1/templates", req, progress)
}

// BuildTemplate builds a Debian template with debootstrap (admin keys
// only), passing each line of progress to progress (nil drops them).
func (c *Client) BuildTemplate(ctx context.Context, req torpor.TemplateBuildRequest, progress func(string)) (*torpor.Template, error) {
	return c.makeTemplate(ctx, "/v1/templates/build", req, progress)
}

// makeTemplate posts req and reads the stream of progress events up to
// the template or the error.
func (c *Client) makeTemplate(ctx context.Context, path string, req any, progress func(string)) (*torpor.Template, error) {
	resp, err := c.send(ctx, "POST", path, nil, req, "text/event-stream")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var event string
	for sc.Scan() {
		line := sc.Text()
		if e, ok := strings.CutPrefix(line, "event: "); ok {
			event = e
			continue
		}
		data, ok := strings.CutPrefix(line, "data: ")
		if !ok {
			continue
		}
		switch event {
		case wire.EventProgress:
			var p wire.TemplateProgress
			if err := json.Unmarshal([]byte(data), &p); err != nil {
				return nil, fmt.Errorf("client: bad progress event: %w", err)
			}
			if progress != nil {
				progress(p.Message)
			}
		case wire.EventTemplate:
			var t torpor.Template
			if err := json.Unmarshal([]byte(data), &t); err != nil {
				return nil, fmt.Errorf("client: bad template event: %w", err)
			}
			return &t, nil
		case wire.EventError:
			var eb wire.ErrorBody
			_ = json.Unmarshal([]byte(data), &eb)
			d := eb.Error
			return nil, &torpor.Error{Code: d.Code, Message: d.Message, Param: d.Param, Reason: d.Reason}
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return nil, errors.New("client: the template stream ended without a result")
}
