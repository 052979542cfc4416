// Package templatetest makes small OCI images for tests: layers from tar
// entries, images with a configuration, a busybox layer, and an in-process
// registry to push them to.
package templatetest

import (
	"archive/tar"
	"bytes"
	"io"
	"log"
	"net/http/httptest"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// Entry is one tar entry.
type Entry struct {
	Name, Body, Link string
	Type             byte
	Mode             int64
}

// File is a regular file entry.
func File(name, body string) Entry {
	return Entry{Name: name, Body: body, Type: tar.TypeReg, Mode: 0o644}
}

// Dir is a directory entry (name ends in "/").
func Dir(name string) Entry { return Entry{Name: name, Type: tar.TypeDir, Mode: 0o755} }

// Symlink is a symbolic link entry.
func Symlink(name, target string) Entry {
	return Entry{Name: name, Link: target, Type: tar.TypeSymlink, Mode: 0o777}
}

// Whiteout deletes path of a lower layer.
func Whiteout(path string) Entry {
	dir, base := "", path
	if i := strings.LastIndex(path, "/"); i >= 0 {
		dir, base = path[:i+1], path[i+1:]
	}
	return File(dir+".wh."+base, "")
}

// Opaque hides what lower layers have in dir.
func Opaque(dir string) Entry { return File(strings.TrimSuffix(dir, "/")+"/.wh..wh..opq", "") }

// Tar returns a tar stream of entries.
func Tar(t testing.TB, entries ...Entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.Name, Typeflag: e.Type, Mode: e.Mode, Linkname: e.Link, ModTime: time.Unix(1700000000, 0)}
		if e.Type == tar.TypeReg {
			hdr.Size = int64(len(e.Body))
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, e.Body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// Layer returns a (gzip) layer of a tar stream.
func Layer(t testing.TB, data []byte) v1.Layer {
	t.Helper()
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(data)), nil })
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// Image returns an image of layers (lowest first) with cfg.
func Image(t testing.TB, cfg v1.Config, layers ...v1.Layer) v1.Image {
	t.Helper()
	img, err := mutate.AppendLayers(empty.Image, layers...)
	if err != nil {
		t.Fatal(err)
	}
	if img, err = mutate.Config(img, cfg); err != nil {
		t.Fatal(err)
	}
	return img
}

// Registry starts an in-memory OCI registry for the test and returns its
// host:port (plain HTTP).
func Registry(t testing.TB) string {
	t.Helper()
	srv := httptest.NewServer(registry.New(registry.Logger(log.New(io.Discard, "", 0))))
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

// Push writes img to ref in a plain-HTTP registry.
func Push(t testing.TB, ref string, img v1.Image) {
	t.Helper()
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
}

// BusyboxLayer returns a layer with the host's static busybox at
// /bin/busybox, a symlink to it for each applet, and /etc/passwd. It
// skips the test when /bin/busybox is missing.
func BusyboxLayer(t testing.TB) []byte {
	t.Helper()
	data, err := os.ReadFile("/bin/busybox")
	if err != nil {
		t.Skip("needs busybox-static (apt-get install busybox-static)")
	}
	out, err := exec.Command("/bin/busybox", "--list").Output()
	if err != nil {
		t.Fatal(err)
	}
	entries := []Entry{Dir("bin/"), {Name: "bin/busybox", Body: string(data), Type: tar.TypeReg, Mode: 0o755},
		Dir("etc/"), File("etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"), Dir("root/")}
	for _, a := range strings.Fields(string(out)) {
		if a != "busybox" && !strings.Contains(a, "/") {
			entries = append(entries, Symlink("bin/"+a, "busybox"))
		}
	}
	return Tar(t, entries...)
}
