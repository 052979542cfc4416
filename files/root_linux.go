package files

import (
	"errors"
	"fmt"
	"path"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor"
)

// Resolution rules for openat2.
const (
	// inRoot resolves a sandbox path as a chroot would: "..", absolute
	// and climbing symlinks stay inside the root.
	inRoot = unix.RESOLVE_IN_ROOT | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV
	// beneath resolves a path below a directory without following any
	// symlink at all: for walking trees and extracting archives.
	beneath = unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV
)

// Root is a sandbox's root directory, opened once. Every path given to its
// methods is resolved inside it. A Root is safe for concurrent use.
type Root struct {
	fd int
}

// OpenRoot opens dir (a trusted host path) as a Root.
func OpenRoot(dir string) (*Root, error) {
	fd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("files: open root: %w", err)
	}
	return &Root{fd: fd}, nil
}

// Close releases the root.
func (r *Root) Close() error { return unix.Close(r.fd) }

// openat2 opens p below dirfd by the resolution rules res, retrying the
// EAGAIN that the kernel returns when a rename raced with the lookup.
func openat2(dirfd int, p string, flags int, mode uint32, res uint64) (int, error) {
	how := unix.OpenHow{Flags: uint64(flags | unix.O_CLOEXEC), Mode: uint64(mode), Resolve: res}
	for i := 0; ; i++ {
		fd, err := unix.Openat2(dirfd, p, &how)
		if err == unix.EINTR || err == unix.EAGAIN && i < 100 {
			continue
		}
		return fd, err
	}
}

// open resolves the sandbox path p (clean, absolute) inside the root,
// following symlinks as the sandbox would see them.
func (r *Root) open(p string, flags int) (int, error) {
	fd, err := openat2(r.fd, rel(p), flags, 0, inRoot)
	if err != nil {
		return -1, pathError(p, err)
	}
	return fd, nil
}

// parent opens the directory that holds p's last component (O_PATH) and
// returns it with that name. The root itself has no parent.
func (r *Root) parent(param, p string) (int, string, error) {
	if p == "/" {
		return -1, "", torpor.Invalid(param, "this cannot be done to the root directory")
	}
	dir, name := path.Split(p)
	fd, err := r.open(path.Clean(dir), unix.O_PATH|unix.O_DIRECTORY)
	return fd, name, err
}

// mkdirAll makes the directory p below base (relative, "." for base
// itself) and its missing parents, one component at a time, each resolved
// from base by res; it returns the directory opened O_PATH. New
// directories get perm and owner (nil: the owner of the directory they
// are made in). shown is how p is named in errors.
func mkdirAll(base int, p string, res uint64, perm Mode, owner *Owner, shown string) (int, error) {
	fd, err := openat2(base, p, unix.O_PATH|unix.O_DIRECTORY, 0, res)
	if err != unix.ENOENT {
		return fd, pathError(shown, err)
	}
	cur, err := openat2(base, ".", unix.O_PATH|unix.O_DIRECTORY, 0, res)
	if err != nil {
		return -1, pathError(shown, err)
	}
	prefix := ""
	for _, part := range strings.Split(p, "/") {
		prefix = path.Join(prefix, part)
		next, err := openat2(base, prefix, unix.O_PATH|unix.O_DIRECTORY, 0, res)
		if err == unix.ENOENT {
			if err = mkdirIn(cur, part, perm, owner); err == nil || err == unix.EEXIST {
				next, err = openat2(base, prefix, unix.O_PATH|unix.O_DIRECTORY, 0, res)
			}
		}
		unix.Close(cur)
		if err != nil {
			return -1, pathError(shown, err)
		}
		cur = next
	}
	return cur, nil
}

// mkdirIn makes directory name in dirfd with mode perm (umask aside) and
// owner, or the owner of dirfd when owner is nil.
func mkdirIn(dirfd int, name string, perm Mode, owner *Owner) error {
	if err := unix.Mkdirat(dirfd, name, 0o700); err != nil {
		return err
	}
	fd, err := openat2(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0, beneath)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return chownLike(fd, dirfd, perm, owner)
}

// chownLike gives fd owner, or the owner of the directory dirfd when
// owner is nil, then mode perm (after the owner: chown clears setuid and
// setgid).
func chownLike(fd, dirfd int, perm Mode, owner *Owner) error {
	if owner == nil {
		var st unix.Stat_t
		if err := unix.Fstat(dirfd, &st); err != nil {
			return err
		}
		owner = &Owner{UID: st.Uid, GID: st.Gid}
	}
	if err := unix.Fchown(fd, int(owner.UID), int(owner.GID)); err != nil {
		return err
	}
	return unix.Fchmod(fd, uint32(perm))
}

// pathError turns a system call's error about the sandbox path p into an
// *torpor.Error a caller can act on. Unknown errors are wrapped as
// internal; none names a host path. A nil err is nil.
func pathError(p string, err error) error {
	if err == nil {
		return nil
	}
	var te *torpor.Error
	if errors.As(err, &te) {
		return err
	}
	var errno unix.Errno
	if !errors.As(err, &errno) {
		return fmt.Errorf("files: %s: %w", p, err)
	}
	code, what := errnoKind(errno)
	if code == "" {
		return fmt.Errorf("files: %s: %w", p, err)
	}
	e := &torpor.Error{Code: code, Message: p + ": " + what}
	switch errno {
	case unix.EINVAL, unix.ENAMETOOLONG:
		e.Param = "path"
	case unix.ENOSPC, unix.EDQUOT:
		e.Reason = "no_space"
	}
	return e
}

// errnoKind says what an errno means to a caller; "" for an internal
// failure.
func errnoKind(errno unix.Errno) (torpor.ErrorCode, string) {
	switch errno {
	case unix.ENOENT:
		return torpor.ENotFound, "no such file or directory"
	case unix.ENOTDIR:
		return torpor.EConflict, "not a directory"
	case unix.EISDIR:
		return torpor.EConflict, "is a directory"
	case unix.EEXIST:
		return torpor.EConflict, "already exists"
	case unix.ENOTEMPTY:
		return torpor.EConflict, "the directory is not empty"
	case unix.ELOOP:
		return torpor.EConflict, "a symbolic link is in the way (a loop, or a link where none may be followed)"
	case unix.EXDEV:
		return torpor.EConflict, "crosses a mount or a layer of the sandbox's disk (a directory of the template cannot be renamed; copy it instead)"
	case unix.ENAMETOOLONG:
		return torpor.EInvalid, "a name in the path is too long"
	case unix.EINVAL:
		return torpor.EInvalid, "invalid for this file (e.g. moving a directory into itself)"
	case unix.EACCES, unix.EPERM:
		return torpor.EForbidden, "permission denied"
	case unix.ENOSPC, unix.EDQUOT:
		return torpor.EConflict, "the sandbox's disk is full"
	case unix.EROFS:
		return torpor.EConflict, "read-only file system"
	case unix.ETXTBSY:
		return torpor.EConflict, "the file is being executed"
	case unix.EMLINK:
		return torpor.EConflict, "too many links"
	case unix.EFBIG:
		return torpor.EConflict, "the file is too large"
	case unix.EAGAIN:
		return torpor.EUnavailable, "the file system changed during the call; try again"
	}
	return "", ""
}
