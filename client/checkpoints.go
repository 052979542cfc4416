package client

import (
	"context"
	"net/url"

	"github.com/torpor-dev/torpor"
)

// Checkpoints, fork and restore (docs/fork.md).

// CreateCheckpoint saves a named checkpoint of a sandbox's disk.
func (c *Client) CreateCheckpoint(ctx context.Context, id, name string) (*torpor.CheckpointInfo, error) {
	var cp torpor.CheckpointInfo
	return &cp, c.do(ctx, "POST", "/v1/sandboxes/"+url.PathEscape(id)+"/checkpoints", nil, map[string]string{"name": name}, &cp)
}

// Checkpoints lists a sandbox's checkpoints.
func (c *Client) Checkpoints(ctx context.Context, id string) ([]torpor.CheckpointInfo, error) {
	var out struct {
		Checkpoints []torpor.CheckpointInfo `json:"checkpoints"`
	}
	return out.Checkpoints, c.do(ctx, "GET", "/v1/sandboxes/"+url.PathEscape(id)+"/checkpoints", nil, nil, &out)
}

// Checkpoint returns one of a sandbox's checkpoints.
func (c *Client) Checkpoint(ctx context.Context, id, name string) (*torpor.CheckpointInfo, error) {
	var cp torpor.CheckpointInfo
	return &cp, c.do(ctx, "GET", "/v1/sandboxes/"+url.PathEscape(id)+"/checkpoints/"+url.PathEscape(name), nil, nil, &cp)
}

// DeleteCheckpoint removes one of a sandbox's checkpoints.
func (c *Client) DeleteCheckpoint(ctx context.Context, id, name string) error {
	return c.do(ctx, "DELETE", "/v1/sandboxes/"+url.PathEscape(id)+"/checkpoints/"+url.PathEscape(name), nil, nil, nil)
}

// Fork makes req.Count new sandboxes from a sandbox (its checkpoint
// req.Checkpoint, or its disk as it is), all or none.
func (c *Client) Fork(ctx context.Context, id string, req torpor.ForkRequest) (*torpor.ForkResult, error) {
	var res torpor.ForkResult
	return &res, c.do(ctx, "POST", "/v1/sandboxes/"+url.PathEscape(id)+"/fork", nil, req, &res)
}

// Restore brings a sandbox back to its checkpoint name.
func (c *Client) Restore(ctx context.Context, id, checkpoint string) (*torpor.Sandbox, error) {
	var sb torpor.Sandbox
	return &sb, c.do(ctx, "POST", "/v1/sandboxes/"+url.PathEscape(id)+"/restore", nil, map[string]string{"checkpoint": checkpoint}, &sb)
}
