package objstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"syscall"

	"github.com/torpor-dev/torpor"
)

// dirStore keeps each key in a file under a directory of the host, a key's
// slashes making subdirectories.
type dirStore struct {
	dir string
}

func openDir(u *url.URL) (*dirStore, error) {
	if err := checkOptions(u.Query()); err != nil {
		return nil, err
	}
	if u.Host != "" && u.Host != "localhost" {
		return nil, torpor.Invalid("url", "a file URL names a directory of this host (file:///DIR), not of %q", u.Host)
	}
	if u.Opaque != "" || !filepath.IsAbs(u.Path) {
		return nil, torpor.Invalid("url", "a file URL needs an absolute directory: file:///DIR")
	}
	dir := filepath.Clean(u.Path)
	// The directory is not made here: where it is a shared mount, a
	// missing one means the mount is missing, and objects written to the
	// local disk in its place would be seen by no other node.
	st, err := os.Stat(dir)
	if err != nil {
		return nil, torpor.Errorf(torpor.ENotFound, "the object store directory %s cannot be used: %v", dir, err)
	}
	if !st.IsDir() {
		return nil, torpor.Invalid("url", "the object store path %s is not a directory", dir)
	}
	return &dirStore{dir: dir}, nil
}

func (d *dirStore) Where() string { return (&url.URL{Scheme: "file", Path: d.dir}).String() }

func (d *dirStore) path(key string) string { return filepath.Join(d.dir, filepath.FromSlash(key)) }

// tempMark is in the names of the files a Put writes before it renames
// them; '~' is in no key, so a temporary file is never taken for an
// object.
const tempMark = ".~put-"

func (d *dirStore) Put(ctx context.Context, key string, r io.Reader, size int64) (err error) {
	if err := checkKey("key", key); err != nil {
		return err
	}
	dst := d.path(key)
	parent := filepath.Dir(dst)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return fmt.Errorf("objstore: put %s in %s: %w", key, d.Where(), err)
	}
	// The object is written beside its final name, synced, then renamed
	// over it: a reader sees the old object or the whole new one, and a
	// crash leaves at most a temporary file behind.
	f, err := os.CreateTemp(parent, filepath.Base(dst)+tempMark+"*")
	if err != nil {
		return fmt.Errorf("objstore: put %s in %s: %w", key, d.Where(), err)
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	src := ctxReader{ctx: ctx, r: r}
	if size >= 0 {
		var n int64
		n, err = io.CopyN(f, src, size)
		if errors.Is(err, io.EOF) {
			err = fmt.Errorf("the reader ended after %d of %d bytes", n, size)
		}
	} else {
		_, err = io.Copy(f, src)
	}
	if err == nil {
		err = f.Sync()
	}
	if err == nil {
		err = f.Close()
	}
	if err == nil {
		err = os.Rename(f.Name(), dst)
	}
	if err == nil {
		err = syncDir(parent)
	}
	if err != nil {
		return fmt.Errorf("objstore: put %s in %s: %w", key, d.Where(), err)
	}
	return nil
}

// syncDir makes a rename in dir durable.
func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

func (d *dirStore) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	if err := checkKey("key", key); err != nil {
		return nil, err
	}
	f, err := os.Open(d.path(key))
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return nil, torpor.Errorf(torpor.ENotFound, "no object %s in %s", key, d.Where())
	}
	if err != nil {
		return nil, fmt.Errorf("objstore: get %s from %s: %w", key, d.Where(), err)
	}
	// A directory is the common prefix of other keys, not an object.
	if st, err := f.Stat(); err != nil || st.IsDir() {
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("objstore: get %s from %s: %w", key, d.Where(), err)
		}
		return nil, torpor.Errorf(torpor.ENotFound, "no object %s in %s", key, d.Where())
	}
	return f, nil
}

func (d *dirStore) Delete(ctx context.Context, key string) error {
	if err := checkKey("key", key); err != nil {
		return err
	}
	p := d.path(key)
	st, err := os.Lstat(p)
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ENOTDIR) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("objstore: delete %s from %s: %w", key, d.Where(), err)
	}
	if st.IsDir() {
		return nil
	}
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("objstore: delete %s from %s: %w", key, d.Where(), err)
	}
	return nil
}

// ctxReader stops a copy when its context ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
