package main

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/spf13/cobra"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/client"
	"github.com/torpor-dev/torpor/files"
)

func (c *cli) cpCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "cp SRC DST",
		Short: "Copy files and directories between this machine and a sandbox (ID:PATH)",
		Long: `Copy a file or a directory tree between this machine and a sandbox. One of
SRC and DST is ID:PATH, a path in a sandbox; the other is a local path, or
- for standard input or output (a directory goes to standard output as a
tar archive). As with cp -r, a directory copied onto an existing directory
goes inside it under its own name; otherwise DST becomes the copy.
Directories travel as tar archives; symlinks are copied as symlinks.`,
		Example: `  torpor cp ./project k3v9ab:/root/project
  torpor cp k3v9ab:/root/results.csv .
  torpor cp k3v9ab:/var/log - | tar -t`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			src, dst := parseRemote(args[0]), parseRemote(args[1])
			if src.ok == dst.ok {
				return errors.New("one of SRC and DST must be ID:PATH (a path in a sandbox) and the other a local path")
			}
			return c.withClient(func(cl *client.Client) error {
				if dst.ok {
					return c.copyIn(cmd.Context(), cl, args[0], dst)
				}
				return c.copyOut(cmd.Context(), cl, src, args[1])
			})
		},
	}
}

// remote is an ID:PATH argument.
type remote struct {
	id, path string
	ok       bool
}

func parseRemote(s string) remote {
	id, p, found := strings.Cut(s, ":")
	if !found || p == "" || !torpor.ValidID(id) {
		return remote{}
	}
	return remote{id: id, path: p, ok: true}
}

// remoteDir reports whether r names a directory (through a symlink too);
// a missing path is not one. info is nil when r is missing.
func remoteDir(ctx context.Context, cl *client.Client, r remote) (bool, *client.FileInfo, error) {
	info, err := cl.StatFile(ctx, r.id, r.path)
	switch {
	case client.IsNotFound(err):
		return false, nil, nil
	case err != nil:
		return false, nil, err
	case info.Type == files.TypeSymlink:
		_, lerr := cl.ListFiles(ctx, r.id, r.path, 1)
		return lerr == nil, info, nil
	}
	return info.Type == files.TypeDir, info, nil
}

// copyIn copies the local file or directory src into the sandbox.
func (c *cli) copyIn(ctx context.Context, cl *client.Client, src string, dst remote) error {
	if src == "-" {
		info, err := cl.WriteFile(ctx, dst.id, dst.path, c.stdin, nil)
		return answer(c, info, err, nil)
	}
	st, err := os.Stat(src)
	if err != nil {
		return err
	}
	target := dst.path
	isDir, _, err := remoteDir(ctx, cl, dst)
	if err != nil {
		return err
	}
	if isDir || strings.HasSuffix(dst.path, "/") {
		target = path.Join(dst.path, filepath.Base(src))
	}
	if !st.IsDir() {
		f, err := os.Open(src)
		if err != nil {
			return err
		}
		defer f.Close()
		m := localMode(st.Mode())
		info, err := cl.WriteFile(ctx, dst.id, target, f, &client.WriteOptions{Mode: &m})
		return answer(c, info, err, nil)
	}
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeLocalTar(pw, src, c.stderr)) }()
	res, err := cl.UploadTar(ctx, dst.id, target, pr)
	pr.CloseWithError(errors.New("the upload ended"))
	if err != nil {
		return err
	}
	for _, s := range res.Skipped {
		fmt.Fprintf(c.stderr, "torpor: %s was not copied: %s\n", s.Name, s.Reason)
	}
	return show(c, res, nil)
}

// localMode turns a local file's mode into permission bits.
func localMode(m fs.FileMode) files.Mode {
	out := files.Mode(m.Perm())
	if m&fs.ModeSetuid != 0 {
		out |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		out |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		out |= 0o1000
	}
	return out
}

// copyOut copies a file or directory of the sandbox to dst on this machine.
func (c *cli) copyOut(ctx context.Context, cl *client.Client, src remote, dst string) error {
	isDir, info, err := remoteDir(ctx, cl, src)
	if err != nil {
		return err
	}
	if info == nil {
		return torpor.Errorf(torpor.ENotFound, "%s: no such file or directory in sandbox %s", src.path, src.id)
	}
	var rc io.ReadCloser
	if isDir {
		rc, err = cl.DownloadTar(ctx, src.id, src.path)
	} else {
		rc, err = cl.ReadFile(ctx, src.id, src.path)
	}
	if err != nil {
		return err
	}
	defer rc.Close()
	if dst == "-" {
		_, err := io.Copy(c.stdout, rc)
		return err
	}
	if st, err := os.Stat(dst); err == nil && st.IsDir() && path.Base(src.path) != "/" {
		dst = filepath.Join(dst, path.Base(src.path))
	}
	if isDir {
		return extractLocal(rc, dst, c.stderr)
	}
	mode := fs.FileMode(0o644)
	if info.Type == files.TypeFile {
		mode = fs.FileMode(info.Mode & 0o777)
	}
	return writeLocalFile(dst, rc, mode)
}

// writeLocalFile writes r to name atomically (a temporary file renamed).
func writeLocalFile(name string, r io.Reader, mode fs.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(name), ".torpor-cp-*")
	if err != nil {
		return err
	}
	_, err = io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(f.Name(), mode)
	}
	if err == nil {
		err = os.Rename(f.Name(), name)
	}
	if err != nil {
		os.Remove(f.Name())
	}
	return err
}

// writeLocalTar writes the tree under dir as a tar archive, names relative
// to dir, symlinks as symlinks; other special files are left out with a
// warning.
func writeLocalTar(w io.Writer, dir string, warn io.Writer) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		return tarLocalEntry(tw, p, filepath.ToSlash(rel), d, warn)
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

func tarLocalEntry(tw *tar.Writer, p, name string, d fs.DirEntry, warn io.Writer) error {
	info, err := d.Info()
	if err != nil {
		return err
	}
	link := ""
	switch {
	case d.Type()&fs.ModeSymlink != 0:
		if link, err = os.Readlink(p); err != nil {
			return err
		}
	case d.IsDir():
		name += "/"
	case !d.Type().IsRegular():
		fmt.Fprintf(warn, "torpor: %s was not copied: not a file, directory or symlink\n", p)
		return nil
	}
	h, err := tar.FileInfoHeader(info, link)
	if err != nil {
		return err
	}
	h.Name, h.Uname, h.Gname = name, "", ""
	if err := tw.WriteHeader(h); err != nil {
		return err
	}
	if h.Typeflag != tar.TypeReg {
		return nil
	}
	f, err := os.Open(p)
	if err != nil {
		return err
	}
	defer f.Close()
	_, err = io.CopyN(tw, f, h.Size)
	return err
}

// extractLocal unpacks a tar archive from a sandbox into dst (made when
// missing). The archive is not trusted: every entry is written through an
// os.Root, so none lands outside dst, even through symlinks it made.
func extractLocal(r io.Reader, dst string, warn io.Writer) error {
	if err := os.MkdirAll(dst, 0o755); err != nil {
		return err
	}
	root, err := os.OpenRoot(dst)
	if err != nil {
		return err
	}
	defer root.Close()
	tr := tar.NewReader(r)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("reading the archive: %w", err)
		}
		name := path.Clean(strings.TrimLeft(h.Name, "/"))
		if name == "." || name == ".." || strings.HasPrefix(name, "../") {
			continue
		}
		if err := extractLocalEntry(root, tr, h, name, warn); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
}

func extractLocalEntry(root *os.Root, tr *tar.Reader, h *tar.Header, name string, warn io.Writer) error {
	mode := fs.FileMode(h.Mode & 0o777)
	if h.Typeflag == tar.TypeDir {
		return root.MkdirAll(name, mode|0o700)
	}
	if err := root.MkdirAll(path.Dir(name), 0o755); err != nil {
		return err
	}
	if fi, err := root.Lstat(name); err == nil && !fi.IsDir() {
		if err := root.Remove(name); err != nil {
			return err
		}
	}
	switch h.Typeflag {
	case tar.TypeReg:
		f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
		if err != nil {
			return err
		}
		_, err = io.Copy(f, tr)
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err == nil {
			err = root.Chtimes(name, h.ModTime, h.ModTime)
		}
		return err
	case tar.TypeSymlink:
		return root.Symlink(h.Linkname, name)
	case tar.TypeLink:
		return root.Link(path.Clean(strings.TrimLeft(h.Linkname, "/")), name)
	}
	fmt.Fprintf(warn, "torpor: %s was not copied: not a file, directory or link\n", name)
	return nil
}
