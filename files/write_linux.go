package files

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor"
)

// copyBuffer is the size of the buffer a write streams through.
const copyBuffer = 256 << 10

// ReadError is a failure to read the caller's data (a connection that
// broke, a body over a limit, a malformed archive), as opposed to a
// failure of the sandbox's file system.
type ReadError struct{ Err error }

func (e *ReadError) Error() string { return "reading the data: " + e.Err.Error() }

// Unwrap returns the read's error.
func (e *ReadError) Unwrap() error { return e.Err }

// sourceReader marks the errors of the reader it wraps as ReadErrors.
type sourceReader struct{ r io.Reader }

func (s sourceReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err != nil && err != io.EOF {
		err = asReadError(err)
	}
	return n, err
}

// copyFull copies src to dst through buf, filling buf before each write:
// a network body arrives in small pieces, and few large writes cost the
// file system less than many small ones.
func copyFull(dst io.Writer, src io.Reader, buf []byte) (int64, error) {
	var n int64
	for {
		k, rerr := io.ReadFull(src, buf)
		if k > 0 {
			if _, err := dst.Write(buf[:k]); err != nil {
				return n, err
			}
			n += int64(k)
		}
		switch {
		case rerr == io.EOF || rerr == io.ErrUnexpectedEOF:
			return n, nil
		case rerr != nil:
			return n, rerr
		}
	}
}

// attrs are the owner and mode a written file gets.
type attrs struct {
	uid, gid int
	mode     Mode
}

// targetAttrs decides the owner and mode of the file that will replace
// name in dirfd: those of a regular file already there (mode unless
// given), else the directory's owner and the given mode or 0644; owner,
// when set, replaces the owner either way. A directory in the way is a
// conflict, found before any data is copied.
func targetAttrs(dirfd int, name, p string, mode *Mode, owner *Owner) (attrs, error) {
	var st unix.Stat_t
	err := unix.Fstatat(dirfd, name, &st, unix.AT_SYMLINK_NOFOLLOW)
	if err == nil && st.Mode&unix.S_IFMT == unix.S_IFDIR {
		return attrs{}, torpor.Errorf(torpor.EConflict, "%s is a directory", p)
	}
	if err != nil || st.Mode&unix.S_IFMT != unix.S_IFREG {
		if err = unix.Fstat(dirfd, &st); err != nil {
			return attrs{}, pathError(p, err)
		}
		st.Mode = uint32(defaultFileMode)
	}
	a := attrs{uid: int(st.Uid), gid: int(st.Gid), mode: Mode(st.Mode & MaxMode)}
	if mode != nil {
		a.mode = *mode
	}
	if owner != nil {
		a.uid, a.gid = int(owner.UID), int(owner.GID)
	}
	return a, nil
}

// writeIn writes src to name in dirfd atomically, through a temporary
// file in dirfd renamed over name, owned by owner when set. mtime, when
// set, becomes the file's modification time. It returns the bytes written.
func writeIn(dirfd int, name, p string, src io.Reader, mode *Mode, owner *Owner, mtime *time.Time) (int64, error) {
	a, err := targetAttrs(dirfd, name, p, mode, owner)
	if err != nil {
		return 0, err
	}
	tmp, fd, err := createTemp(dirfd)
	if err != nil {
		return 0, pathError(p, err)
	}
	f := os.NewFile(uintptr(fd), tmp)
	n, err := fill(f, fd, src, a, p)
	if cerr := f.Close(); err == nil && cerr != nil {
		err = pathError(p, cerr)
	}
	if err == nil && mtime != nil {
		ts := unix.NsecToTimespec(mtime.UnixNano())
		err = pathError(p, unix.UtimesNanoAt(dirfd, tmp, []unix.Timespec{ts, ts}, unix.AT_SYMLINK_NOFOLLOW))
	}
	if err == nil {
		err = pathError(p, unix.Renameat(dirfd, tmp, dirfd, name))
	}
	if err != nil {
		_ = unix.Unlinkat(dirfd, tmp, 0)
		return 0, err
	}
	return n, nil
}

// fill copies src into the open temporary file (for the sandbox path p)
// and sets its owner and mode.
func fill(f *os.File, fd int, src io.Reader, a attrs, p string) (int64, error) {
	n, err := copyFull(f, sourceReader{src}, make([]byte, copyBuffer))
	if err != nil {
		var re *ReadError
		if errors.As(err, &re) {
			return n, re
		}
		return n, pathError(p, err)
	}
	if err := unix.Fchown(fd, a.uid, a.gid); err != nil {
		return n, fmt.Errorf("files: chown: %w", err)
	}
	if err := unix.Fchmod(fd, uint32(a.mode)); err != nil {
		return n, fmt.Errorf("files: chmod: %w", err)
	}
	return n, nil
}

// createTemp makes a new, empty, private file with a random name in dirfd.
func createTemp(dirfd int) (string, int, error) {
	for i := 0; ; i++ {
		name := ".torpor-" + torpor.NewID("", 12) + ".tmp"
		fd, err := unix.Openat(dirfd, name, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
		if err == unix.EEXIST && i < 8 {
			continue
		}
		return name, fd, err
	}
}
