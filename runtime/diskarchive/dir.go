package diskarchive

import (
	"archive/tar"
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// A tree is archived as it is on the host, for a runtime to use it again
// as it was (an overlay's upper directory): every entry keeps its owner,
// mode (set-id and sticky bits included), modification time and extended
// attributes (PAX SCHILY.xattr records), files with several links are
// hard links after the first, sparse files come back sparse, and
// overlayfs' whiteouts (character devices 0/0) and fifos are kept. Other
// devices and sockets are left out: a sandbox has its own /dev, and a
// socket means nothing without its process. Symbolic links are archived
// as themselves, never followed, on either side.

// Bounds of what ExtractDir accepts.
const (
	// maxPath bounds an entry's path (and a link's target): PATH_MAX.
	maxPath = 4095
	// maxEntries bounds a tree's entries.
	maxEntries = 1 << 24
	// maxXattrs bounds an entry's extended attributes, and maxXattrValue
	// the size of one (the kernel's limit).
	maxXattrs     = 256
	maxXattrValue = 64 << 10
)

// paxXattr starts the PAX records of extended attributes.
const paxXattr = "SCHILY.xattr."

// WriteDir writes the tree under dir, which nothing may change meanwhile,
// to w as a stream and returns the bytes it wrote to w.
func WriteDir(ctx context.Context, w io.Writer, dir string) (int64, error) {
	root, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	sw, err := newWriter(w, Dir, 0)
	if err != nil {
		unix.Close(root)
		return 0, err
	}
	bw := bufio.NewWriterSize(sw, maxRecord)
	t := &treeWriter{ctx: ctx, tw: tar.NewWriter(bw), links: map[[2]uint64]string{}}
	err = t.dir(root, dir, "", 0)
	if err == nil {
		err = t.tw.Close()
	}
	if err == nil {
		err = bw.Flush()
	}
	if err != nil {
		sw.abort()
		return sw.out.n, err
	}
	if err := sw.close(); err != nil {
		return sw.out.n, err
	}
	return sw.out.n, nil
}

type treeWriter struct {
	ctx context.Context
	tw  *tar.Writer
	// links names the first entry of each file with several links, by
	// device and inode.
	links map[[2]uint64]string
	n     int
}

// dir archives the directory fd (which it closes), the host path p, under
// the name prefix ("" for the tree's root, archived as "./").
func (t *treeWriter) dir(fd int, p, prefix string, depth int) error {
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	if depth > maxPath/2 {
		return fmt.Errorf("%s: the tree is too deep to archive", p)
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return &os.PathError{Op: "stat", Path: p, Err: err}
	}
	name := prefix
	if name == "" {
		name = "./"
	}
	h, err := t.header(&st, name, tar.TypeDir, fdXattrs(fd))
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	if err := t.tw.WriteHeader(h); err != nil {
		return err
	}
	names, err := f.Readdirnames(-1)
	if err != nil {
		return &os.PathError{Op: "readdir", Path: p, Err: err}
	}
	sort.Strings(names)
	for _, n := range names {
		if err := t.entry(fd, p+"/"+n, n, prefix+n, depth); err != nil {
			return err
		}
	}
	return nil
}

// entry archives n of the directory dirfd under name, never following it.
func (t *treeWriter) entry(dirfd int, p, n, name string, depth int) error {
	if t.n++; t.n%256 == 0 && t.ctx.Err() != nil {
		return t.ctx.Err()
	}
	if len(name) > maxPath {
		return fmt.Errorf("%s: a path of more than %d bytes cannot be archived", p, maxPath)
	}
	var st unix.Stat_t
	if err := unix.Fstatat(dirfd, n, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return &os.PathError{Op: "stat", Path: p, Err: err}
	}
	switch st.Mode & unix.S_IFMT {
	case unix.S_IFDIR:
		child, err := unix.Openat(dirfd, n, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err != nil {
			return &os.PathError{Op: "open", Path: p, Err: err}
		}
		return t.dir(child, p, name+"/", depth+1)
	case unix.S_IFREG:
		return t.file(dirfd, p, n, name, &st)
	case unix.S_IFLNK:
		target, err := readlinkAt(dirfd, n)
		if err != nil {
			return &os.PathError{Op: "readlink", Path: p, Err: err}
		}
		return t.special(dirfd, p, n, name, &st, tar.TypeSymlink, target)
	case unix.S_IFIFO:
		return t.special(dirfd, p, n, name, &st, tar.TypeFifo, "")
	case unix.S_IFCHR:
		if st.Rdev == 0 {
			return t.special(dirfd, p, n, name, &st, tar.TypeChar, "")
		}
	}
	return nil // other devices, sockets
}

func (t *treeWriter) file(dirfd int, p, n, name string, st *unix.Stat_t) error {
	key := [2]uint64{st.Dev, st.Ino}
	if st.Nlink > 1 {
		if first, ok := t.links[key]; ok {
			h, err := t.header(st, name, tar.TypeLink, nil)
			if err != nil {
				return fmt.Errorf("%s: %w", p, err)
			}
			h.Linkname = first
			return t.tw.WriteHeader(h)
		}
		t.links[key] = name
	}
	fd, err := unix.Openat(dirfd, n, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: p, Err: err}
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	h, err := t.header(st, name, tar.TypeReg, fdXattrs(fd))
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	h.Size = st.Size
	if err := t.tw.WriteHeader(h); err != nil {
		return err
	}
	if _, err := io.CopyN(t.tw, f, st.Size); err != nil {
		return fmt.Errorf("%s: %w (did it change while it was archived?)", p, err)
	}
	return nil
}

func (t *treeWriter) special(dirfd int, p, n, name string, st *unix.Stat_t, flag byte, target string) error {
	h, err := t.header(st, name, flag, pathXattrs(procPath(dirfd, n)))
	if err != nil {
		return fmt.Errorf("%s: %w", p, err)
	}
	h.Linkname = target
	return t.tw.WriteHeader(h)
}

// header is the tar header of an entry; xattrs is what listing its
// extended attributes returned.
func (t *treeWriter) header(st *unix.Stat_t, name string, flag byte, xattrs func() (map[string]string, error)) (*tar.Header, error) {
	h := &tar.Header{
		Typeflag: flag, Name: name, Mode: int64(st.Mode & 0o7777),
		Uid: int(st.Uid), Gid: int(st.Gid), ModTime: time.Unix(st.Mtim.Unix()),
		Format: tar.FormatPAX,
	}
	if xattrs != nil {
		x, err := xattrs()
		if err != nil {
			return nil, err
		}
		if len(x) > 0 {
			h.PAXRecords = make(map[string]string, len(x))
			for k, v := range x {
				h.PAXRecords[paxXattr+k] = v
			}
		}
	}
	return h, nil
}

// procPath names n of the directory dirfd through /proc, for the calls
// that take only a path (the l*xattr ones, which do not follow n itself).
func procPath(dirfd int, n string) string {
	return "/proc/self/fd/" + strconv.Itoa(dirfd) + "/" + n
}

func readlinkAt(dirfd int, n string) (string, error) {
	for size := 256; ; size *= 2 {
		buf := make([]byte, size)
		l, err := unix.Readlinkat(dirfd, n, buf)
		if err != nil {
			return "", err
		}
		if l < size {
			return string(buf[:l]), nil
		}
	}
}

// fdXattrs and pathXattrs return a function that lists the extended
// attributes of an open file, or of a path not followed.
func fdXattrs(fd int) func() (map[string]string, error) {
	return func() (map[string]string, error) {
		return readXattrs(func(b []byte) (int, error) { return unix.Flistxattr(fd, b) },
			func(k string, b []byte) (int, error) { return unix.Fgetxattr(fd, k, b) })
	}
}

func pathXattrs(p string) func() (map[string]string, error) {
	return func() (map[string]string, error) {
		return readXattrs(func(b []byte) (int, error) { return unix.Llistxattr(p, b) },
			func(k string, b []byte) (int, error) { return unix.Lgetxattr(p, k, b) })
	}
}

func readXattrs(list func([]byte) (int, error), get func(string, []byte) (int, error)) (map[string]string, error) {
	names, err := grow(list)
	if errors.Is(err, unix.ENOTSUP) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list extended attributes: %w", err)
	}
	out := map[string]string{}
	for _, k := range strings.Split(string(names), "\x00") {
		if k == "" {
			continue
		}
		v, err := grow(func(b []byte) (int, error) { return get(k, b) })
		if errors.Is(err, unix.ENODATA) {
			continue // removed meanwhile
		}
		if err != nil {
			return nil, fmt.Errorf("extended attribute %s: %w", k, err)
		}
		out[k] = string(v)
	}
	return out, nil
}

// grow calls f with a buffer large enough for what it returns.
func grow(f func([]byte) (int, error)) ([]byte, error) {
	for size := 256; ; size *= 4 {
		buf := make([]byte, size)
		n, err := f(buf)
		if errors.Is(err, unix.ERANGE) && size < 4*maxXattrValue {
			continue
		}
		if err != nil {
			return nil, err
		}
		return buf[:n], nil
	}
}

// ExtractDir makes, in dir (a new, empty directory that nothing else
// writes to), the tree the stream holds, as WriteDir read it.
//
// Nothing is written outside dir: names are relative and clean (no "..",
// no absolute path), every entry's parent is opened below dir without
// following any symbolic link (openat2 RESOLVE_BENEATH and
// RESOLVE_NO_SYMLINKS), an entry is never created over one that exists,
// hard links point at files below dir, and devices other than whiteouts,
// and any type of entry WriteDir does not write, are refused.
func (rd *Reader) ExtractDir(ctx context.Context, dir string) error {
	if rd.Kind != Dir {
		return bad("it holds an image, not a tree")
	}
	root, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return &os.PathError{Op: "open", Path: dir, Err: err}
	}
	x := &extractor{root: root, dir: dir, parentFD: -1}
	defer x.close()
	ts := &tarStream{rd: rd, ctx: ctx}
	tr := tar.NewReader(ts)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			if ts.err != nil && ts.err != io.EOF {
				return ts.err
			}
			return bad("its tree is not a valid tar archive: %v", err)
		}
		if x.entries++; x.entries > maxEntries {
			return bad("a tree of more than %d entries", maxEntries)
		}
		if err := x.entry(h, tr, ts); err != nil {
			return err
		}
	}
	if err := ts.ended(); err != nil {
		return err
	}
	return x.setDirs()
}

type extractor struct {
	root  int
	dir   string
	bytes int64
	// entries counts the entries so far.
	entries int
	// dirs are the directories whose mode and time are set at the end
	// (their children change the time; a mode without write permission
	// would keep them out).
	dirs []dirMeta
	// parentRel and parentFD cache the parent directory last opened.
	parentRel string
	parentFD  int
}

type dirMeta struct {
	rel  string
	mode uint32
	mt   time.Time
}

func (x *extractor) close() {
	if x.parentFD >= 0 {
		unix.Close(x.parentFD)
	}
	unix.Close(x.root)
}

// entryName cleans a tar name into a path relative to the tree ("" for
// its root), or refuses it.
func entryName(n string) (string, error) {
	if n == "" || len(n) > maxPath+1 || strings.IndexByte(n, 0) >= 0 {
		return "", bad("an entry with an empty or malformed name")
	}
	if strings.HasPrefix(n, "/") {
		return "", bad("entry %q has an absolute path", shorten(n))
	}
	for _, part := range strings.Split(strings.TrimSuffix(n, "/"), "/") {
		if part == ".." {
			return "", bad("entry %q leaves the tree", shorten(n))
		}
	}
	c := path.Clean(n)
	if c == "." {
		return "", nil
	}
	return c, nil
}

func shorten(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

// parent opens the directory rel below the root, following no symbolic
// link, and caches it.
func (x *extractor) parent(rel string) (int, error) {
	if rel == "." {
		return x.root, nil
	}
	if rel == x.parentRel && x.parentFD >= 0 {
		return x.parentFD, nil
	}
	fd, err := openBeneath(x.root, rel, unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		if errors.Is(err, unix.ENOENT) || errors.Is(err, unix.ENOTDIR) || errors.Is(err, unix.ELOOP) || errors.Is(err, unix.EXDEV) {
			return -1, bad("the directory %q of an entry is not in the tree before it (or is not a directory)", shorten(rel))
		}
		return -1, fmt.Errorf("open %s: %w", rel, err)
	}
	if x.parentFD >= 0 {
		unix.Close(x.parentFD)
	}
	x.parentRel, x.parentFD = rel, fd
	return fd, nil
}

// openBeneath opens rel below dirfd without following any symbolic link
// and without leaving it.
func openBeneath(dirfd int, rel string, flags int) (int, error) {
	how := unix.OpenHow{Flags: uint64(flags | unix.O_NOFOLLOW | unix.O_CLOEXEC),
		Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_NO_MAGICLINKS | unix.RESOLVE_NO_XDEV}
	for i := 0; ; i++ {
		fd, err := unix.Openat2(dirfd, rel, &how)
		if err == unix.EINTR || err == unix.EAGAIN && i < 100 {
			continue
		}
		return fd, err
	}
}

// entry makes one entry.
func (x *extractor) entry(h *tar.Header, body io.Reader, ts *tarStream) error {
	rel, err := entryName(h.Name)
	if err != nil {
		return err
	}
	xattrs, err := entryXattrs(h)
	if err != nil {
		return err
	}
	mode := uint32(h.Mode & 0o7777)
	if rel == "" {
		if h.Typeflag != tar.TypeDir {
			return bad("the tree's root is not a directory")
		}
		if err := x.meta(x.root, "", rel, h, xattrs); err != nil {
			return err
		}
		x.dirs = append(x.dirs, dirMeta{rel: ".", mode: mode, mt: h.ModTime})
		return nil
	}
	pfd, err := x.parent(path.Dir(rel))
	if err != nil {
		return err
	}
	base := path.Base(rel)
	var mk error
	switch h.Typeflag {
	case tar.TypeDir:
		mk = unix.Mkdirat(pfd, base, 0o700)
	case tar.TypeReg:
		if h.Size < 0 || h.Size > MaxSize-x.bytes {
			return bad("a tree of more than %d bytes of files", MaxSize)
		}
		x.bytes += h.Size
		if err := writeFile(pfd, base, rel, body, h.Size); err != nil {
			if ts.err != nil && ts.err != io.EOF {
				return ts.err
			}
			return err
		}
	case tar.TypeSymlink:
		if h.Linkname == "" || len(h.Linkname) > maxPath || strings.IndexByte(h.Linkname, 0) >= 0 {
			return bad("symbolic link %q has a bad target", shorten(rel))
		}
		// The target is text: it means something only inside the
		// sandbox, and nothing here follows it.
		mk = unix.Symlinkat(h.Linkname, pfd, base)
	case tar.TypeLink:
		return x.link(pfd, base, rel, h.Linkname)
	case tar.TypeFifo:
		mk = unix.Mknodat(pfd, base, unix.S_IFIFO|0o600, 0)
	case tar.TypeChar:
		if h.Devmajor != 0 || h.Devminor != 0 {
			return bad("entry %q is a device (only overlay whiteouts, 0/0, are allowed)", shorten(rel))
		}
		mk = unix.Mknodat(pfd, base, unix.S_IFCHR, 0)
	default:
		return bad("entry %q is of a type (%q) a disk's tree does not hold", shorten(rel), h.Typeflag)
	}
	if errors.Is(mk, unix.EEXIST) {
		return bad("entry %q comes twice", shorten(rel))
	}
	if mk != nil {
		return fmt.Errorf("create %s: %w", rel, mk)
	}
	if err := x.meta(pfd, base, rel, h, xattrs); err != nil {
		return err
	}
	switch h.Typeflag {
	case tar.TypeDir:
		x.dirs = append(x.dirs, dirMeta{rel: rel, mode: mode, mt: h.ModTime})
	case tar.TypeSymlink:
		// Symbolic links have no mode of their own.
	default:
		if err := unix.Fchmodat(pfd, base, mode, 0); err != nil {
			return fmt.Errorf("chmod %s: %w", rel, err)
		}
	}
	if h.Typeflag != tar.TypeDir {
		return setTimes(pfd, base, rel, h.ModTime)
	}
	return nil
}

// meta gives the entry base of pfd (the root itself when base is "") its
// owner and extended attributes. Ownership comes first: a chown clears
// security.capability.
func (x *extractor) meta(pfd int, base, rel string, h *tar.Header, xattrs map[string]string) error {
	var err error
	if base == "" {
		err = unix.Fchown(pfd, h.Uid, h.Gid)
	} else {
		err = unix.Fchownat(pfd, base, h.Uid, h.Gid, unix.AT_SYMLINK_NOFOLLOW)
	}
	if err != nil {
		return fmt.Errorf("chown %s: %w", rel, err)
	}
	for k, v := range xattrs {
		if base == "" {
			err = unix.Fsetxattr(pfd, k, []byte(v), 0)
		} else {
			err = unix.Lsetxattr(procPath(pfd, base), k, []byte(v), 0)
		}
		if err != nil {
			return fmt.Errorf("set extended attribute %s of %s: %w", k, rel, err)
		}
	}
	return nil
}

// entryXattrs returns the entry's extended attributes, refusing names and
// sizes no file system takes.
func entryXattrs(h *tar.Header) (map[string]string, error) {
	var out map[string]string
	for k, v := range h.PAXRecords {
		name, ok := strings.CutPrefix(k, paxXattr)
		if !ok {
			continue
		}
		allowed := false
		for _, ns := range []string{"user.", "trusted.", "security.", "system.posix_acl_"} {
			allowed = allowed || strings.HasPrefix(name, ns) && len(name) > len(ns)
		}
		if !allowed || len(name) > 255 || strings.IndexByte(name, 0) >= 0 || len(v) > maxXattrValue {
			return nil, bad("entry %q has a bad extended attribute %q", shorten(h.Name), shorten(name))
		}
		if out == nil {
			out = map[string]string{}
		}
		if len(out) >= maxXattrs {
			return nil, bad("entry %q has more than %d extended attributes", shorten(h.Name), maxXattrs)
		}
		out[name] = v
	}
	return out, nil
}

// writeFile makes the regular file base of pfd with size bytes of r,
// leaving holes where r has chunks of zeros.
func writeFile(pfd int, base, rel string, r io.Reader, size int64) error {
	fd, err := unix.Openat(pfd, base, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if errors.Is(err, unix.EEXIST) {
		return bad("entry %q comes twice", shorten(rel))
	}
	if err != nil {
		return fmt.Errorf("create %s: %w", rel, err)
	}
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	buf := make([]byte, min(size, 1<<20))
	for off := int64(0); off < size; {
		n, err := io.ReadFull(r, buf[:min(int64(len(buf)), size-off)])
		if n > 0 && !allZero(buf[:n]) {
			if _, werr := f.WriteAt(buf[:n], off); werr != nil {
				return fmt.Errorf("write %s: %w", rel, werr)
			}
		}
		off += int64(n)
		if err != nil {
			if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
				return bad("file %q is cut short", shorten(rel))
			}
			return err
		}
	}
	return nil
}

// link makes base of pfd a hard link to target, an earlier entry that is
// not a directory.
func (x *extractor) link(pfd int, base, rel, target string) error {
	t, err := entryName(target)
	if err != nil {
		return err
	}
	if t == "" {
		return bad("hard link %q points at the tree's root", shorten(rel))
	}
	tfd, err := openBeneath(x.root, path.Dir(t), unix.O_PATH|unix.O_DIRECTORY)
	if err != nil {
		return bad("hard link %q points at %q, which is not in the tree before it", shorten(rel), shorten(t))
	}
	defer unix.Close(tfd)
	var st unix.Stat_t
	if err := unix.Fstatat(tfd, path.Base(t), &st, unix.AT_SYMLINK_NOFOLLOW); err != nil || st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return bad("hard link %q points at %q, which is not a file in the tree before it", shorten(rel), shorten(t))
	}
	err = unix.Linkat(tfd, path.Base(t), pfd, base, 0)
	if errors.Is(err, unix.EEXIST) {
		return bad("entry %q comes twice", shorten(rel))
	}
	if err != nil {
		return fmt.Errorf("link %s: %w", rel, err)
	}
	return nil
}

func setTimes(pfd int, base, rel string, mt time.Time) error {
	ts := []unix.Timespec{unix.NsecToTimespec(mt.UnixNano()), unix.NsecToTimespec(mt.UnixNano())}
	if err := unix.UtimesNanoAt(pfd, base, ts, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set the times of %s: %w", rel, err)
	}
	return nil
}

// setDirs sets the directories' modes and times, deepest first.
func (x *extractor) setDirs() error {
	for i := len(x.dirs) - 1; i >= 0; i-- {
		d := x.dirs[i]
		fd := x.root
		if d.rel != "." {
			var err error
			if fd, err = openBeneath(x.root, d.rel, unix.O_RDONLY|unix.O_DIRECTORY); err != nil {
				return fmt.Errorf("open %s: %w", d.rel, err)
			}
		}
		err := unix.Fchmod(fd, d.mode)
		if err == nil {
			ts := []unix.Timespec{unix.NsecToTimespec(d.mt.UnixNano()), unix.NsecToTimespec(d.mt.UnixNano())}
			err = unix.UtimesNanoAt(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(fd), ts, 0)
		}
		if fd != x.root {
			unix.Close(fd)
		}
		if err != nil {
			return fmt.Errorf("%s: %w", d.rel, err)
		}
	}
	return nil
}
