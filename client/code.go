package client

import (
	"context"
	"net/url"

	"github.com/torpor-dev/torpor/api/wire"
)

// CodeRequest is a snippet for RunCode: language "python" or "sh".
type CodeRequest = wire.CodeRequest

// CodeResult is what a snippet did; an error it raised is in Error.
type CodeResult = wire.CodeResponse

// RunCode runs a snippet in the sandbox's persistent interpreter for its
// language: variables, imports and the working directory stay for the
// next snippet until the sandbox hibernates or restarts (Context then says
// "new").
func (c *Client) RunCode(ctx context.Context, id string, req CodeRequest) (*CodeResult, error) {
	var out CodeResult
	return &out, c.do(ctx, "POST", "/v1/sandboxes/"+url.PathEscape(id)+"/code", nil, req, &out)
}
