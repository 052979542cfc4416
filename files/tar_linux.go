package files

import (
	"archive/tar"
	"errors"
	"io"
	"os"
	"path"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor"
)

// WriteTar writes p to w as a tar archive: a directory's contents with
// names relative to it (the directory itself is not an entry), or a
// single file under its base name. p itself may be a symlink inside the
// sandbox; below it no symlink is followed (each is archived as itself),
// fifos, sockets and devices are left out, and nothing under the
// sandbox's own mounts is included. The errors that come before anything
// is written (p missing, not a file or directory) are *torpor.Errors.
func (r *Root) WriteTar(w io.Writer, p string) error {
	p, err := Clean("path", p)
	if err != nil {
		return err
	}
	fd, err := r.open(p, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOCTTY)
	if err != nil {
		return err
	}
	info, err := fstatInfo(fd, p)
	if err == nil && info.Type != TypeDir && info.Type != TypeFile {
		err = torpor.Errorf(torpor.EConflict, "%s is a %s: only files and directories can be archived", p, info.Type)
	}
	if err != nil {
		unix.Close(fd)
		return err
	}
	t := &tarWriter{tw: tar.NewWriter(w)}
	if info.Type == TypeDir {
		err = t.dir(fd, p, "", 0)
	} else {
		err = t.file(fd, info, info.Name)
	}
	if err != nil {
		return err
	}
	return t.tw.Close()
}

type tarWriter struct {
	tw *tar.Writer
}

// dir archives the entries of the directory fd (which it closes), the
// sandbox path p, with names under prefix.
func (t *tarWriter) dir(fd int, p, prefix string, depth int) error {
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	if depth > maxTreeDepth {
		return torpor.Errorf(torpor.EConflict, "%s: more than %d levels deep", p, maxTreeDepth)
	}
	for {
		names, err := f.Readdirnames(256)
		for _, n := range names {
			if err := t.entry(fd, n, path.Join(p, n), prefix+n, depth); err != nil {
				return err
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

// entry archives n of the directory dirfd, never following it. What
// vanished or changed kind meanwhile is left out.
func (t *tarWriter) entry(dirfd int, n, p, name string, depth int) error {
	if reservedPrefix(p) != "" {
		return nil
	}
	info, err := statAt(dirfd, n, p)
	if err != nil {
		return ignoreNotFound(err)
	}
	switch info.Type {
	case TypeDir:
		child, err := openat2(dirfd, n, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW, 0, beneath)
		if err != nil {
			return nil
		}
		if err := t.tw.WriteHeader(header(info, name+"/", tar.TypeDir)); err != nil {
			unix.Close(child)
			return err
		}
		return t.dir(child, p, name+"/", depth+1)
	case TypeFile:
		child, err := openat2(dirfd, n, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_NOFOLLOW|unix.O_NOCTTY, 0, beneath)
		if err != nil {
			return nil
		}
		if info, err = fstatInfo(child, p); err != nil || info.Type != TypeFile {
			unix.Close(child)
			return nil
		}
		return t.file(child, info, name)
	case TypeSymlink:
		h := header(info, name, tar.TypeSymlink)
		h.Linkname = info.LinkTarget
		return t.tw.WriteHeader(h)
	}
	return nil // fifos, sockets, devices
}

// file archives the open regular file fd (which it closes). A file that
// shrinks while it is read is padded with zeros to the size in its header.
func (t *tarWriter) file(fd int, info Info, name string) error {
	f := os.NewFile(uintptr(fd), info.Path)
	defer f.Close()
	h := header(info, name, tar.TypeReg)
	h.Size = info.Size
	if err := t.tw.WriteHeader(h); err != nil {
		return err
	}
	n, err := io.CopyN(t.tw, f, info.Size)
	if err == io.EOF {
		_, err = io.CopyN(t.tw, zeros{}, info.Size-n)
	}
	return err
}

func header(info Info, name string, flag byte) *tar.Header {
	return &tar.Header{
		Typeflag: flag, Name: name, Mode: int64(info.Mode),
		Uid: int(info.UID), Gid: int(info.GID), ModTime: info.ModTime,
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

func ignoreNotFound(err error) error {
	if torpor.IsCode(err, torpor.ENotFound) {
		return nil
	}
	return err
}

// ExtractTar unpacks the tar archive src into the directory dir (made with
// its parents when missing), entry by entry, each file atomically.
//
// Every entry stays below dir: leading "/" is dropped, names that climb
// out with ".." are skipped, and no symlink is followed while extracting
// (a path through one is skipped), so an archive cannot write through a
// symlink it or the sandbox made. Symlinks are created as they are;
// hardlinks only to entries below dir; devices and fifos are skipped.
// Skipped entries are listed in the result. A malformed archive or a
// failed read stops the extraction with a *ReadError; what was extracted
// before stays.
func (r *Root) ExtractTar(dir string, src io.Reader) (TarResult, error) {
	dir, err := Clean("path", dir)
	if err != nil {
		return TarResult{}, err
	}
	base, err := mkdirAll(r.fd, rel(dir), inRoot, defaultDirMode, nil, dir)
	if err != nil {
		return TarResult{}, err
	}
	defer unix.Close(base)
	x := &extractor{base: base, dir: dir, res: TarResult{Skipped: []SkippedEntry{}}}
	tr := tar.NewReader(src)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return x.res, nil
		}
		if err != nil {
			return x.res, asReadError(err)
		}
		if err := x.entry(tr, h); err != nil {
			return x.res, err
		}
	}
}

func asReadError(err error) error {
	var re *ReadError
	if errors.As(err, &re) {
		return err
	}
	return &ReadError{Err: err}
}

type extractor struct {
	base int    // the target directory, O_PATH
	dir  string // its sandbox path
	res  TarResult
}

// entry extracts one entry, or records why it is skipped. Only failures
// that would fail every later entry too (the disk, the stream) stop the
// extraction.
func (x *extractor) entry(tr *tar.Reader, h *tar.Header) error {
	name, why := entryName(h.Name)
	if why == "" && name == "." && h.Typeflag != tar.TypeDir {
		why = "names the target directory itself"
	}
	p := path.Join(x.dir, name)
	if why == "" && len(p) > MaxPath {
		why = "the path is too long"
	}
	if why == "" && reservedPrefix(p) != "" {
		why = "under a mount of the sandbox's runtime"
	}
	if why != "" {
		x.res.skip(h.Name, why)
		return nil
	}
	var n int64
	var err error
	switch h.Typeflag {
	case tar.TypeDir:
		err = x.mkdir(name, p, Mode(h.Mode&MaxMode))
	case tar.TypeReg, tar.TypeGNUSparse, tar.TypeCont:
		n, err = x.file(tr, name, p, h)
	case tar.TypeSymlink:
		err = x.symlink(name, p, h.Linkname)
	case tar.TypeLink:
		err = x.link(name, p, h.Linkname)
	case tar.TypeXGlobalHeader:
		return nil
	default:
		x.res.skip(h.Name, "devices, fifos and other special files are not extracted")
		return nil
	}
	return x.done(h.Name, n, err)
}

// done counts an extracted entry, or records a skipped one, or returns
// the error that stops the extraction.
func (x *extractor) done(name string, n int64, err error) error {
	if err == nil {
		x.res.Entries++
		x.res.Bytes += n
		return nil
	}
	var te *torpor.Error
	var re *ReadError
	if errors.As(err, &re) || !errors.As(err, &te) || te.Reason == "no_space" || te.Code == torpor.EUnavailable {
		return err
	}
	x.res.skip(name, te.Message)
	return nil
}

// entryName cleans an entry's name into a path relative to the target
// directory, or says why it is refused.
func entryName(n string) (string, string) {
	if n == "" || strings.IndexByte(n, 0) >= 0 {
		return "", "an empty or malformed name"
	}
	c := path.Clean(strings.TrimLeft(n, "/"))
	if c == ".." || strings.HasPrefix(c, "../") {
		return "", "the name leaves the target directory"
	}
	return c, ""
}

// parent makes (when missing) and opens the directory that holds the
// entry name, following no symlink, and returns it with the last
// component.
func (x *extractor) parent(name, p string) (int, string, error) {
	dir, base := path.Split(name)
	fd, err := mkdirAll(x.base, path.Clean(dir), beneath, defaultDirMode, nil, path.Dir(p))
	return fd, base, err
}

func (x *extractor) mkdir(name, p string, mode Mode) error {
	if name == "." {
		return nil
	}
	dirfd, base, err := x.parent(name, p)
	if err != nil {
		return err
	}
	defer unix.Close(dirfd)
	err = mkdirIn(dirfd, base, mode, nil)
	if err == unix.EEXIST && isDirAt(dirfd, base) {
		err = nil // already there: its mode stays
	}
	return pathError(p, err)
}

func (x *extractor) file(tr *tar.Reader, name, p string, h *tar.Header) (int64, error) {
	dirfd, base, err := x.parent(name, p)
	if err != nil {
		return 0, err
	}
	defer unix.Close(dirfd)
	mode := Mode(h.Mode & MaxMode)
	return writeIn(dirfd, base, p, sourceReader{tr}, &mode, nil, &h.ModTime)
}

// symlink makes the symlink name → target as it is, replacing what is
// there (but not a directory).
func (x *extractor) symlink(name, p, target string) error {
	if target == "" || len(target) > MaxPath || strings.IndexByte(target, 0) >= 0 {
		return torpor.Invalid("path", "%s: an empty or malformed symlink target", p)
	}
	dirfd, base, err := x.parent(name, p)
	if err != nil {
		return err
	}
	defer unix.Close(dirfd)
	return placeNew(dirfd, base, p, func(tmp string) error { return unix.Symlinkat(target, dirfd, tmp) })
}

// link makes name a hardlink to the entry target, which must be below the
// target directory and reached through no symlink.
func (x *extractor) link(name, p, target string) error {
	tname, why := entryName(target)
	if why != "" || tname == "." {
		return torpor.Invalid("path", "%s: the link target %q leaves the target directory", p, target)
	}
	sdir, sbase := path.Split(tname)
	sfd, err := openat2(x.base, path.Clean(sdir), unix.O_PATH|unix.O_DIRECTORY, 0, beneath)
	if err != nil {
		return pathError(path.Join(x.dir, tname), err)
	}
	defer unix.Close(sfd)
	dirfd, base, err := x.parent(name, p)
	if err != nil {
		return err
	}
	defer unix.Close(dirfd)
	return placeNew(dirfd, base, p, func(tmp string) error { return unix.Linkat(sfd, sbase, dirfd, tmp, 0) })
}

// placeNew makes a file under a temporary name in dirfd with mk, then
// renames it over base, so that what was there is replaced, never
// followed.
func placeNew(dirfd int, base, p string, mk func(tmp string) error) error {
	tmp := ".torpor-" + torpor.NewID("", 12) + ".tmp"
	if err := mk(tmp); err != nil {
		return pathError(p, err)
	}
	var err error
	if isDirAt(dirfd, base) {
		err = unix.EISDIR
	} else {
		err = unix.Renameat(dirfd, tmp, dirfd, base)
	}
	if err != nil {
		_ = unix.Unlinkat(dirfd, tmp, 0)
		return pathError(p, err)
	}
	return nil
}

// isDirAt reports whether name in dirfd is a directory (not a symlink to one).
func isDirAt(dirfd int, name string) bool {
	var st unix.Stat_t
	return unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW) == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR
}
