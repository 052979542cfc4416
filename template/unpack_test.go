package template

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor"
)

// needRoot skips tests that chown, mknod and set trusted xattrs.
func needRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (unpacking sets owners, makes whiteout devices and trusted xattrs)")
	}
}

// entry is one tar entry of a test layer.
type entry struct {
	name, body, link string
	typ              byte
	mode             int64
	uid, gid         int
	pax              map[string]string
}

func file(name, body string) entry {
	return entry{name: name, body: body, typ: tar.TypeReg, mode: 0o644}
}
func dir(name string) entry { return entry{name: name, typ: tar.TypeDir, mode: 0o755} }
func symlink(name, target string) entry {
	return entry{name: name, link: target, typ: tar.TypeSymlink, mode: 0o777}
}
func hardlink(name, target string) entry {
	return entry{name: name, link: target, typ: tar.TypeLink, mode: 0o644}
}

// layerTar returns a tar stream of entries.
func layerTar(t testing.TB, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Typeflag: e.typ, Mode: e.mode, Linkname: e.link, Uid: e.uid, Gid: e.gid,
			ModTime: time.Unix(1700000000, 0), PAXRecords: e.pax}
		if e.typ == tar.TypeReg {
			hdr.Size = int64(len(e.body))
		}
		if e.typ == tar.TypeChar {
			hdr.Devmajor, hdr.Devminor = 1, 3
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if e.typ == tar.TypeReg {
			io.WriteString(tw, e.body)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func sha(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

func unpackInto(t *testing.T, data []byte, lim Limits) (string, error) {
	t.Helper()
	d := filepath.Join(t.TempDir(), "fs")
	if err := os.Mkdir(d, 0o755); err != nil {
		t.Fatal(err)
	}
	_, err := unpack(context.Background(), bytes.NewReader(data), d, lim, nil)
	return d, err
}

func TestUnpackFilesOwnersModesAndLinks(t *testing.T) {
	needRoot(t)
	setuid := entry{name: "usr/bin/su", body: "#!", typ: tar.TypeReg, mode: 0o4755, uid: 0, gid: 0}
	owned := entry{name: "home/ada/notes", body: "hi", typ: tar.TypeReg, mode: 0o600, uid: 1234, gid: 4321}
	caps := entry{name: "usr/bin/ping", body: "elf", typ: tar.TypeReg, mode: 0o755,
		pax: map[string]string{"SCHILY.xattr.user.note": "kept", "SCHILY.xattr.trusted.overlay.opaque": "y"}}
	dev := entry{name: "dev/null", typ: tar.TypeChar, mode: 0o666}
	d, err := unpackInto(t, layerTar(t, dir("./"), dir("usr/"), setuid, owned, caps, symlink("bin", "usr/bin"),
		hardlink("usr/bin/su2", "usr/bin/su"), dev, file("a/b/c/deep", "implicit parents")), DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	st := lstat(t, filepath.Join(d, "usr/bin/su"))
	if st.Mode&0o7777 != 0o4755 || st.Nlink != 2 {
		t.Errorf("su: mode %o links %d, want 4755 and 2", st.Mode&0o7777, st.Nlink)
	}
	if st := lstat(t, filepath.Join(d, "home/ada/notes")); st.Uid != 1234 || st.Gid != 4321 || st.Mode&0o777 != 0o600 {
		t.Errorf("notes: owner %d:%d mode %o", st.Uid, st.Gid, st.Mode&0o777)
	}
	if target, _ := os.Readlink(filepath.Join(d, "bin")); target != "usr/bin" {
		t.Errorf("bin -> %q", target)
	}
	if st := lstat(t, filepath.Join(d, "usr/bin/su")); time.Unix(st.Mtim.Unix()).Unix() != 1700000000 {
		t.Errorf("mtime not kept: %v", st.Mtim)
	}
	buf := make([]byte, 16)
	if n, err := unix.Lgetxattr(filepath.Join(d, "usr/bin/ping"), "user.note", buf); err != nil || string(buf[:n]) != "kept" {
		t.Errorf("user xattr: %q %v", buf[:n], err)
	}
	if _, err := unix.Lgetxattr(filepath.Join(d, "usr/bin/ping"), opaqueXattr, buf); err == nil {
		t.Error("a trusted xattr from the image was set")
	}
	if _, err := os.Lstat(filepath.Join(d, "dev/null")); err == nil {
		t.Error("a device node was created")
	}
	if data, _ := os.ReadFile(filepath.Join(d, "a/b/c/deep")); string(data) != "implicit parents" {
		t.Errorf("deep file: %q", data)
	}
}

func lstat(t *testing.T, p string) unix.Stat_t {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Lstat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st
}

// isWhiteout reports whether p is overlayfs' whiteout, a 0/0 char device.
func isWhiteout(t *testing.T, p string) bool {
	var st unix.Stat_t
	return unix.Lstat(p, &st) == nil && st.Mode&unix.S_IFMT == unix.S_IFCHR && st.Rdev == 0
}

func isOpaque(p string) bool {
	buf := make([]byte, 2)
	n, err := unix.Lgetxattr(p, opaqueXattr, buf)
	return err == nil && string(buf[:n]) == "y"
}

func TestUnpackConvertsWhiteouts(t *testing.T) {
	needRoot(t)
	d, err := unpackInto(t, layerTar(t,
		file("etc/.wh.secret", ""),
		dir("data/"), file("data/.wh..wh..opq", ""), file("data/new", "n"),
		// A whiteout and an entry of the same name in one layer: the entry
		// stays, whichever comes first.
		file("keep/.wh.a", ""), file("keep/a", "a"), file("keep/b", "b"), file("keep/.wh.b", ""),
		file(".wh..wh.plnk/123", ""),
	), DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	if !isWhiteout(t, filepath.Join(d, "etc/secret")) {
		t.Error("etc/secret is not a whiteout device")
	}
	if _, err := os.Lstat(filepath.Join(d, "etc/.wh.secret")); err == nil {
		t.Error("the .wh. file itself was written")
	}
	if !isOpaque(filepath.Join(d, "data")) {
		t.Error("data is not marked opaque")
	}
	if _, err := os.Lstat(filepath.Join(d, "data/.wh..wh..opq")); err == nil {
		t.Error("the opaque marker file itself was written")
	}
	for _, n := range []string{"keep/a", "keep/b"} {
		if data, err := os.ReadFile(filepath.Join(d, n)); err != nil || len(data) != 1 {
			t.Errorf("%s: %q %v (an entry of the same layer must win over its whiteout)", n, data, err)
		}
	}
}

// Every attempt to write outside the layer directory is refused, and
// nothing lands outside it.
func TestUnpackRefusesEscapes(t *testing.T) {
	needRoot(t)
	for _, tc := range []struct {
		name    string
		entries []entry
	}{
		{"dotdot", []entry{file("../escaped", "x")}},
		{"dotdot inside", []entry{file("a/../../escaped", "x")}},
		{"absolute", []entry{file("/tmp/escaped", "x")}},
		{"symlink parent", []entry{symlink("link", "OUTSIDE"), file("link/escaped", "x")}},
		{"symlink parent, absolute target", []entry{symlink("link", "/"), file("link/tmp/escaped", "x")}},
		{"hardlink out", []entry{hardlink("escaped", "../outside-file")}},
		{"hardlink absolute", []entry{hardlink("escaped", "/etc/passwd")}},
		{"hardlink through symlink", []entry{symlink("l", "/etc"), hardlink("escaped", "l/passwd")}},
		{"opaque through symlink", []entry{symlink("l", "OUTSIDE"), file("l/.wh..wh..opq", "")}},
		{"whiteout through symlink", []entry{symlink("l", "OUTSIDE"), file("l/.wh.x", "")}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			parent := t.TempDir()
			outside := filepath.Join(parent, "OUTSIDE")
			os.Mkdir(outside, 0o755)
			os.WriteFile(filepath.Join(parent, "outside-file"), []byte("secret"), 0o644)
			d := filepath.Join(parent, "fs")
			os.Mkdir(d, 0o755)
			// Relative symlink targets are written relative to the layer;
			// point them at the sibling OUTSIDE directory.
			for i, e := range tc.entries {
				if e.link == "OUTSIDE" {
					tc.entries[i].link = outside
				}
			}
			_, err := unpack(context.Background(), bytes.NewReader(layerTar(t, tc.entries...)), d, DefaultLimits, nil)
			if !torpor.IsCode(err, torpor.EInvalid) {
				t.Errorf("unpack: %v, want an invalid_argument error", err)
			}
			for _, p := range []string{filepath.Join(parent, "escaped"), filepath.Join(outside, "escaped"), "/tmp/escaped", filepath.Join(outside, "x")} {
				if _, err := os.Lstat(p); err == nil {
					t.Errorf("%s was written", p)
					os.Remove(p)
				}
			}
			if isOpaque(outside) {
				t.Error("a directory outside the layer was marked opaque")
			}
		})
	}
}

func TestUnpackBoundsTarBombs(t *testing.T) {
	needRoot(t)
	big := layerTar(t, file("a", strings.Repeat("x", 600)), file("b", strings.Repeat("x", 600)))
	if _, err := unpackInto(t, big, Limits{MaxLayerBytes: 1000, MaxEntries: 100}); !torpor.IsCode(err, torpor.EInvalid) || !strings.Contains(err.Error(), "bytes") {
		t.Errorf("over the byte limit: %v", err)
	}
	var many []entry
	for i := 0; i < 20; i++ {
		many = append(many, dir(strings.Repeat("d", i+1)+"/"))
	}
	if _, err := unpackInto(t, layerTar(t, many...), Limits{MaxLayerBytes: 1000, MaxEntries: 10}); !torpor.IsCode(err, torpor.EInvalid) || !strings.Contains(err.Error(), "entries") {
		t.Errorf("over the entry limit: %v", err)
	}
	budget := int64(700)
	d := filepath.Join(t.TempDir(), "fs")
	os.Mkdir(d, 0o755)
	if _, err := unpack(context.Background(), bytes.NewReader(big), d, DefaultLimits, &budget); !torpor.IsCode(err, torpor.EInvalid) || !strings.Contains(err.Error(), "image") {
		t.Errorf("over the image budget: %v", err)
	}
	if _, err := unpackInto(t, []byte("this is not a tar stream at all, not even close......"), DefaultLimits); !torpor.IsCode(err, torpor.EInvalid) {
		t.Errorf("garbage: %v", err)
	}
	trunc := layerTar(t, file("a", strings.Repeat("x", 5000)))
	if _, err := unpackInto(t, trunc[:1500], DefaultLimits); !torpor.IsCode(err, torpor.EInvalid) {
		t.Errorf("truncated: %v", err)
	}
}

// A layer whose content does not match its digest leaves nothing behind;
// a matching one is unpacked once and then shared.
func TestLayerStoreDigests(t *testing.T) {
	needRoot(t)
	dir := t.TempDir()
	ls, err := newLayerStore(dir, DefaultLimits)
	if err != nil {
		t.Fatal(err)
	}
	data := layerTar(t, file("hello", "world"))
	opens := 0
	open := func() (io.ReadCloser, error) { opens++; return io.NopCloser(bytes.NewReader(data)), nil }
	wrong := sha([]byte("something else"))
	if _, err := ls.ensure(context.Background(), wrong, nil, open); !torpor.IsCode(err, torpor.EInvalid) || !strings.Contains(err.Error(), "digest mismatch") {
		t.Fatalf("wrong digest: %v", err)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Fatalf("a failed layer left %v", entries)
	}
	l1, err := ls.ensure(context.Background(), sha(data), nil, open)
	if err != nil {
		t.Fatal(err)
	}
	l2, err := ls.ensure(context.Background(), sha(data), nil, open)
	if err != nil {
		t.Fatal(err)
	}
	if l1.FS() != l2.FS() || opens != 2 {
		t.Errorf("layers %s and %s, %d opens; want one shared layer unpacked once", l1.FS(), l2.FS(), opens-1)
	}
	if want := filepath.Join(dir, "sha256-"+strings.TrimPrefix(sha(data), "sha256:"), "fs"); l1.FS() != want {
		t.Errorf("layer at %s, want %s", l1.FS(), want)
	}
	// Unknown digest: computed while unpacking, same place.
	l3, err := ls.ensure(context.Background(), "", nil, open)
	if err != nil || l3.FS() != l1.FS() {
		t.Errorf("computed-digest layer at %s (%v), want %s", l3.FS(), err, l1.FS())
	}
	// Pinned layers survive gc; unpinned unused ones go.
	if n, _ := ls.gc(nil); n != 0 {
		t.Errorf("gc removed %d pinned layers", n)
	}
	for range 3 {
		ls.unpin(strings.TrimPrefix(sha(data), "sha256:"))
	}
	if n, _ := ls.gc(nil); n != 1 {
		t.Errorf("gc removed %d layers, want 1", n)
	}
	if entries, _ := os.ReadDir(dir); len(entries) != 0 {
		t.Errorf("after gc: %v", entries)
	}
}
