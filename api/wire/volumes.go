package wire

import "github.com/torpor-dev/torpor"

// VolumeRequest is the body of POST /v1/volumes.
type VolumeRequest struct {
	Name    string `json:"name"`
	SizeMiB int64  `json:"size_mib"`
}

// VolumeResize is the body of PATCH /v1/volumes/{name}: the new size,
// never smaller.
type VolumeResize struct {
	SizeMiB int64 `json:"size_mib"`
}

// VolumeList is the body of GET /v1/volumes.
type VolumeList struct {
	Volumes []torpor.Volume `json:"volumes"`
}
