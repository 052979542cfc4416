package files

import (
	"archive/tar"
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

func TestTarRoundTrip(t *testing.T) {
	s := newSandbox(t)
	s.host(t, "proj/a.txt", "alpha")
	s.host(t, "proj/sub/b.bin", strings.Repeat("b", 100000))
	s.symlink(t, "sub/b.bin", "proj/link")
	s.symlink(t, s.outside, "proj/out") // archived as a link, never followed
	if err := os.Mkdir(filepath.Join(s.dir, "proj/empty"), 0o700); err != nil {
		t.Fatal(err)
	}
	mtime := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
	if err := os.Chtimes(filepath.Join(s.dir, "proj/a.txt"), mtime, mtime); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := s.root.WriteTar(&buf, "/proj"); err != nil {
		t.Fatal(err)
	}
	if bytes.Contains(buf.Bytes(), []byte(secretText)) {
		t.Fatal("the archive holds the host's secret")
	}
	res, err := s.root.ExtractTar("/copy/of", &buf)
	if err != nil || res.Entries != 6 || res.SkippedCount != 0 || res.Bytes != 100005 {
		t.Fatalf("extract %+v %v", res, err)
	}
	want, got := tree(t, s, "/proj"), tree(t, s, "/copy/of")
	if want != got {
		t.Fatalf("round trip differs:\n%s\n---\n%s", want, got)
	}
	if st, _ := s.root.Stat("/copy/of/a.txt"); !st.ModTime.Equal(mtime) {
		t.Fatalf("mtime %v, want %v", st.ModTime, mtime)
	}
	if st, _ := s.root.Stat("/copy/of/empty"); st.Mode != 0o700 {
		t.Fatalf("dir mode %v", st.Mode)
	}
	// A single file is archived under its base name.
	buf.Reset()
	if err := s.root.WriteTar(&buf, "/proj/a.txt"); err != nil {
		t.Fatal(err)
	}
	h, err := tar.NewReader(&buf).Next()
	if err != nil || h.Name != "a.txt" || h.Size != 5 {
		t.Fatalf("single-file archive %+v %v", h, err)
	}
	wantCode(t, s.root.WriteTar(io.Discard, "/missing"), torpor.ENotFound)
}

// tree describes the files below p (type, mode, size, content or target).
func tree(t *testing.T, s *sandbox, p string) string {
	t.Helper()
	l, err := s.root.List(p, MaxDepth, 0)
	if err != nil {
		t.Fatal(err)
	}
	var lines []string
	for _, e := range l.Entries {
		line := strings.TrimPrefix(e.Path, p) + " " + string(e.Type) + " " + e.Mode.String() + " " + e.LinkTarget
		if e.Type == TypeFile {
			b, _ := s.read(e.Path)
			line += " " + string(b)
		}
		lines = append(lines, line)
	}
	sort.Strings(lines)
	return strings.Join(lines, "\n")
}

type entry struct {
	name, link, body string
	flag             byte
}

func archive(t *testing.T, entries ...entry) *bytes.Buffer {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.name, Linkname: e.link, Typeflag: e.flag, Mode: 0o644, Size: int64(len(e.body))}
		if e.flag != tar.TypeReg {
			h.Size = 0
		}
		if err := tw.WriteHeader(h); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, e.body); err != nil && h.Size > 0 {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return &buf
}

// TestTarCannotEscape feeds archives built to write outside the target
// directory: none reaches the host, nor leaves the target directory.
func TestTarCannotEscape(t *testing.T) {
	s := newSandbox(t)
	s.host(t, "etc/passwd", "sandbox passwd")
	s.symlink(t, s.outside, "dst/pre") // a symlink the sandbox made in the target
	buf := archive(t,
		entry{name: "../escape", body: "x", flag: tar.TypeReg},
		entry{name: "a/../../escape2", body: "x", flag: tar.TypeReg},
		entry{name: "/abs", body: "absolute", flag: tar.TypeReg},
		entry{name: "ln", link: s.outside, flag: tar.TypeSymlink},
		entry{name: "ln/pwned", body: "x", flag: tar.TypeReg},
		entry{name: "up", link: "../../..", flag: tar.TypeSymlink},
		entry{name: "up/etc/passwd", body: "x", flag: tar.TypeReg},
		entry{name: "pre/pwned", body: "x", flag: tar.TypeReg},
		entry{name: "hl", link: "../../outside/secret", flag: tar.TypeLink},
		entry{name: "hl2", link: "ln/secret", flag: tar.TypeLink},
		entry{name: "hl3", link: "/etc/passwd", flag: tar.TypeLink},
		entry{name: "shadow", link: "/etc/shadow", flag: tar.TypeSymlink},
		entry{name: "shadow", body: "replaced", flag: tar.TypeReg},
		entry{name: "dev", flag: tar.TypeChar},
		entry{name: "fifo", flag: tar.TypeFifo},
		entry{name: "ok/file", body: "fine", flag: tar.TypeReg},
		entry{name: "hardok", link: "ok/file", flag: tar.TypeLink},
	)
	res, err := s.root.ExtractTar("/dst", buf)
	if err != nil {
		t.Fatal(err)
	}
	s.secretIntact(t)
	if got, _ := s.read("/etc/passwd"); got != "sandbox passwd" {
		t.Fatalf("/etc/passwd of the sandbox changed: %q", got)
	}
	skipped := map[string]bool{}
	for _, e := range res.Skipped {
		skipped[e.Name] = true
	}
	for _, n := range []string{"../escape", "a/../../escape2", "ln/pwned", "up/etc/passwd", "pre/pwned", "hl", "hl2", "hl3", "dev", "fifo"} {
		if !skipped[n] {
			t.Errorf("%s was not skipped: %+v", n, res)
		}
	}
	if res.SkippedCount != 10 || res.Entries != 7 {
		t.Fatalf("result %+v", res)
	}
	for p, want := range map[string]string{"/dst/abs": "absolute", "/dst/shadow": "replaced", "/dst/ok/file": "fine", "/dst/hardok": "fine"} {
		if got, err := s.read(p); got != want || err != nil {
			t.Fatalf("%s: %q %v", p, got, err)
		}
	}
	for _, p := range []string{"/escape", "/escape2", "/dst/escape"} {
		if _, err := s.root.Stat(p); !torpor.IsCode(err, torpor.ENotFound) {
			t.Fatalf("%s exists: %v", p, err)
		}
	}
	if info, _ := s.root.Stat("/dst/ln"); info.Type != TypeSymlink || info.LinkTarget != s.outside {
		t.Fatalf("symlinks are made as they are: %+v", info)
	}
}

// TestTarTruncatedLeavesNoPartialFile: a stream cut in the middle of a
// file stops the extraction with a ReadError and leaves no part of it.
func TestTarTruncatedLeavesNoPartialFile(t *testing.T) {
	s := newSandbox(t)
	buf := archive(t,
		entry{name: "first", body: "complete", flag: tar.TypeReg},
		entry{name: "second", body: strings.Repeat("z", 10000), flag: tar.TypeReg},
	)
	cut := bytes.NewReader(buf.Bytes()[:512*3+5000])
	res, err := s.root.ExtractTar("/", cut)
	var re *ReadError
	if !errors.As(err, &re) || res.Entries != 1 {
		t.Fatalf("got %+v %v, want a ReadError after one entry", res, err)
	}
	if _, err := s.root.Stat("/second"); !torpor.IsCode(err, torpor.ENotFound) {
		t.Fatalf("a partial file was left: %v", err)
	}
	ents, _ := os.ReadDir(s.dir)
	if len(ents) != 1 {
		t.Fatalf("leftovers: %v", ents)
	}
	_, err = s.root.ExtractTar("/", strings.NewReader(strings.Repeat("not a tar archive ", 100)))
	if !errors.As(err, &re) {
		t.Fatalf("garbage: %v", err)
	}
}
