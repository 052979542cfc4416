package template

import (
	"archive/tar"
	"bufio"
	"bytes"
	"compress/gzip"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor"
)

// rootfsOpener returns how to read the root filesystem at p as one
// layer's tar stream: a directory is archived on the fly, a file is read
// as a (plain, gzip or zstd) tarball.
func rootfsOpener(p string) (func() (io.ReadCloser, error), error) {
	fi, err := os.Lstat(p)
	if err != nil {
		return nil, torpor.Invalid("rootfs", "cannot read %s on the server: %v", p, errors.Unwrap(err))
	}
	switch {
	case fi.IsDir():
		return func() (io.ReadCloser, error) { return dirTar(p), nil }, nil
	case fi.Mode().IsRegular():
		return func() (io.ReadCloser, error) { return openTarball(p) }, nil
	}
	return nil, torpor.Invalid("rootfs", "%s is neither a directory nor a tarball", p)
}

// Compression magic numbers.
var (
	gzipMagic = []byte{0x1f, 0x8b}
	zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}
)

// openTarball opens a tarball, decompressing gzip and zstd.
func openTarball(p string) (io.ReadCloser, error) {
	f, err := os.Open(p)
	if err != nil {
		return nil, torpor.Invalid("rootfs", "cannot read %s on the server: %v", p, errors.Unwrap(err))
	}
	br := bufio.NewReader(f)
	magic, _ := br.Peek(4)
	switch {
	case bytes.HasPrefix(magic, gzipMagic):
		zr, err := gzip.NewReader(br)
		if err != nil {
			f.Close()
			return nil, torpor.Invalid("rootfs", "%s is not a valid gzip file", p)
		}
		return readCloser{zr, f}, nil
	case bytes.HasPrefix(magic, zstdMagic):
		f.Close()
		l, err := tarball.LayerFromFile(p)
		if err != nil {
			return nil, torpor.Invalid("rootfs", "%s is not a valid zstd file: %v", p, err)
		}
		return l.Uncompressed()
	}
	return readCloser{br, f}, nil
}

// readCloser reads from r and closes c.
type readCloser struct {
	io.Reader
	c io.Closer
}

func (r readCloser) Close() error { return r.c.Close() }

// dirTar archives the directory root as a tar stream, deterministically
// (sorted names, numeric owners, no access or change times), so the same
// tree always has the same digest. Like `tar --one-file-system` it stays
// on root's file system, and it skips sockets and device nodes (a sandbox
// gets its own /dev).
func dirTar(root string) io.ReadCloser {
	pr, pw := io.Pipe()
	go func() {
		tw := tar.NewWriter(pw)
		err := writeDir(tw, root)
		if err == nil {
			err = tw.Close()
		}
		pw.CloseWithError(err)
	}()
	return pr
}

func writeDir(tw *tar.Writer, root string) error {
	var rootSt unix.Stat_t
	if err := unix.Lstat(root, &rootSt); err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	links := map[[2]uint64]string{}
	return walkSorted(root, ".", func(rel string, fi fs.FileInfo, st *unix.Stat_t) error {
		if uint64(st.Dev) != uint64(rootSt.Dev) && rel != "." {
			return nil // another file system mounted inside
		}
		return writeEntry(tw, root, rel, fi, st, links)
	})
}

// walkSorted calls fn for rel and, for a directory, everything below it
// in name order, without following symbolic links.
func walkSorted(root, rel string, fn func(rel string, fi fs.FileInfo, st *unix.Stat_t) error) error {
	p := filepath.Join(root, rel)
	fi, err := os.Lstat(p)
	if err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	st, ok := fi.Sys().(*unix.Stat_t)
	if !ok {
		var s unix.Stat_t
		if err := unix.Lstat(p, &s); err != nil {
			return fmt.Errorf("rootfs: %w", err)
		}
		st = &s
	}
	if err := fn(rel, fi, st); err != nil {
		return err
	}
	if !fi.IsDir() {
		return nil
	}
	names, err := readNames(p)
	if err != nil {
		return err
	}
	for _, n := range names {
		if err := walkSorted(root, filepath.Join(rel, n), fn); err != nil {
			return err
		}
	}
	return nil
}

func readNames(dir string) ([]string, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("rootfs: %w", err)
	}
	defer f.Close()
	names, err := f.Readdirnames(-1)
	if err != nil {
		return nil, fmt.Errorf("rootfs: %w", err)
	}
	sort.Strings(names)
	return names, nil
}

// writeEntry writes one file system object; hard links to a file written
// before become link entries.
func writeEntry(tw *tar.Writer, root, rel string, fi fs.FileInfo, st *unix.Stat_t, links map[[2]uint64]string) error {
	p := filepath.Join(root, rel)
	mode := fi.Mode()
	if mode&(fs.ModeSocket|fs.ModeDevice|fs.ModeCharDevice) != 0 {
		return nil
	}
	target := ""
	if mode&fs.ModeSymlink != 0 {
		t, err := os.Readlink(p)
		if err != nil {
			return fmt.Errorf("rootfs: %w", err)
		}
		target = t
	}
	hdr, err := tar.FileInfoHeader(fi, target)
	if err != nil {
		return fmt.Errorf("rootfs: %s: %w", rel, err)
	}
	hdr.Name = filepath.ToSlash(rel)
	if fi.IsDir() && rel != "." {
		hdr.Name += "/"
	} else if rel == "." {
		hdr.Name = "./"
	}
	hdr.Uid, hdr.Gid = int(st.Uid), int(st.Gid)
	hdr.Uname, hdr.Gname = "", ""
	hdr.AccessTime, hdr.ChangeTime = time.Time{}, time.Time{}
	hdr.ModTime = time.Unix(st.Mtim.Unix()).UTC()
	hdr.Format = tar.FormatPAX
	if mode.IsRegular() {
		key := [2]uint64{uint64(st.Dev), st.Ino}
		if first, ok := links[key]; ok && st.Nlink > 1 {
			hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeLink, first, 0
			return tw.WriteHeader(hdr)
		}
		if st.Nlink > 1 {
			links[key] = hdr.Name
		}
		hdr.PAXRecords = readXattrs(p)
	}
	if err := tw.WriteHeader(hdr); err != nil {
		return fmt.Errorf("rootfs: %s: %w", rel, err)
	}
	if !mode.IsRegular() {
		return nil
	}
	f, err := os.Open(p)
	if err != nil {
		return fmt.Errorf("rootfs: %w", err)
	}
	defer f.Close()
	if _, err := io.CopyN(tw, f, hdr.Size); err != nil {
		return fmt.Errorf("rootfs: %s changed while it was read: %w", rel, err)
	}
	return nil
}

// readXattrs returns the extended attributes of p that unpack would set
// (file capabilities, user attributes) as PAX records.
func readXattrs(p string) map[string]string {
	buf := make([]byte, 4096)
	n, err := unix.Llistxattr(p, buf)
	if err != nil || n == 0 {
		return nil
	}
	var out map[string]string
	for _, name := range strings.Split(strings.TrimRight(string(buf[:n]), "\x00"), "\x00") {
		if !allowedXattr(name) {
			continue
		}
		val := make([]byte, 4096)
		vn, err := unix.Lgetxattr(p, name, val)
		if err != nil {
			continue
		}
		if out == nil {
			out = map[string]string{}
		}
		out["SCHILY.xattr."+name] = string(val[:vn])
	}
	return out
}

// mountPoints are the directories every sandbox root needs: the init's
// mount point and those of /dev, /proc, /sys, and /tmp.
var mountPoints = []struct {
	name string
	mode int64
}{
	{".torpor", 0o755}, {"dev", 0o755}, {"proc", 0o555}, {"sys", 0o555}, {"tmp", 0o1777},
}

// skelTar returns a tar stream (a layer) holding the mount points that
// the layers (lowest first) lack, or nil when they have them all.
func skelTar(lowers []string) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	n := 0
	for _, mp := range mountPoints {
		if mergedHas(lowers, mp.name) {
			continue
		}
		n++
		hdr := &tar.Header{Typeflag: tar.TypeDir, Name: mp.name + "/", Mode: mp.mode, ModTime: time.Unix(0, 0).UTC(), Format: tar.FormatPAX}
		if err := tw.WriteHeader(hdr); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	if n == 0 {
		return nil, nil
	}
	return buf.Bytes(), nil
}

// mergedHas reports whether the overlay of lowers (lowest first) shows
// the top-level name: the topmost layer that has it, a whiteout of it, or
// an opaque root decides.
func mergedHas(lowers []string, name string) bool {
	for i := len(lowers) - 1; i >= 0; i-- {
		var st unix.Stat_t
		if err := unix.Lstat(filepath.Join(lowers[i], name), &st); err == nil {
			return !(st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0)
		}
		buf := make([]byte, 1)
		if n, err := unix.Lgetxattr(lowers[i], opaqueXattr, buf); err == nil && n == 1 && buf[0] == 'y' {
			return false
		}
	}
	return false
}
