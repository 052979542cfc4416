package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"

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
	var tmpl *torpor.Template
	err = readEvents(resp.Body, func(event string, data []byte) (bool, error) {
		switch event {
		case wire.EventProgress:
			var p wire.TemplateProgress
			if err := json.Unmarshal(data, &p); err != nil {
				return true, fmt.Errorf("client: bad progress event: %w", err)
			}
			if progress != nil {
				progress(p.Message)
			}
		case wire.EventTemplate:
			tmpl = &torpor.Template{}
			if err := json.Unmarshal(data, tmpl); err != nil {
				return true, fmt.Errorf("client: bad template event: %w", err)
			}
			return true, nil
		case wire.EventError:
			return true, streamError(data)
		}
		return false, nil
	})
	if err != nil {
		return nil, err
	}
	if tmpl == nil {
		return nil, errors.New("client: the template stream ended without a result")
	}
	return tmpl, nil
}

// streamError turns an "error" event of a stream into *torpor.Error.
func streamError(data []byte) error {
	var eb wire.ErrorBody
	_ = json.Unmarshal(data, &eb)
	d := eb.Error
	return &torpor.Error{Code: d.Code, Message: d.Message, Param: d.Param, Reason: d.Reason, State: d.State}
}
