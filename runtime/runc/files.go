package runc

import (
	"context"

	"github.com/torpor-dev/torpor"
)

var _ torpor.FileRoot = (*Runtime)(nil)

// RootFS returns the host path of the sandbox's overlay root, mounted
// while its instance exists (running or frozen). Only the disk is there:
// what the container mounts over it inside (/proc, /sys, /dev, /.torpor)
// is not; package files refuses those paths. Callers must resolve paths
// below it confined to it: the sandbox controls its contents.
func (r *Runtime) RootFS(ctx context.Context, ref torpor.InstanceRef) (string, error) {
	id, err := checkRef(ref)
	if err != nil {
		return "", err
	}
	dir := r.rootfsDir(id)
	if !mounted(dir) {
		return "", &torpor.Error{Code: torpor.EConflict, Reason: "state",
			Message: "the sandbox's root file system is not mounted (it is hibernated, stopped or gone); start it first"}
	}
	return dir, nil
}
