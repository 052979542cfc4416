package diskarchive

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"golang.org/x/sys/unix"
)

// WriteImage writes the image file at path, which nothing may change
// meanwhile (its file system unmounted), to w as a stream and returns the
// bytes it wrote to w. Only its data segments are read, and only their
// chunks that are not all zeros are written.
func WriteImage(ctx context.Context, w io.Writer, path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return 0, err
	}
	if !fi.Mode().IsRegular() {
		return 0, fmt.Errorf("%s is not a regular file", path)
	}
	size := fi.Size()
	sw, err := newWriter(w, Image, size)
	if err != nil {
		return 0, err
	}
	if err := writeExtents(ctx, sw, f, size); err != nil {
		sw.abort()
		return sw.out.n, err
	}
	if err := sw.close(); err != nil {
		return sw.out.n, err
	}
	return sw.out.n, nil
}

func writeExtents(ctx context.Context, sw *writer, f *os.File, size int64) error {
	buf := make([]byte, maxRecord)
	fd := int(f.Fd())
	for off := int64(0); off < size; {
		data, err := unix.Seek(fd, off, unix.SEEK_DATA)
		if errors.Is(err, unix.ENXIO) {
			return nil // only a hole is left
		}
		hole := size
		switch {
		case errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP):
			// A file system that cannot tell holes: all of it is data
			// (the zero chunks are still left out).
			data = off
		case err != nil:
			return err
		default:
			if hole, err = unix.Seek(fd, data, unix.SEEK_HOLE); err != nil {
				return err
			}
		}
		for p := data; p < hole; {
			if err := ctx.Err(); err != nil {
				return err
			}
			n := int(min(int64(len(buf)), hole-p))
			if _, err := f.ReadAt(buf[:n], p); err != nil {
				return fmt.Errorf("read %s at %d: %w", f.Name(), p, err)
			}
			if !allZero(buf[:n]) {
				if err := sw.extent(p, buf[:n]); err != nil {
					return err
				}
			}
			p += int64(n)
		}
		off = hole
	}
	return nil
}
