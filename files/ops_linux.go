package files

import (
	"io"
	"os"
	"path"
	"sort"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor"
)

// Default modes of what the package creates.
const (
	defaultFileMode Mode = 0o644
	defaultDirMode  Mode = 0o755
)

// maxTreeDepth bounds the directory levels Remove and the tar walk go
// down (each level holds a file descriptor).
const maxTreeDepth = 256

// Open opens the regular file p for reading, following symlinks inside
// the sandbox. A directory, fifo, socket or device is a conflict: the
// open never blocks on a fifo a sandbox process made.
func (r *Root) Open(p string) (*os.File, Info, error) {
	p, err := Clean("path", p)
	if err != nil {
		return nil, Info{}, err
	}
	fd, err := r.open(p, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY)
	if err != nil {
		return nil, Info{}, err
	}
	info, err := fstatInfo(fd, p)
	if err == nil {
		err = wantFile(p, info.Type)
	}
	if err == nil {
		err = unix.SetNonblock(fd, false)
	}
	if err != nil {
		unix.Close(fd)
		return nil, Info{}, err
	}
	return os.NewFile(uintptr(fd), info.Name), info, nil
}

// wantFile refuses what is not a regular file.
func wantFile(p string, t Type) error {
	switch t {
	case TypeFile:
		return nil
	case TypeDir:
		return torpor.Errorf(torpor.EConflict, "%s is a directory: list it, or download it as a tar archive", p)
	}
	return torpor.Errorf(torpor.EConflict, "%s is a %s, not a regular file", p, t)
}

// Stat describes p without following a final symlink (lstat).
func (r *Root) Stat(p string) (Info, error) {
	p, err := Clean("path", p)
	if err != nil {
		return Info{}, err
	}
	if p == "/" {
		return fstatInfo(r.fd, p)
	}
	dirfd, name, err := r.parent("path", p)
	if err != nil {
		return Info{}, err
	}
	defer unix.Close(dirfd)
	return statAt(dirfd, name, p)
}

// Write replaces the file p with what src holds, atomically: the data goes
// to a temporary file in the same directory, renamed over p once
// complete, so p is never seen half-written and a failed write leaves
// nothing. Missing parent directories are made. A final symlink is
// replaced, not followed. A new file gets the owner of its directory; a
// replaced regular file keeps its owner, and its mode unless o.Mode says;
// o.Owner, when set, owns the file and the directories made for it.
func (r *Root) Write(p string, src io.Reader, o WriteOptions) (Info, error) {
	p, err := Clean("path", p)
	if err != nil {
		return Info{}, err
	}
	if p == "/" {
		return Info{}, torpor.Invalid("path", "cannot write the root directory")
	}
	dir, name := path.Split(p)
	dir = path.Clean(dir)
	dirfd, err := mkdirAll(r.fd, rel(dir), inRoot, defaultDirMode, o.Owner, dir)
	if err != nil {
		return Info{}, err
	}
	defer unix.Close(dirfd)
	if _, err := writeIn(dirfd, name, p, src, o.Mode, o.Owner, nil); err != nil {
		return Info{}, err
	}
	return statAt(dirfd, name, p)
}

// Mkdir makes the directory p (and, with o.Parents, its missing parents;
// an existing directory is then fine).
func (r *Root) Mkdir(p string, o MkdirOptions) (Info, error) {
	p, err := Clean("path", p)
	if err != nil {
		return Info{}, err
	}
	perm := defaultDirMode
	if o.Mode != nil {
		perm = *o.Mode
	}
	if o.Parents {
		fd, err := mkdirAll(r.fd, rel(p), inRoot, perm, o.Owner, p)
		if err != nil {
			return Info{}, err
		}
		defer unix.Close(fd)
		return fstatInfo(fd, p)
	}
	dirfd, name, err := r.parent("path", p)
	if err != nil {
		return Info{}, err
	}
	defer unix.Close(dirfd)
	if err := mkdirIn(dirfd, name, perm, o.Owner); err != nil {
		return Info{}, pathError(p, err)
	}
	return statAt(dirfd, name, p)
}

// Rename moves from to to. Neither final component is followed: a symlink
// is moved or replaced as itself. Without overwrite an existing to is a
// conflict.
func (r *Root) Rename(from, to string, overwrite bool) (Info, error) {
	from, err := Clean("from", from)
	if err != nil {
		return Info{}, err
	}
	if to, err = Clean("to", to); err != nil {
		return Info{}, err
	}
	ffd, fname, err := r.parent("from", from)
	if err != nil {
		return Info{}, err
	}
	defer unix.Close(ffd)
	tfd, tname, err := r.parent("to", to)
	if err != nil {
		return Info{}, err
	}
	defer unix.Close(tfd)
	var flags uint
	if !overwrite {
		flags = unix.RENAME_NOREPLACE
	}
	if err := unix.Renameat2(ffd, fname, tfd, tname, flags); err != nil {
		if err == unix.ENOENT {
			return Info{}, pathError(from, err)
		}
		return Info{}, pathError(to, err)
	}
	return statAt(tfd, tname, to)
}

// Remove deletes p; a directory only when empty, or with recursive. A
// symlink is removed itself, and none is followed inside a tree.
func (r *Root) Remove(p string, recursive bool) error {
	p, err := Clean("path", p)
	if err != nil {
		return err
	}
	dirfd, name, err := r.parent("path", p)
	if err != nil {
		return err
	}
	defer unix.Close(dirfd)
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return pathError(p, err)
	}
	if st.Mode&unix.S_IFMT != unix.S_IFDIR {
		return pathError(p, unix.Unlinkat(dirfd, name, 0))
	}
	if !recursive {
		err := unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
		if err == unix.ENOTEMPTY || err == unix.EEXIST {
			return torpor.Errorf(torpor.EConflict, "%s: the directory is not empty; remove it recursively", p)
		}
		return pathError(p, err)
	}
	return removeTree(dirfd, name, p, 0)
}

// removeTree removes the directory name in dirfd and everything in it.
func removeTree(dirfd int, name, p string, depth int) error {
	if depth > maxTreeDepth {
		return torpor.Errorf(torpor.EConflict, "%s: more than %d levels deep", p, maxTreeDepth)
	}
	fd, err := openat2(dirfd, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0, beneath)
	if err == unix.ELOOP || err == unix.ENOTDIR {
		// Swapped for something else meanwhile: remove that.
		return pathError(p, ignoreENOENT(unix.Unlinkat(dirfd, name, 0)))
	}
	if err != nil {
		return pathError(p, ignoreENOENT(err))
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	// A process in the sandbox may add entries meanwhile: a few passes.
	for pass := 0; ; pass++ {
		if err := emptyDir(f, fd, p, depth); err != nil {
			return err
		}
		err := unix.Unlinkat(dirfd, name, unix.AT_REMOVEDIR)
		if (err != unix.ENOTEMPTY && err != unix.EEXIST) || pass == 3 {
			return pathError(p, ignoreENOENT(err))
		}
		if _, err := f.Seek(0, io.SeekStart); err != nil {
			return pathError(p, err)
		}
	}
}

// emptyDir removes every entry of the directory f (whose descriptor is fd).
func emptyDir(f *os.File, fd int, p string, depth int) error {
	for {
		names, err := f.Readdirnames(1024)
		for _, n := range names {
			cp := path.Join(p, n)
			err := unix.Unlinkat(fd, n, 0)
			if err == unix.EISDIR {
				err = removeTree(fd, n, cp, depth+1)
			}
			if err = ignoreENOENT(err); err != nil {
				return pathError(cp, err)
			}
		}
		if err == io.EOF || len(names) == 0 {
			return nil
		}
		if err != nil {
			return pathError(p, err)
		}
	}
}

func ignoreENOENT(err error) error {
	if err == unix.ENOENT {
		return nil
	}
	return err
}

// List returns the entries below the directory p, depth levels down (1:
// its own entries), at most max of them (0: MaxEntries). Symlinks are
// listed, never followed; p itself may be one.
func (r *Root) List(p string, depth, max int) (Listing, error) {
	p, err := Clean("path", p)
	if err != nil {
		return Listing{}, err
	}
	if depth < 1 || depth > MaxDepth {
		return Listing{}, torpor.Invalid("depth", "must be between 1 and %d", MaxDepth)
	}
	if max <= 0 || max > MaxEntries {
		max = MaxEntries
	}
	fd, err := r.open(p, unix.O_RDONLY|unix.O_DIRECTORY)
	if err != nil {
		return Listing{}, err
	}
	l := &lister{max: max, out: Listing{Path: p, Entries: []Info{}}}
	if err := l.dir(fd, p, depth); err != nil {
		return Listing{}, err
	}
	return l.out, nil
}

type lister struct {
	max int
	out Listing
}

// dir lists the directory fd (which it closes) as the sandbox path p.
func (l *lister) dir(fd int, p string, depth int) error {
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	room := l.max - len(l.out.Entries)
	names, err := f.Readdirnames(room + 1)
	if err != nil && err != io.EOF {
		return pathError(p, err)
	}
	sort.Strings(names)
	for _, n := range names {
		if len(l.out.Entries) >= l.max {
			l.out.Truncated = true
			return nil
		}
		cp := path.Join(p, n)
		info, err := statAt(fd, n, cp)
		if torpor.IsCode(err, torpor.ENotFound) {
			continue // removed meanwhile
		}
		if err != nil {
			return err
		}
		l.out.Entries = append(l.out.Entries, info)
		if info.Type != TypeDir || depth <= 1 || reservedPrefix(cp) != "" {
			continue
		}
		child, err := openat2(fd, n, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0, beneath)
		if err != nil {
			continue // swapped for a symlink or removed meanwhile
		}
		if err := l.dir(child, cp, depth-1); err != nil {
			return err
		}
	}
	return nil
}
