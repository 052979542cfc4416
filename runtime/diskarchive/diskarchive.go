// Package diskarchive is the stream format of torpor.DiskArchiver: a
// stopped sandbox's disk written as one stream, which a fleet node uploads
// to its object store, and the disk made again from such a stream on
// another node. A disk is either an image (a sparse file holding a file
// system, such as the runc runtime's ext4 disk.img) or a directory tree
// (the overlay upper directory of a runc disk of directories).
//
// A stream is a header, not compressed:
//
//	magic    11 bytes  "torpor-disk"
//	version   1 byte   1
//	kind      1 byte   1: image, 2: dir
//	size      8 bytes  the image's logical size in bytes (dir: 0)
//
// then one zstd stream that holds records, each a tag byte and its fields
// (integers big-endian):
//
//	'E' offset:8 length:4 data   image only: length bytes of the image at
//	                             offset; 1 ≤ length ≤ 1 MiB, offset+length
//	                             ≤ size, and each record starts at or after
//	                             the end of the one before
//	'T' length:4 data            dir only: the next length bytes (1 ≤ length
//	                             ≤ 1 MiB) of a tar archive (PAX) of the tree
//	'Z' digest:32                the end: the SHA-256 of every byte before
//	                             the digest (header included), as they are
//	                             before compression
//
// and nothing after the end. An image's bytes that no record holds are
// zeros: the writer sends only the data segments of a sparse file
// (lseek SEEK_DATA and SEEK_HOLE) and, of those, only the chunks that are
// not all zeros, and the reader makes the image a sparse file of the
// logical size again, writing only what the records hold. The tar archive
// of a tree keeps owners, modes, times, extended attributes (overlayfs'
// trusted.overlay.* among them), hard links and the overlay's whiteouts
// (character devices 0/0); see WriteDir and ExtractDir.
//
// A reader trusts nothing in a stream: another node wrote it and it came
// through an object store. Whatever it refuses (a bad header, a record out
// of bounds, a name that leaves the tree, a digest that does not match, a
// stream cut short) is an invalid_argument *torpor.Error, and it writes
// only into the new, empty file or directory its caller gives it, which
// the caller removes when the stream is refused and moves into place when
// it is not: the digest is checked at the end, so a stream is only known
// good once all of it has been read. The digest detects corruption and
// truncation; it authenticates nothing (whoever can write the object
// store can write a stream that passes).
package diskarchive

import (
	"bufio"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"hash"
	"io"

	"github.com/klauspost/compress/zstd"

	"github.com/torpor-dev/torpor"
)

// Kind is what a stream holds.
type Kind byte

const (
	// Image is a file system image, kept as a sparse file.
	Image Kind = 1
	// Dir is a directory tree.
	Dir Kind = 2
)

func (k Kind) String() string {
	switch k {
	case Image:
		return "image"
	case Dir:
		return "dir"
	}
	return fmt.Sprintf("kind %d", byte(k))
}

// Format constants.
const (
	magic   = "torpor-disk"
	version = 1
	// headerLen is the header's length: magic, version, kind, size.
	headerLen = len(magic) + 1 + 1 + 8
	// maxRecord bounds the data of one record.
	maxRecord = 1 << 20
	tagExtent = 'E'
	tagTar    = 'T'
	tagEnd    = 'Z'
)

// MaxSize bounds the logical size of an image, and the file contents of a
// tree, that a reader accepts: 4 TiB, the largest disk_mib the API allows
// by default (torpor.DefaultLimits). An image is sparse, so its logical
// size costs nothing; what bounds the space an import takes is this and
// the records, which never reach past the logical size.
const MaxSize int64 = 4 << 40

// maxWindow bounds the zstd window a reader accepts (the writer uses 8
// MiB), and so the memory a hostile stream can make it take.
const maxWindow = 64 << 20

// zeros is a chunk of zeros to compare data with.
var zeros [maxRecord]byte

func allZero(p []byte) bool { return bytes.Equal(p, zeros[:len(p)]) }

// bad returns the error of a stream the reader refuses.
func bad(format string, args ...any) error {
	return torpor.Invalid("disk", "the disk stream is refused: "+format, args...)
}

// writer writes a stream: the header, then records into the zstd stream.
type writer struct {
	out  *countWriter
	zw   *zstd.Encoder
	h    hash.Hash
	body io.Writer // the encoder and the digest
	rec  [13]byte
}

type countWriter struct {
	w io.Writer
	n int64
}

func (c *countWriter) Write(p []byte) (int, error) {
	n, err := c.w.Write(p)
	c.n += int64(n)
	return n, err
}

// newWriter writes the header of a stream of kind (an image of size bytes)
// to w.
func newWriter(w io.Writer, kind Kind, size int64) (*writer, error) {
	out := &countWriter{w: w}
	h := sha256.New()
	var hdr [headerLen]byte
	copy(hdr[:], magic)
	hdr[len(magic)] = version
	hdr[len(magic)+1] = byte(kind)
	binary.BigEndian.PutUint64(hdr[len(magic)+2:], uint64(size))
	h.Write(hdr[:])
	if _, err := out.Write(hdr[:]); err != nil {
		return nil, err
	}
	// Two goroutines: several sandboxes may hibernate at once, and each
	// encoder holds a window per goroutine.
	zw, err := zstd.NewWriter(out, zstd.WithEncoderLevel(zstd.SpeedDefault), zstd.WithWindowSize(8<<20), zstd.WithEncoderConcurrency(2))
	if err != nil {
		return nil, err
	}
	return &writer{out: out, zw: zw, h: h, body: io.MultiWriter(zw, h)}, nil
}

// extent writes the image's data p at off.
func (w *writer) extent(off int64, p []byte) error {
	w.rec[0] = tagExtent
	binary.BigEndian.PutUint64(w.rec[1:], uint64(off))
	binary.BigEndian.PutUint32(w.rec[9:], uint32(len(p)))
	if _, err := w.body.Write(w.rec[:13]); err != nil {
		return err
	}
	_, err := w.body.Write(p)
	return err
}

// Write writes p, the next bytes of a tar archive, as records.
func (w *writer) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		c := p[:min(len(p), maxRecord)]
		w.rec[0] = tagTar
		binary.BigEndian.PutUint32(w.rec[1:], uint32(len(c)))
		if _, err := w.body.Write(w.rec[:5]); err != nil {
			return n, err
		}
		if _, err := w.body.Write(c); err != nil {
			return n, err
		}
		n += len(c)
		p = p[len(c):]
	}
	return n, nil
}

// close writes the end record and ends the zstd stream.
func (w *writer) close() error {
	if _, err := w.body.Write([]byte{tagEnd}); err != nil {
		return err
	}
	if _, err := w.zw.Write(w.h.Sum(nil)); err != nil {
		return err
	}
	return w.zw.Close()
}

// abort releases the encoder of a stream that is not finished.
func (w *writer) abort() { _ = w.zw.Close() }

// Reader reads a stream whose header NewReader has read and checked.
type Reader struct {
	// Kind is what the stream holds, and Size the logical size of its
	// image (0 for a tree).
	Kind Kind
	Size int64

	src  *sourceReader
	zr   *zstd.Decoder
	br   *bufio.Reader
	h    hash.Hash
	body io.Reader // br, through the digest
	rec  [12]byte
	// end: the end record and the digest were read and match.
	end bool
}

// sourceReader remembers the first error of the stream's source other
// than its end, so that a failure to read it (a network's) is told from a
// stream that is refused.
type sourceReader struct {
	r   io.Reader
	err error
}

func (s *sourceReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err != nil && err != io.EOF && s.err == nil {
		s.err = err
	}
	return n, err
}

// NewReader reads and checks the header of the stream r. Close releases
// the reader.
func NewReader(r io.Reader) (*Reader, error) {
	src := &sourceReader{r: r}
	var hdr [headerLen]byte
	if _, err := io.ReadFull(src, hdr[:]); err != nil {
		if src.err != nil {
			return nil, fmt.Errorf("read the disk stream: %w", src.err)
		}
		return nil, bad("it is shorter than its header")
	}
	if string(hdr[:len(magic)]) != magic {
		return nil, bad("it is not a torpor disk stream")
	}
	if v := hdr[len(magic)]; v != version {
		return nil, bad("format version %d, this torpor reads version %d", v, version)
	}
	rd := &Reader{Kind: Kind(hdr[len(magic)+1]), src: src, h: sha256.New()}
	size := binary.BigEndian.Uint64(hdr[len(magic)+2:])
	switch {
	case rd.Kind != Image && rd.Kind != Dir:
		return nil, bad("unknown kind %d", hdr[len(magic)+1])
	case size > uint64(MaxSize):
		return nil, bad("a disk of %d bytes is larger than the %d this torpor accepts", size, MaxSize)
	case rd.Kind == Dir && size != 0:
		return nil, bad("a tree with a size")
	}
	rd.Size = int64(size)
	rd.h.Write(hdr[:])
	zr, err := zstd.NewReader(src, zstd.WithDecoderMaxWindow(maxWindow), zstd.WithDecoderConcurrency(2))
	if err != nil {
		return nil, err
	}
	rd.zr = zr
	rd.br = bufio.NewReaderSize(zr, 64<<10)
	rd.body = io.TeeReader(rd.br, rd.h)
	return rd, nil
}

// Close releases the reader's decoder.
func (rd *Reader) Close() { rd.zr.Close() }

// readErr turns a failure to read the body into the error to return: the
// source's own failure as it is, anything else (a cut, a corrupt zstd
// stream) as a refused stream.
func (rd *Reader) readErr(err error) error {
	if rd.src.err != nil {
		return fmt.Errorf("read the disk stream: %w", rd.src.err)
	}
	var te *torpor.Error
	if errors.As(err, &te) {
		return err
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return bad("it ends before its end record (cut short, or corrupt)")
	}
	return bad("%v", err)
}

// next reads the next record's tag.
func (rd *Reader) next() (byte, error) {
	if _, err := io.ReadFull(rd.body, rd.rec[:1]); err != nil {
		return 0, rd.readErr(err)
	}
	return rd.rec[0], nil
}

// finish reads the digest after the end record's tag, compares it with
// what was read, and checks that nothing follows.
func (rd *Reader) finish() error {
	want := rd.h.Sum(nil)
	var got [sha256.Size]byte
	if _, err := io.ReadFull(rd.br, got[:]); err != nil {
		return rd.readErr(err)
	}
	if !bytes.Equal(got[:], want) {
		return bad("its SHA-256 does not match its content (corrupt)")
	}
	if _, err := rd.br.ReadByte(); err != io.EOF {
		if err != nil {
			return rd.readErr(err)
		}
		return bad("data follows its end record")
	}
	rd.end = true
	return nil
}

// extent reads an extent record's fields after its tag and checks them
// against the image's size and the end of the previous one.
func (rd *Reader) extent(prevEnd int64) (off int64, n int, err error) {
	if _, err := io.ReadFull(rd.body, rd.rec[:12]); err != nil {
		return 0, 0, rd.readErr(err)
	}
	o := binary.BigEndian.Uint64(rd.rec[:8])
	l := binary.BigEndian.Uint32(rd.rec[8:12])
	switch {
	case l == 0 || l > maxRecord:
		return 0, 0, bad("an extent of %d bytes", l)
	case o > uint64(rd.Size) || uint64(l) > uint64(rd.Size)-o:
		return 0, 0, bad("an extent at %d of %d bytes is beyond the image's %d bytes", o, l, rd.Size)
	case int64(o) < prevEnd:
		return 0, 0, bad("an extent at %d overlaps the one before, which ends at %d", o, prevEnd)
	}
	return int64(o), int(l), nil
}

// ExtractImage writes the stream's image into f, a new empty file: it
// makes it the image's logical size and writes the records' data, so that
// what they do not hold stays a hole. The caller removes f when it fails.
func (rd *Reader) ExtractImage(ctx context.Context, f interface {
	io.WriterAt
	Truncate(int64) error
},
) error {
	if rd.Kind != Image {
		return bad("it holds a %s, not an image", rd.Kind)
	}
	if err := f.Truncate(rd.Size); err != nil {
		return err
	}
	buf := make([]byte, maxRecord)
	return rd.extents(ctx, func(off int64, p []byte) error {
		if allZero(p) {
			return nil
		}
		_, err := f.WriteAt(p, off)
		return err
	}, buf)
}

// extents reads every extent record into buf and hands it to fn, up to
// and including the end record.
func (rd *Reader) extents(ctx context.Context, fn func(off int64, p []byte) error, buf []byte) error {
	var prevEnd int64
	for i := 0; ; i++ {
		if i%64 == 0 && ctx.Err() != nil {
			return ctx.Err()
		}
		tag, err := rd.next()
		if err != nil {
			return err
		}
		switch tag {
		case tagEnd:
			return rd.finish()
		case tagExtent:
		default:
			return bad("a record of unknown type %q in an image", tag)
		}
		off, n, err := rd.extent(prevEnd)
		if err != nil {
			return err
		}
		if _, err := io.ReadFull(rd.body, buf[:n]); err != nil {
			return rd.readErr(err)
		}
		if err := fn(off, buf[:n]); err != nil {
			return err
		}
		prevEnd = off + int64(n)
	}
}

// Verify reads the rest of the stream and checks it as an extraction
// would, writing nothing.
func (rd *Reader) Verify(ctx context.Context) error {
	if rd.Kind == Image {
		return rd.extents(ctx, func(int64, []byte) error { return nil }, make([]byte, maxRecord))
	}
	tr := &tarStream{rd: rd, ctx: ctx}
	if _, err := io.Copy(io.Discard, tr); err != nil {
		return err
	}
	return tr.ended()
}

// tarStream reads the tar archive that a tree's records hold, and io.EOF
// at its end record.
type tarStream struct {
	rd   *Reader
	ctx  context.Context
	left int // of the current record
	n    int64
	err  error
}

func (t *tarStream) Read(p []byte) (int, error) {
	if t.err != nil {
		return 0, t.err
	}
	for t.left == 0 {
		if err := t.ctx.Err(); err != nil {
			t.err = err
			return 0, err
		}
		tag, err := t.rd.next()
		if err != nil {
			t.err = err
			return 0, err
		}
		switch tag {
		case tagEnd:
			if err := t.rd.finish(); err != nil {
				t.err = err
				return 0, err
			}
			t.err = io.EOF
			return 0, io.EOF
		case tagTar:
		default:
			t.err = bad("a record of unknown type %q in a tree", tag)
			return 0, t.err
		}
		if _, err := io.ReadFull(t.rd.body, t.rd.rec[:4]); err != nil {
			t.err = t.rd.readErr(err)
			return 0, t.err
		}
		l := binary.BigEndian.Uint32(t.rd.rec[:4])
		if l == 0 || l > maxRecord {
			t.err = bad("a tar record of %d bytes", l)
			return 0, t.err
		}
		t.left = int(l)
	}
	n, err := t.rd.body.Read(p[:min(len(p), t.left)])
	t.left -= n
	t.n += int64(n)
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	if err != nil {
		t.err = t.rd.readErr(err)
		return n, t.err
	}
	if t.n > MaxSize+MaxSize/8 {
		t.err = bad("a tree of more than %d bytes", MaxSize)
		return n, t.err
	}
	return n, nil
}

// ended reads what follows the tar archive's own end (padding) up to the
// stream's end record, and says whether the stream is good.
func (t *tarStream) ended() error {
	if _, err := io.Copy(io.Discard, t); err != nil {
		return err
	}
	if !t.rd.end {
		return t.rd.readErr(io.ErrUnexpectedEOF)
	}
	return nil
}
