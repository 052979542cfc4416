package files

import (
	"io"
	"os"
)

// FS is what the files API does with a sandbox's files. *Root does it on
// a directory of the host (HostFS); a runtime whose sandboxes' root file
// systems are not on the host (a microVM's disk lives in the guest) does
// it inside the sandbox and hands one out through the optional runtime
// capability torpor.SandboxFiles[FS]. Paths, confinement and errors are
// the same either way.
type FS interface {
	// Open opens the regular file p for reading.
	Open(p string) (File, Info, error)
	Stat(p string) (Info, error)
	Write(p string, src io.Reader, o WriteOptions) (Info, error)
	Mkdir(p string, o MkdirOptions) (Info, error)
	Rename(from, to string, overwrite bool) (Info, error)
	Remove(p string, recursive bool) error
	List(p string, depth, max int) (Listing, error)
	WriteTar(w io.Writer, p string) error
	ExtractTar(dir string, src io.Reader) (TarResult, error)
	// Close releases what the FS holds.
	Close() error
}

// File is an open regular file of an FS.
type File interface {
	io.ReadSeekCloser
}

// HostFS is root as an FS.
func HostFS(root *Root) FS { return hostFS{root} }

type hostFS struct{ *Root }

func (h hostFS) Open(p string) (File, Info, error) {
	f, info, err := h.Root.Open(p)
	if err != nil {
		return nil, info, err
	}
	return f, info, nil
}

var _ File = (*os.File)(nil)
