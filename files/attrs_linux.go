package files

import (
	"strconv"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor"
)

// SetAttrs sets the mode and the owner of p (either may be nil, leaving
// it as it is) and returns p's info after. p itself is changed, a
// symlink included (whose mode cannot change: a mode for one is refused).
func (r *Root) SetAttrs(p string, mode *Mode, owner *Owner) (Info, error) {
	p, err := Clean("path", p)
	if err != nil {
		return Info{}, err
	}
	fd, err := r.open(p, unix.O_PATH|unix.O_NOFOLLOW)
	if err != nil {
		return Info{}, err
	}
	defer unix.Close(fd)
	if owner != nil {
		if err := unix.Fchownat(fd, "", int(owner.UID), int(owner.GID), unix.AT_EMPTY_PATH|unix.AT_SYMLINK_NOFOLLOW); err != nil {
			return Info{}, pathError(p, err)
		}
	}
	if mode != nil {
		info, err := fstatInfo(fd, p)
		if err != nil {
			return Info{}, err
		}
		if info.Type == TypeSymlink {
			return Info{}, torpor.Invalid("mode", "%s is a symlink, whose mode cannot change", p)
		}
		// An O_PATH descriptor takes no fchmod; its /proc link names the
		// very file it holds, whatever happened to the path since.
		if err := unix.Chmod("/proc/self/fd/"+strconv.Itoa(fd), uint32(*mode)); err != nil {
			return Info{}, pathError(p, err)
		}
	}
	return fstatInfo(fd, p)
}
