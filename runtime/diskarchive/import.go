package diskarchive

import (
	"errors"
	"io"
	"io/fs"
	"os"
)

// Import is the frame of a runtime's torpor.DiskArchiver.ImportDisk
// (runc's, vm's): it opens the stream src and calls fill with it to make
// the disk of a sandbox whose directory is dir, which it makes first
// (with perm) where it is missing. fill refuses a stream it cannot take
// (Reader.Kind) and writes beside the disk, moving what it wrote into
// place only once the stream is found good. When fill fails, a directory
// that Import made goes with it, so that the runtime's List does not
// report a sandbox whose import failed; one that was there stays.
func Import(src io.Reader, dir string, perm os.FileMode, fill func(rd *Reader) error) error {
	rd, err := NewReader(src)
	if err != nil {
		return err
	}
	defer rd.Close()
	_, err = os.Lstat(dir)
	made := errors.Is(err, fs.ErrNotExist)
	if err := os.MkdirAll(dir, perm); err != nil {
		return err
	}
	err = fill(rd)
	if err != nil && made {
		_ = os.RemoveAll(dir)
	}
	return err
}
