package runc

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"golang.org/x/sys/unix"
)

// Cleanup removes what the runtime made on the host that no sandbox uses
// any more: its cgroup parent, in every hierarchy, when no sandbox's
// cgroup is left under it (a running or frozen sandbox keeps it; a
// hibernated one has none). The "torpor" cgroup above the default parents
// stays: every runtime on the host shares it. The daemon calls Cleanup
// when it stops; the runtime stays usable (a boot makes the parent
// again).
func (r *Runtime) Cleanup(ctx context.Context) error {
	err := r.cg.removeEmpty(r.parent)
	if !r.cg.anyLeft(r.parent) {
		// No sandbox runs or is paused, so none has a volume bound in:
		// their host mounts go too (the next start mounts them again).
		// With one left they stay, so that the next start finds them
		// mounted rather than mount an image a sandbox still uses twice.
		err = errors.Join(err, r.unmountVolumes())
	}
	return err
}

// anyLeft reports whether the cgroup rel is still there in any hierarchy
// (a sandbox of the runtime runs or is frozen in it).
func (c *cgroups) anyLeft(rel string) bool {
	for _, h := range c.hierarchies {
		if _, err := os.Stat(filepath.Join(h, rel)); err == nil {
			return true
		}
	}
	return false
}

// removeEmpty removes the cgroup rel from every hierarchy where it has no
// child cgroup and no process; elsewhere, and where it is missing, it
// stays as it is.
func (c *cgroups) removeEmpty(rel string) error {
	var errs []error
	for _, h := range c.hierarchies {
		err := unix.Rmdir(filepath.Join(h, rel))
		switch {
		case err == nil, errors.Is(err, unix.ENOENT), errors.Is(err, unix.EBUSY), errors.Is(err, unix.ENOTEMPTY):
		default:
			errs = append(errs, fmt.Errorf("runc: remove cgroup %s: %w", filepath.Join(h, rel), err))
		}
	}
	return errors.Join(errs...)
}
