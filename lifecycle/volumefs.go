package lifecycle

import (
	"io"
	"path"
	"strings"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/files"
)

// outsideVolumes is a sandbox's files as the files API serves them when
// volumes are mounted in it: the API reads the sandbox's root on the host,
// where a volume's bind mount is not, so a path on a volume would reach
// the directory under the mount point instead. Such paths are refused,
// naming the volume's own files route.
type outsideVolumes struct {
	files.FS
	mounts []torpor.VolumeMount
}

// withoutVolumes wraps fsys when sb mounts volumes.
func withoutVolumes(fsys files.FS, sb *torpor.Sandbox) files.FS {
	if len(sb.VolumeMounts) == 0 {
		return fsys
	}
	return outsideVolumes{FS: fsys, mounts: sb.VolumeMounts}
}

// check refuses p when it is on a mounted volume.
func (o outsideVolumes) check(param, p string) error {
	clean := path.Clean("/" + p)
	for _, m := range o.mounts {
		mp := path.Clean("/" + m.Path)
		if clean == mp || strings.HasPrefix(clean, mp+"/") {
			return torpor.Invalid(param, "%s is on the volume %q mounted at %s: use its files at /v1/volumes/%s/files", p, m.Name, mp, m.Name)
		}
	}
	return nil
}

func (o outsideVolumes) Open(p string) (files.File, files.Info, error) {
	if err := o.check("path", p); err != nil {
		return nil, files.Info{}, err
	}
	return o.FS.Open(p)
}

func (o outsideVolumes) Stat(p string) (files.Info, error) {
	if err := o.check("path", p); err != nil {
		return files.Info{}, err
	}
	return o.FS.Stat(p)
}

func (o outsideVolumes) Write(p string, src io.Reader, opts files.WriteOptions) (files.Info, error) {
	if err := o.check("path", p); err != nil {
		return files.Info{}, err
	}
	return o.FS.Write(p, src, opts)
}

func (o outsideVolumes) Mkdir(p string, opts files.MkdirOptions) (files.Info, error) {
	if err := o.check("path", p); err != nil {
		return files.Info{}, err
	}
	return o.FS.Mkdir(p, opts)
}

func (o outsideVolumes) Rename(from, to string, overwrite bool) (files.Info, error) {
	if err := o.check("from", from); err != nil {
		return files.Info{}, err
	}
	if err := o.check("to", to); err != nil {
		return files.Info{}, err
	}
	return o.FS.Rename(from, to, overwrite)
}

func (o outsideVolumes) Remove(p string, recursive bool) error {
	if err := o.check("path", p); err != nil {
		return err
	}
	return o.FS.Remove(p, recursive)
}

func (o outsideVolumes) List(p string, depth, max int) (files.Listing, error) {
	if err := o.check("path", p); err != nil {
		return files.Listing{}, err
	}
	return o.FS.List(p, depth, max)
}

func (o outsideVolumes) WriteTar(w io.Writer, p string) error {
	if err := o.check("path", p); err != nil {
		return err
	}
	return o.FS.WriteTar(w, p)
}

func (o outsideVolumes) ExtractTar(dir string, src io.Reader) (files.TarResult, error) {
	if err := o.check("path", dir); err != nil {
		return files.TarResult{}, err
	}
	return o.FS.ExtractTar(dir, src)
}
