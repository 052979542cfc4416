package template

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor"
)

// Limits bound what an import may unpack, so that a hostile image (a tar
// bomb) cannot fill the disk or the inode table.
type Limits struct {
	// MaxLayerBytes bounds the file contents of one layer.
	MaxLayerBytes int64
	// MaxImageBytes bounds the file contents of all the layers of an image.
	MaxImageBytes int64
	// MaxEntries bounds the entries of one layer.
	MaxEntries int
	// MaxLayers bounds the layers of an image.
	MaxLayers int
}

// DefaultLimits are the limits of a Manager whose Config sets none.
var DefaultLimits = Limits{MaxLayerBytes: 32 << 30, MaxImageBytes: 64 << 30, MaxEntries: 2 << 20, MaxLayers: 128}

// OCI whiteout names (image-spec layer.md).
const (
	whiteoutPrefix = ".wh."
	whiteoutMeta   = ".wh..wh."
	whiteoutOpaque = ".wh..wh..opq"
)

// Overlayfs' form of an opaque directory: this xattr on it. (A deleted
// entry is a character device 0/0.)
const (
	opaqueXattr = "trusted.overlay.opaque"
	maxNameLen  = 4096
)

// badLayer returns the error for a layer whose contents torpor refuses.
func badLayer(format string, args ...any) error {
	return torpor.Invalid("source", "bad image layer: "+format, args...)
}

// unpackStats says what unpack wrote.
type unpackStats struct {
	Bytes   int64
	Entries int
}

// unpacker writes one layer's tar stream below a root directory. Every
// path is resolved one component at a time with O_NOFOLLOW from the
// root's file descriptor, and every entry is created with *at system
// calls relative to its parent's descriptor, so nothing can be written
// outside the root: names with ".." or a leading "/" are refused, a
// symbolic link is never followed as a parent, and hard links must point
// at a file already in the layer.
type unpacker struct {
	root  int
	lim   Limits
	stats unpackStats
	// budget is what is left of the image's byte limit.
	budget *int64
	// dirTimes are set at the end: adding entries changes a directory's
	// modification time.
	dirTimes []dirTime
	// parent caches the descriptor of the last parent directory opened.
	parentRel string
	parentFD  int
}

type dirTime struct {
	rel  string
	hdr  *tar.Header
	root bool
}

// unpack extracts the tar stream r into dir, an existing empty directory,
// converting OCI whiteouts to overlayfs' form. Content the layer may not
// have is an invalid_argument error; I/O failures are plain errors.
func unpack(ctx context.Context, r io.Reader, dir string, lim Limits, budget *int64) (unpackStats, error) {
	root, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return unpackStats{}, fmt.Errorf("open %s: %w", dir, err)
	}
	u := &unpacker{root: root, lim: lim, budget: budget, parentFD: -1}
	defer u.close()
	tr := tar.NewReader(r)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			if ctx.Err() != nil {
				return u.stats, ctx.Err()
			}
			return u.stats, badLayer("not a valid tar stream: %v", err)
		}
		if u.stats.Entries++; u.stats.Entries > lim.MaxEntries {
			return u.stats, badLayer("more than %d entries", lim.MaxEntries)
		}
		if u.stats.Entries%256 == 0 && ctx.Err() != nil {
			return u.stats, ctx.Err()
		}
		if err := u.entry(hdr, tr); err != nil {
			return u.stats, err
		}
	}
	return u.stats, u.setDirTimes()
}

func (u *unpacker) close() {
	if u.parentFD >= 0 {
		unix.Close(u.parentFD)
	}
	unix.Close(u.root)
}

// cleanName returns the layer-relative path of a tar entry ("" for the
// root itself), refusing names that could leave the layer.
func cleanName(name string) (string, error) {
	if len(name) > maxNameLen || strings.ContainsRune(name, 0) {
		return "", badLayer("an entry name is too long or holds a NUL byte")
	}
	if strings.HasPrefix(name, "/") {
		return "", badLayer("entry %q has an absolute path", shorten(name))
	}
	for _, part := range strings.Split(name, "/") {
		if part == ".." {
			return "", badLayer("entry %q leaves the layer (..)", shorten(name))
		}
	}
	c := path.Clean(name)
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

// entry writes one tar entry.
func (u *unpacker) entry(hdr *tar.Header, body io.Reader) error {
	rel, err := cleanName(hdr.Name)
	if err != nil {
		return err
	}
	if rel == "" {
		if hdr.Typeflag == tar.TypeDir {
			u.dirTimes = append(u.dirTimes, dirTime{root: true, hdr: hdr})
			return u.applyDirMeta(u.root, hdr)
		}
		return nil
	}
	dir, base := path.Split(rel)
	dir = strings.TrimSuffix(dir, "/")
	if base == whiteoutOpaque {
		return u.opaque(dir)
	}
	if strings.HasPrefix(base, whiteoutMeta) {
		return nil // other AUFS metadata (.wh..wh.plnk, ...): not file content
	}
	parent, err := u.openParent(dir)
	if err != nil {
		return err
	}
	if strings.HasPrefix(base, whiteoutPrefix) {
		return u.whiteout(parent, strings.TrimPrefix(base, whiteoutPrefix), rel)
	}
	switch hdr.Typeflag {
	case tar.TypeDir:
		return u.mkdir(parent, base, rel, hdr)
	case tar.TypeReg, tar.TypeRegA:
		return u.file(parent, base, rel, hdr, body)
	case tar.TypeSymlink:
		return u.symlink(parent, base, rel, hdr)
	case tar.TypeLink:
		return u.hardlink(parent, base, rel, hdr)
	case tar.TypeFifo:
		if err := u.replace(parent, base, rel, false); err != nil {
			return err
		}
		if err := unix.Mknodat(parent, base, unix.S_IFIFO|uint32(hdr.Mode&0o777), 0); err != nil {
			return fmt.Errorf("mkfifo %s: %w", rel, err)
		}
		return u.applyMetaAt(parent, base, hdr)
	}
	// Device nodes (a sandbox gets its own /dev), and types this reader
	// does not know, are skipped.
	return nil
}

// openParent returns a descriptor of the directory rel below the root,
// creating missing components (mode 0755, like tar) and refusing any that
// is not a real directory.
func (u *unpacker) openParent(rel string) (int, error) {
	if rel == "" {
		return u.root, nil
	}
	if rel == u.parentRel && u.parentFD >= 0 {
		return u.parentFD, nil
	}
	fd, err := u.walk(rel, true)
	if err != nil {
		return -1, err
	}
	if u.parentFD >= 0 {
		unix.Close(u.parentFD)
	}
	u.parentRel, u.parentFD = rel, fd
	return fd, nil
}

// walk opens the directory rel one component at a time, never following
// a symbolic link. The caller closes the descriptor.
func (u *unpacker) walk(rel string, create bool) (int, error) {
	cur, err := unix.Dup(u.root)
	if err != nil {
		return -1, err
	}
	for _, part := range strings.Split(rel, "/") {
		if create {
			if err := unix.Mkdirat(cur, part, 0o755); err != nil && !errors.Is(err, unix.EEXIST) {
				unix.Close(cur)
				return -1, fmt.Errorf("mkdir %s: %w", rel, err)
			}
		}
		next, err := unix.Openat(cur, part, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		unix.Close(cur)
		if errors.Is(err, unix.ELOOP) || errors.Is(err, unix.ENOTDIR) {
			return -1, badLayer("path %q goes through something that is not a directory (a symbolic link?)", shorten(rel))
		}
		if err != nil {
			return -1, fmt.Errorf("open %s: %w", rel, err)
		}
		cur = next
	}
	return cur, nil
}

// replace removes what a new entry at name replaces: a later entry of a
// tar stream wins. A directory stays when the new entry is one too (the
// two merge); a non-empty directory cannot be replaced by a non-directory.
func (u *unpacker) replace(parent int, name, rel string, isDir bool) error {
	var st unix.Stat_t
	if err := unix.Fstatat(parent, name, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("stat %s: %w", rel, err)
	}
	if st.Mode&unix.S_IFMT == unix.S_IFDIR {
		if isDir {
			return nil
		}
		if err := unix.Unlinkat(parent, name, unix.AT_REMOVEDIR); err != nil {
			if errors.Is(err, unix.ENOTEMPTY) || errors.Is(err, unix.EEXIST) {
				return badLayer("entry %q replaces a directory that is not empty", shorten(rel))
			}
			return fmt.Errorf("remove %s: %w", rel, err)
		}
		return nil
	}
	if err := unix.Unlinkat(parent, name, 0); err != nil {
		return fmt.Errorf("remove %s: %w", rel, err)
	}
	return nil
}

// whiteout records that name, from a lower layer, is deleted: overlayfs'
// form is a character device 0/0. An entry of the same layer wins over
// its whiteout (image-spec: whiteouts apply to lower layers only).
func (u *unpacker) whiteout(parent int, name, rel string) error {
	if name == "" || name == "." || name == ".." || strings.Contains(name, "/") {
		return badLayer("bad whiteout %q", shorten(rel))
	}
	err := unix.Mknodat(parent, name, unix.S_IFCHR, 0)
	if errors.Is(err, unix.EEXIST) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("whiteout %s: %w", rel, err)
	}
	return nil
}

// opaque marks the directory rel opaque: overlayfs then hides what lower
// layers have in it.
func (u *unpacker) opaque(rel string) error {
	fd := u.root
	if rel != "" {
		var err error
		if fd, err = u.walk(rel, true); err != nil {
			return err
		}
		defer unix.Close(fd)
	}
	if err := unix.Fsetxattr(fd, opaqueXattr, []byte("y"), 0); err != nil {
		return fmt.Errorf("mark %s opaque: %w", rel, err)
	}
	return nil
}

func (u *unpacker) mkdir(parent int, name, rel string, hdr *tar.Header) error {
	if err := u.replace(parent, name, rel, true); err != nil {
		return err
	}
	if err := unix.Mkdirat(parent, name, 0o700); err != nil && !errors.Is(err, unix.EEXIST) {
		return fmt.Errorf("mkdir %s: %w", rel, err)
	}
	fd, err := unix.Openat(parent, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", rel, err)
	}
	defer unix.Close(fd)
	u.dirTimes = append(u.dirTimes, dirTime{rel: rel, hdr: hdr})
	return u.applyDirMeta(fd, hdr)
}

// take charges n bytes of file content to the layer's and the image's
// limits.
func (u *unpacker) take(n int64) error {
	if n < 0 {
		return badLayer("negative file size")
	}
	u.stats.Bytes += n
	if u.stats.Bytes > u.lim.MaxLayerBytes {
		return badLayer("more than %d bytes of files in one layer", u.lim.MaxLayerBytes)
	}
	if u.budget != nil {
		if *u.budget -= n; *u.budget < 0 {
			return badLayer("more than %d bytes of files in the image", u.lim.MaxImageBytes)
		}
	}
	return nil
}

func (u *unpacker) file(parent int, name, rel string, hdr *tar.Header, body io.Reader) error {
	if err := u.take(hdr.Size); err != nil {
		return err
	}
	if err := u.replace(parent, name, rel, false); err != nil {
		return err
	}
	fd, err := unix.Openat(parent, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("create %s: %w", rel, err)
	}
	f := os.NewFile(uintptr(fd), rel)
	defer f.Close()
	if n, err := io.CopyN(f, body, hdr.Size); err != nil {
		if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || n < hdr.Size {
			return badLayer("file %q is truncated", shorten(rel))
		}
		return fmt.Errorf("write %s: %w", rel, err)
	}
	if err := u.applyFDMeta(fd, hdr); err != nil {
		return fmt.Errorf("%s: %w", rel, err)
	}
	return nil
}

func (u *unpacker) symlink(parent int, name, rel string, hdr *tar.Header) error {
	if hdr.Linkname == "" || len(hdr.Linkname) > maxNameLen || strings.ContainsRune(hdr.Linkname, 0) {
		return badLayer("symbolic link %q has a bad target", shorten(rel))
	}
	if err := u.replace(parent, name, rel, false); err != nil {
		return err
	}
	// The target is only text: it is resolved inside the sandbox, never
	// by torpor on the host.
	if err := unix.Symlinkat(hdr.Linkname, parent, name); err != nil {
		return fmt.Errorf("symlink %s: %w", rel, err)
	}
	if err := unix.Fchownat(parent, name, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("chown %s: %w", rel, err)
	}
	return setTimesAt(parent, name, hdr)
}

// hardlink links name to an earlier entry of the same layer.
func (u *unpacker) hardlink(parent int, name, rel string, hdr *tar.Header) error {
	target, err := cleanName(hdr.Linkname)
	if err != nil {
		return err
	}
	if target == "" {
		return badLayer("hard link %q points at the layer's root", shorten(rel))
	}
	tdir, tbase := path.Split(target)
	tdirFD := u.root
	if tdir = strings.TrimSuffix(tdir, "/"); tdir != "" {
		if tdirFD, err = u.walk(tdir, false); err != nil {
			if torpor.IsCode(err, torpor.EInvalid) {
				return err
			}
			return badLayer("hard link %q points at %q, which is not in the layer", shorten(rel), shorten(target))
		}
		defer unix.Close(tdirFD)
	}
	var st unix.Stat_t
	if err := unix.Fstatat(tdirFD, tbase, &st, unix.AT_SYMLINK_NOFOLLOW); err != nil || st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return badLayer("hard link %q points at %q, which is not a file in the layer", shorten(rel), shorten(target))
	}
	if target == rel {
		return nil
	}
	if err := u.replace(parent, name, rel, false); err != nil {
		return err
	}
	// Flags 0: a symbolic link target is linked itself, not followed.
	if err := unix.Linkat(tdirFD, tbase, parent, name, 0); err != nil {
		return fmt.Errorf("link %s: %w", rel, err)
	}
	return nil
}

// applyDirMeta sets a directory's owner, mode and extended attributes.
func (u *unpacker) applyDirMeta(fd int, hdr *tar.Header) error {
	return u.applyFDMeta(fd, hdr)
}

// applyFDMeta sets owner, then mode (chown clears set-id bits), then
// extended attributes and times of an open file or directory.
func (u *unpacker) applyFDMeta(fd int, hdr *tar.Header) error {
	if err := unix.Fchown(fd, hdr.Uid, hdr.Gid); err != nil {
		return fmt.Errorf("chown: %w", err)
	}
	if err := unix.Fchmod(fd, tarMode(hdr)); err != nil {
		return fmt.Errorf("chmod: %w", err)
	}
	if err := setXattrs(fd, hdr); err != nil {
		return err
	}
	if hdr.Typeflag != tar.TypeDir {
		return setTimesFD(fd, hdr)
	}
	return nil
}

// applyMetaAt sets owner and mode of a node that cannot be opened (a FIFO
// would block).
func (u *unpacker) applyMetaAt(parent int, name string, hdr *tar.Header) error {
	if err := unix.Fchownat(parent, name, hdr.Uid, hdr.Gid, unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("chown %s: %w", name, err)
	}
	if err := unix.Fchmodat(parent, name, tarMode(hdr), 0); err != nil {
		return fmt.Errorf("chmod %s: %w", name, err)
	}
	return setTimesAt(parent, name, hdr)
}

// tarMode is the permission, set-id and sticky bits of an entry.
func tarMode(hdr *tar.Header) uint32 { return uint32(hdr.Mode) & 0o7777 }

// allowedXattr reports whether an extended attribute of an image may be
// set: user attributes and file capabilities. Trusted attributes (which
// overlayfs reads, e.g. opaque markers) and security labels are not.
func allowedXattr(name string) bool {
	return strings.HasPrefix(name, "user.") || name == "security.capability"
}

func setXattrs(fd int, hdr *tar.Header) error {
	for k, v := range hdr.PAXRecords {
		name, ok := strings.CutPrefix(k, "SCHILY.xattr.")
		if !ok || !allowedXattr(name) {
			continue
		}
		if err := unix.Fsetxattr(fd, name, []byte(v), 0); err != nil && !errors.Is(err, unix.ENOTSUP) {
			return fmt.Errorf("set xattr %s: %w", name, err)
		}
	}
	return nil
}

func timespecs(hdr *tar.Header) []unix.Timespec {
	at := hdr.AccessTime
	if at.IsZero() {
		at = hdr.ModTime
	}
	return []unix.Timespec{unix.NsecToTimespec(at.UnixNano()), unix.NsecToTimespec(hdr.ModTime.UnixNano())}
}

func setTimesFD(fd int, hdr *tar.Header) error {
	// utimensat(fd, NULL, ...) is not reachable from Go: go through the
	// descriptor's /proc link (the file itself, whatever its name).
	if err := unix.UtimesNanoAt(unix.AT_FDCWD, "/proc/self/fd/"+strconv.Itoa(fd), timespecs(hdr), 0); err != nil {
		return fmt.Errorf("set times: %w", err)
	}
	return nil
}

func setTimesAt(parent int, name string, hdr *tar.Header) error {
	if err := unix.UtimesNanoAt(parent, name, timespecs(hdr), unix.AT_SYMLINK_NOFOLLOW); err != nil {
		return fmt.Errorf("set times of %s: %w", name, err)
	}
	return nil
}

// setDirTimes gives directories their times once nothing more is added
// to them, deepest last-seen first.
func (u *unpacker) setDirTimes() error {
	for i := len(u.dirTimes) - 1; i >= 0; i-- {
		d := u.dirTimes[i]
		if d.root {
			if err := setTimesFD(u.root, d.hdr); err != nil {
				return err
			}
			continue
		}
		fd, err := u.walk(d.rel, false)
		if err != nil {
			continue // replaced by a later entry
		}
		err = setTimesFD(fd, d.hdr)
		unix.Close(fd)
		if err != nil {
			return fmt.Errorf("%s: %w", d.rel, err)
		}
	}
	return nil
}
