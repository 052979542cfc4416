package diskarchive

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/klauspost/compress/zstd"
	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor"
)

// sparseImage makes a sparse file of size with data at each offset.
func sparseImage(t *testing.T, size int64, data map[int64]string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "disk.img")
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	for off, s := range data {
		if _, err := f.WriteAt([]byte(s), off); err != nil {
			t.Fatal(err)
		}
	}
	return p
}

func allocated(t *testing.T, p string) int64 {
	t.Helper()
	var st unix.Stat_t
	if err := unix.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

func sameContent(t *testing.T, a, b string) {
	t.Helper()
	fa, err := os.Open(a)
	if err != nil {
		t.Fatal(err)
	}
	defer fa.Close()
	fb, err := os.Open(b)
	if err != nil {
		t.Fatal(err)
	}
	defer fb.Close()
	ba, bb := make([]byte, 1<<20), make([]byte, 1<<20)
	for off := int64(0); ; off += int64(len(ba)) {
		na, ea := io.ReadFull(fa, ba)
		nb, eb := io.ReadFull(fb, bb)
		if na != nb || !bytes.Equal(ba[:na], bb[:nb]) {
			t.Fatalf("%s and %s differ in the MiB at %d", a, b, off)
		}
		if ea != nil || eb != nil {
			return
		}
	}
}

// importImage reads stream into a new file and returns its path, or the
// error; a failed import leaves no file.
func importImage(t *testing.T, stream []byte) (string, error) {
	t.Helper()
	p := filepath.Join(t.TempDir(), "imported.img")
	rd, err := NewReader(bytes.NewReader(stream))
	if err != nil {
		return "", err
	}
	defer rd.Close()
	f, err := os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	err = rd.ExtractImage(context.Background(), f)
	f.Close()
	if err != nil {
		os.Remove(p)
		return "", err
	}
	return p, nil
}

func TestSparseImageRoundTrips(t *testing.T) {
	const size = 256 << 20
	src := sparseImage(t, size, map[int64]string{
		0:              "superblock",
		1<<20 + 17:     strings.Repeat("x", 3<<20), // across record boundaries
		100 << 20:      "middle",
		size - 5:       "end!!",
		(50 << 20) + 1: string(make([]byte, 1<<20)) + "after zeros",
	})
	var buf bytes.Buffer
	n, err := WriteImage(context.Background(), &buf, src)
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(buf.Len()) {
		t.Errorf("WriteImage says %d bytes, wrote %d", n, buf.Len())
	}
	if buf.Len() > 1<<20 {
		t.Errorf("the stream of a 256 MiB image with 4 MiB of data is %d bytes", buf.Len())
	}
	dst, err := importImage(t, buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(dst)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Size() != size {
		t.Fatalf("imported size %d, want %d", fi.Size(), size)
	}
	sameContent(t, src, dst)
	if a := allocated(t, dst); a > 16<<20 {
		t.Errorf("the imported image takes %d bytes of its %d: not sparse", a, int64(size))
	}
}

func TestEmptyAndDataOnlyImages(t *testing.T) {
	for name, data := range map[string]map[int64]string{
		"all hole": {},
		"all data": {0: strings.Repeat("d", 2<<20)},
	} {
		t.Run(name, func(t *testing.T) {
			src := sparseImage(t, 2<<20, data)
			var buf bytes.Buffer
			if _, err := WriteImage(context.Background(), &buf, src); err != nil {
				t.Fatal(err)
			}
			dst, err := importImage(t, buf.Bytes())
			if err != nil {
				t.Fatal(err)
			}
			sameContent(t, src, dst)
		})
	}
}

// crafted writes a stream by hand: header fields, records, and a digest
// (the right one unless digest is set).
type crafted struct {
	magic   string
	version byte
	kind    Kind
	size    int64
	records [][]byte
	digest  []byte
	after   []byte
}

func (c crafted) bytes(t *testing.T) []byte {
	t.Helper()
	if c.magic == "" {
		c.magic = magic
	}
	if c.version == 0 {
		c.version = version
	}
	if c.kind == 0 {
		c.kind = Image
	}
	var hdr bytes.Buffer
	hdr.WriteString(c.magic)
	hdr.WriteByte(c.version)
	hdr.WriteByte(byte(c.kind))
	binary.Write(&hdr, binary.BigEndian, uint64(c.size))
	var body bytes.Buffer
	for _, r := range c.records {
		body.Write(r)
	}
	body.WriteByte(tagEnd)
	h := sha256.New()
	h.Write(hdr.Bytes())
	h.Write(body.Bytes())
	if c.digest != nil {
		body.Write(c.digest)
	} else {
		body.Write(h.Sum(nil))
	}
	body.Write(c.after)
	var out bytes.Buffer
	out.Write(hdr.Bytes())
	zw, err := zstd.NewWriter(&out)
	if err != nil {
		t.Fatal(err)
	}
	zw.Write(body.Bytes())
	zw.Close()
	return out.Bytes()
}

func extentRecord(off int64, data string) []byte {
	r := []byte{tagExtent}
	r = binary.BigEndian.AppendUint64(r, uint64(off))
	r = binary.BigEndian.AppendUint32(r, uint32(len(data)))
	return append(r, data...)
}

func tarRecord(data []byte) []byte {
	r := []byte{tagTar}
	r = binary.BigEndian.AppendUint32(r, uint32(len(data)))
	return append(r, data...)
}

func wantRefused(t *testing.T, what string, err error) {
	t.Helper()
	if err == nil {
		t.Fatalf("%s: accepted", what)
	}
	if !torpor.IsCode(err, torpor.EInvalid) {
		t.Fatalf("%s: err = %v, want invalid_argument", what, err)
	}
	t.Logf("%s: %v", what, err)
}

func TestImageStreamsRefused(t *testing.T) {
	good := crafted{size: 8192, records: [][]byte{extentRecord(0, "hello"), extentRecord(4096, "world")}}
	if _, err := importImage(t, good.bytes(t)); err != nil {
		t.Fatalf("the good crafted stream: %v", err)
	}
	for name, c := range map[string]crafted{
		"bad magic":              {magic: "torpor-dosk", size: 8192},
		"unknown version":        {version: 9, size: 8192},
		"unknown kind":           {kind: 7, size: 8192},
		"size over the maximum":  {size: MaxSize + 1},
		"extent beyond the size": {size: 8192, records: [][]byte{extentRecord(8190, "abc")}},
		"extent far beyond":      {size: 8192, records: [][]byte{extentRecord(1<<62, "abc")}},
		"overlapping extents":    {size: 8192, records: [][]byte{extentRecord(100, "abcdef"), extentRecord(102, "x")}},
		"empty extent":           {size: 8192, records: [][]byte{extentRecord(100, "")}},
		"tar record in an image": {size: 8192, records: [][]byte{tarRecord([]byte("x"))}},
		"unknown record":         {size: 8192, records: [][]byte{{'Q', 1, 2, 3}}},
		"bad checksum":           {size: 8192, records: [][]byte{extentRecord(0, "hello")}, digest: make([]byte, 32)},
		"data after the end":     {size: 8192, records: [][]byte{extentRecord(0, "hello")}, after: []byte("more")},
	} {
		t.Run(name, func(t *testing.T) {
			_, err := importImage(t, c.bytes(t))
			wantRefused(t, name, err)
		})
	}
}

func TestCutOrCorruptStreamsRefused(t *testing.T) {
	src := sparseImage(t, 64<<20, map[int64]string{0: strings.Repeat("abc", 1<<20), 40 << 20: "tail"})
	var buf bytes.Buffer
	if _, err := WriteImage(context.Background(), &buf, src); err != nil {
		t.Fatal(err)
	}
	stream := buf.Bytes()
	cases := map[string][]byte{
		"empty":          nil,
		"header only":    stream[:headerLen],
		"cut in half":    stream[:len(stream)/2],
		"last byte gone": stream[:len(stream)-1],
	}
	flipped := bytes.Clone(stream)
	flipped[len(flipped)/2] ^= 0x40
	cases["a byte flipped"] = flipped
	for name, s := range cases {
		t.Run(name, func(t *testing.T) {
			dir := filepath.Dir(src)
			before, _ := os.ReadDir(dir)
			_, err := importImage(t, s)
			wantRefused(t, name, err)
			if after, _ := os.ReadDir(dir); len(after) != len(before) {
				t.Errorf("a refused import left files")
			}
		})
	}
}

// A failure to read the source itself (a network's) is no refusal of the
// stream: the caller may try again.
func TestSourceFailureIsNotRefusal(t *testing.T) {
	src := sparseImage(t, 8<<20, map[int64]string{0: strings.Repeat("q", 4<<20)})
	var buf bytes.Buffer
	if _, err := WriteImage(context.Background(), &buf, src); err != nil {
		t.Fatal(err)
	}
	boom := errors.New("connection reset")
	r := io.MultiReader(bytes.NewReader(buf.Bytes()[:buf.Len()/2]), iotestErr{boom})
	rd, err := NewReader(r)
	if err != nil {
		t.Fatal(err)
	}
	defer rd.Close()
	f, err := os.Create(filepath.Join(t.TempDir(), "x.img"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	err = rd.ExtractImage(context.Background(), f)
	if !errors.Is(err, boom) || torpor.IsCode(err, torpor.EInvalid) {
		t.Fatalf("err = %v, want the source's error", err)
	}
}

type iotestErr struct{ err error }

func (e iotestErr) Read([]byte) (int, error) { return 0, e.err }

// writable makes the directories under dir writable again when the test
// ends, so that it can be removed by a user who is not root.
func writable(t *testing.T, dir string) {
	t.Cleanup(func() {
		filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
			if err == nil && d.IsDir() {
				os.Chmod(p, 0o755)
			}
			return nil
		})
	})
}

// writeTree makes a tree with an entry of each kind WriteDir keeps.
func writeTree(t *testing.T, dir string) {
	t.Helper()
	writable(t, dir)
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.MkdirAll(filepath.Join(dir, "etc/deep/er"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "etc/hosts"), []byte("127.0.0.1 me\n"), 0o644))
	must(os.WriteFile(filepath.Join(dir, "etc/deep/er/secret"), []byte("s3cret"), 0o600))
	must(os.Symlink("/etc/passwd", filepath.Join(dir, "abs-link")))
	must(os.Symlink("../../hosts", filepath.Join(dir, "etc/deep/er/rel-link")))
	must(os.Link(filepath.Join(dir, "etc/hosts"), filepath.Join(dir, "hosts-hardlink")))
	must(unix.Mkfifo(filepath.Join(dir, "fifo"), 0o640))
	must(os.Mkdir(filepath.Join(dir, "ro"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "ro/inside"), []byte("in a read-only dir"), 0o444))
	must(os.Chmod(filepath.Join(dir, "ro"), 0o555))
	f, err := os.Create(filepath.Join(dir, "sparse"))
	must(err)
	must(f.Truncate(64 << 20))
	_, err = f.WriteAt([]byte("end"), 64<<20-3)
	must(err)
	must(f.Close())
	must(unix.Setxattr(filepath.Join(dir, "etc/hosts"), "user.torpor", []byte("v\x00binary"), 0))
	mt := time.Date(2020, 1, 2, 3, 4, 5, 6000, time.UTC)
	must(os.Chtimes(filepath.Join(dir, "etc/hosts"), mt, mt))
	must(os.Chtimes(filepath.Join(dir, "etc"), mt, mt))
	if os.Geteuid() == 0 {
		must(unix.Mknod(filepath.Join(dir, "etc/whiteout"), unix.S_IFCHR, 0))
		must(unix.Setxattr(filepath.Join(dir, "etc/deep"), "trusted.overlay.opaque", []byte("y"), 0))
		must(os.Lchown(filepath.Join(dir, "etc/deep/er/secret"), 1000, 1001))
		must(os.Lchown(filepath.Join(dir, "abs-link"), 1002, 1003))
		must(os.WriteFile(filepath.Join(dir, "suid"), []byte("#!/bin/sh\n"), 0o755))
		must(os.Chmod(filepath.Join(dir, "suid"), 0o4755))
		// A device other than a whiteout is left out.
		must(unix.Mknod(filepath.Join(dir, "null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3))))
	}
}

// describe lists every entry of the tree: type, mode, owner, size, link
// target, mtime (files), xattrs and content.
func describe(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		st := fi.Sys().(*syscall.Stat_t)
		itoa := func(n int64) string { return strconv.FormatInt(n, 10) }
		b.WriteString(rel + " " + fi.Mode().String())
		b.WriteString(" " + itoa(int64(st.Uid)) + ":" + itoa(int64(st.Gid)) + " nlink=" + itoa(int64(st.Nlink)))
		if fi.Mode().IsRegular() {
			c, err := os.ReadFile(p)
			if err != nil {
				return err
			}
			sum := sha256.Sum256(c)
			b.WriteString(" size=" + itoa(fi.Size()) + " sha=" + hex.EncodeToString(sum[:4]))
		}
		if fi.Mode().IsRegular() || fi.IsDir() {
			b.WriteString(" mtime=" + fi.ModTime().UTC().String())
		}
		if fi.Mode()&os.ModeSymlink != 0 {
			l, _ := os.Readlink(p)
			b.WriteString(" -> " + l)
		}
		if fi.Mode()&os.ModeCharDevice != 0 {
			b.WriteString(" rdev=" + itoa(int64(st.Rdev)))
		}
		x, _ := pathXattrs(p)()
		for k, v := range x {
			b.WriteString(" " + k + "=" + v)
		}
		b.WriteString("\n")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func importDir(t *testing.T, stream []byte) (string, error) {
	t.Helper()
	dst := filepath.Join(t.TempDir(), "upper")
	if err := os.Mkdir(dst, 0o700); err != nil {
		t.Fatal(err)
	}
	writable(t, dst)
	rd, err := NewReader(bytes.NewReader(stream))
	if err != nil {
		return dst, err
	}
	defer rd.Close()
	return dst, rd.ExtractDir(context.Background(), dst)
}

func TestTreeRoundTrips(t *testing.T) {
	src := filepath.Join(t.TempDir(), "upper")
	if err := os.Mkdir(src, 0o751); err != nil {
		t.Fatal(err)
	}
	writeTree(t, src)
	var buf bytes.Buffer
	n, err := WriteDir(context.Background(), &buf, src)
	if err != nil {
		t.Fatal(err)
	}
	if n != int64(buf.Len()) {
		t.Errorf("WriteDir says %d bytes, wrote %d", n, buf.Len())
	}
	dst, err := importDir(t, buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	want := describe(t, src)
	if os.Geteuid() == 0 {
		// The other device is left out.
		want = strings.Join(filterLines(strings.Split(want, "\n"), "null "), "\n")
	}
	if got := describe(t, dst); got != want {
		t.Errorf("the imported tree differs:\n got:\n%s\nwant:\n%s", got, want)
	}
	if a := allocated(t, filepath.Join(dst, "sparse")); a > 1<<20 {
		t.Errorf("the sparse file takes %d bytes after the import", a)
	}
}

func filterLines(lines []string, prefix string) []string {
	var out []string
	for _, l := range lines {
		if !strings.HasPrefix(l, prefix) {
			out = append(out, l)
		}
	}
	return out
}

// uid and gid own the entries of crafted trees: a user who is not root
// can extract them.
var uid, gid = os.Getuid(), os.Getgid()

// treeStream is a stream of the dir kind holding the tar archive that
// entries make.
func treeStream(t *testing.T, entries func(tw *tar.Writer)) []byte {
	t.Helper()
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	tw.WriteHeader(&tar.Header{Uid: uid, Gid: gid, Typeflag: tar.TypeDir, Name: "./", Mode: 0o755})
	entries(tw)
	tw.Close()
	return crafted{kind: Dir, records: [][]byte{tarRecord(tb.Bytes())}}.bytes(t)
}

func TestHostileTreesRefused(t *testing.T) {
	outside := t.TempDir()
	file := func(tw *tar.Writer, name, body string) {
		tw.WriteHeader(&tar.Header{Uid: uid, Gid: gid, Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(body))})
		tw.Write([]byte(body))
	}
	for name, entries := range map[string]func(tw *tar.Writer){
		"dot-dot":        func(tw *tar.Writer) { file(tw, "../escape", "x") },
		"dot-dot inside": func(tw *tar.Writer) { file(tw, "a/../../escape", "x") },
		"absolute":       func(tw *tar.Writer) { file(tw, filepath.Join(outside, "escape"), "x") },
		"through symlink": func(tw *tar.Writer) {
			tw.WriteHeader(&tar.Header{Uid: uid, Gid: gid, Typeflag: tar.TypeSymlink, Name: "link", Linkname: outside})
			file(tw, "link/escape", "x")
		},
		"hard link out": func(tw *tar.Writer) {
			tw.WriteHeader(&tar.Header{Uid: uid, Gid: gid, Typeflag: tar.TypeLink, Name: "hl", Linkname: "../../etc/passwd"})
		},
		"hard link through symlink": func(tw *tar.Writer) {
			tw.WriteHeader(&tar.Header{Uid: uid, Gid: gid, Typeflag: tar.TypeSymlink, Name: "link", Linkname: "/etc"})
			tw.WriteHeader(&tar.Header{Uid: uid, Gid: gid, Typeflag: tar.TypeLink, Name: "hl", Linkname: "link/passwd"})
		},
		"over a symlink": func(tw *tar.Writer) {
			tw.WriteHeader(&tar.Header{Uid: uid, Gid: gid, Typeflag: tar.TypeSymlink, Name: "link", Linkname: filepath.Join(outside, "escape")})
			file(tw, "link", "x")
		},
		"missing parent": func(tw *tar.Writer) { file(tw, "no/such/dir/f", "x") },
		"device": func(tw *tar.Writer) {
			tw.WriteHeader(&tar.Header{Uid: uid, Gid: gid, Typeflag: tar.TypeChar, Name: "null", Devmajor: 1, Devminor: 3, Mode: 0o666})
		},
		"block device": func(tw *tar.Writer) {
			tw.WriteHeader(&tar.Header{Uid: uid, Gid: gid, Typeflag: tar.TypeBlock, Name: "sda", Devmajor: 8, Mode: 0o666})
		},
		"bad xattr": func(tw *tar.Writer) {
			tw.WriteHeader(&tar.Header{Uid: uid, Gid: gid, Typeflag: tar.TypeDir, Name: "d/", Mode: 0o755, Format: tar.FormatPAX,
				PAXRecords: map[string]string{paxXattr + "nonamespace": "v"}})
		},
		"cut file": func(tw *tar.Writer) {
			tw.WriteHeader(&tar.Header{Uid: uid, Gid: gid, Typeflag: tar.TypeReg, Name: "f", Mode: 0o644, Size: 100})
			tw.Write([]byte("short"))
		},
	} {
		t.Run(name, func(t *testing.T) {
			stream := treeStream(t, entries)
			_, err := importDir(t, stream)
			wantRefused(t, name, err)
			if es, _ := os.ReadDir(outside); len(es) != 0 {
				t.Errorf("the import wrote outside its directory: %v", es)
			}
		})
	}
}

func TestTreeCutOrCorruptRefused(t *testing.T) {
	src := t.TempDir()
	writeTree(t, src)
	var buf bytes.Buffer
	if _, err := WriteDir(context.Background(), &buf, src); err != nil {
		t.Fatal(err)
	}
	s := buf.Bytes()
	flipped := bytes.Clone(s)
	flipped[len(flipped)-10] ^= 1
	for name, stream := range map[string][]byte{"cut": s[:len(s)*2/3], "flipped": flipped, "kind image": crafted{kind: Image, size: 10}.bytes(t)} {
		t.Run(name, func(t *testing.T) {
			_, err := importDir(t, stream)
			wantRefused(t, name, err)
		})
	}
}
