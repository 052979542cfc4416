package client

import (
	"context"
	"net/url"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/wire"
)

// volumeRef marks a volume where the files calls take a sandbox id (no
// sandbox id holds a ':').
const volumeRef = "volume:"

// Volume names the caller's tenant's volume name to the files calls
// (ReadFile, WriteFile, ListFiles, StatFile, Mkdir, Rename, RemoveFile,
// UploadTar, DownloadTar) in place of a sandbox id: they then act on the
// volume's files, without a sandbox, confined to it (docs/volumes.md).
//
//	c.WriteFile(ctx, client.Volume("data"), "/input.csv", f, nil)
func Volume(name string) string { return volumeRef + name }

// CreateVolume makes one of the caller's tenant's volumes, of sizeMiB.
func (c *Client) CreateVolume(ctx context.Context, name string, sizeMiB int64) (*torpor.Volume, error) {
	var out torpor.Volume
	return &out, c.do(ctx, "POST", "/v1/volumes", nil, wire.VolumeRequest{Name: name, SizeMiB: sizeMiB}, &out)
}

// ListVolumes lists the caller's tenant's volumes by name.
func (c *Client) ListVolumes(ctx context.Context) ([]torpor.Volume, error) {
	var out wire.VolumeList
	return out.Volumes, c.do(ctx, "GET", "/v1/volumes", nil, nil, &out)
}

// GetVolume returns one volume with the space it uses and the sandboxes
// that mount it.
func (c *Client) GetVolume(ctx context.Context, name string) (*torpor.Volume, error) {
	var out torpor.Volume
	return &out, c.do(ctx, "GET", "/v1/volumes/"+url.PathEscape(name), nil, nil, &out)
}

// ResizeVolume grows a volume to sizeMiB (volumes never shrink).
func (c *Client) ResizeVolume(ctx context.Context, name string, sizeMiB int64) (*torpor.Volume, error) {
	var out torpor.Volume
	return &out, c.do(ctx, "PATCH", "/v1/volumes/"+url.PathEscape(name), nil, wire.VolumeResize{SizeMiB: sizeMiB}, &out)
}

// DeleteVolume removes a volume and its files; a conflict while a
// sandbox that is not terminated mounts it.
func (c *Client) DeleteVolume(ctx context.Context, name string) error {
	return c.do(ctx, "DELETE", "/v1/volumes/"+url.PathEscape(name), nil, nil, nil)
}
