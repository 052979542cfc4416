package main

import (
	"archive/tar"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestExtractLocalStaysInside: an archive from a sandbox is not trusted;
// nothing it holds lands outside the destination.
func TestExtractLocalStaysInside(t *testing.T) {
	base := t.TempDir()
	outside := filepath.Join(base, "outside")
	os.Mkdir(outside, 0o755)
	os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o600)
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	add := func(h tar.Header, body string) {
		h.Size = int64(len(body))
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		io.WriteString(tw, body)
	}
	add(tar.Header{Name: "../escape", Typeflag: tar.TypeReg}, "x")
	add(tar.Header{Name: "ok/file", Typeflag: tar.TypeReg}, "fine")
	add(tar.Header{Name: "ln", Typeflag: tar.TypeSymlink, Linkname: outside}, "")
	add(tar.Header{Name: "ln/pwned", Typeflag: tar.TypeReg}, "x")
	tw.Close()
	dst := filepath.Join(base, "dst")
	err := extractLocal(&buf, dst, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "ln/pwned") {
		t.Fatalf("writing through a symlink out: %v", err)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "ok", "file")); string(b) != "fine" {
		t.Fatalf("ok/file: %q", b)
	}
	ents, _ := os.ReadDir(outside)
	if len(ents) != 1 {
		t.Fatalf("the outside directory changed: %v", ents)
	}
	if _, err := os.Stat(filepath.Join(base, "escape")); err == nil {
		t.Fatal("../escape was written")
	}
}

func TestParseRemote(t *testing.T) {
	for s, want := range map[string]remote{
		"abc123:/root/x": {id: "abc123", path: "/root/x", ok: true},
		"./abc:/x":       {},
		"abc123:":        {},
		"/tmp/file":      {},
		"Upper:/x":       {},
	} {
		if got := parseRemote(s); got != want {
			t.Errorf("%q: %+v, want %+v", s, got, want)
		}
	}
}
