package envd

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/textproto"
	"strings"
)

// formReader reads a multipart/form-data body (RFC 7578) part by part,
// as mime/multipart.Reader does, for POST /files. It finds the end of a
// part's content with one search per buffer of data and hands the bytes
// on in large pieces: mime/multipart reads through a 4 KiB buffer and
// scans it again at every read, which cost a 10 MiB upload eight times
// the time of copying it (BENCHMARKS.md). Line ends are CRLF, as every
// HTTP client writes them; a body that does not follow the grammar is an
// error, never a guess.
type formReader struct {
	br    *bufio.Reader
	delim []byte // CRLF "--" boundary: where a part's content ends
	dash  []byte // "--" boundary: the first delimiter line
	cur   *formPart
	begun bool
	done  bool
}

// Bounds of what the reader keeps in memory.
const (
	formBuffer       = 64 << 10
	maxFormPreamble  = 64 << 10
	maxPartHeaders   = 64 << 10
	maxPartHeaderNum = 100
)

var errFormSyntax = errors.New("malformed multipart body")

// newFormReader reads body, whose boundary is boundary (RFC 2046: 1 to 70
// characters).
func newFormReader(body io.Reader, boundary string) (*formReader, error) {
	if boundary == "" || len(boundary) > 70 || strings.ContainsAny(boundary, "\r\n") {
		return nil, fmt.Errorf("%w: invalid boundary", errFormSyntax)
	}
	return &formReader{
		br:    bufio.NewReaderSize(body, formBuffer),
		delim: []byte("\r\n--" + boundary),
		dash:  []byte("--" + boundary),
	}, nil
}

// formPart is one part: its headers, then its content (Read).
type formPart struct {
	Header textproto.MIMEHeader
	f      *formReader
	// safe is how many of the buffered bytes are content for sure; found
	// says the delimiter follows them.
	safe  int
	found bool
	ended bool
	// fresh: nothing of the content was read yet; cut is the length of
	// the delimiter found (a content that begins with "--" boundary is
	// empty, as mime/multipart reads it: the blank line's CRLF stands for
	// the delimiter's).
	fresh bool
	cut   int
}

// FormName is the part's form field name (Content-Disposition: form-data;
// name=...), "" when it has none.
func (p *formPart) FormName() string {
	d, params, err := mime.ParseMediaType(p.Header.Get("Content-Disposition"))
	if err != nil || d != "form-data" {
		return ""
	}
	return params["name"]
}

// NextPart skips what is left of the current part and returns the next
// one; io.EOF after the last.
func (f *formReader) NextPart() (*formPart, error) {
	if f.cur != nil {
		if _, err := io.Copy(io.Discard, f.cur); err != nil {
			return nil, err
		}
		f.cur = nil
	}
	if f.done {
		return nil, io.EOF
	}
	if !f.begun {
		if err := f.skipPreamble(); err != nil {
			return nil, err
		}
		f.begun = true
		if f.done {
			return nil, io.EOF
		}
	}
	h, err := f.readHeaders()
	if err != nil {
		return nil, err
	}
	f.cur = &formPart{Header: h, f: f, fresh: true}
	return f.cur, nil
}

// skipPreamble reads up to and past the first delimiter line.
func (f *formReader) skipPreamble() error {
	read := 0
	for {
		line, err := f.readLine(maxFormPreamble - read)
		if err != nil {
			return err
		}
		read += len(line)
		if rest, ok := bytes.CutPrefix(line, f.dash); ok {
			if final, ok := delimiterEnd(rest); ok {
				f.done = final
				return nil
			}
		}
		// Any other line is preamble.
	}
}

// delimiterEnd reads what follows a boundary on its line: blanks (a
// delimiter: a part follows), or "--" and blanks (the last one); ok is
// false for anything else.
func delimiterEnd(rest []byte) (final, ok bool) {
	if r, last := bytes.CutPrefix(rest, []byte("--")); last {
		return true, len(bytes.Trim(r, " \t")) == 0
	}
	return false, len(bytes.Trim(rest, " \t")) == 0
}

// readLine reads one CRLF-ended line of at most max bytes and returns it
// without its CRLF.
func (f *formReader) readLine(max int) ([]byte, error) {
	var line []byte
	for {
		chunk, err := f.br.ReadSlice('\n')
		line = append(line, chunk...)
		if len(line) > max {
			return nil, fmt.Errorf("%w: a line or the headers are too long", errFormSyntax)
		}
		switch {
		case err == bufio.ErrBufferFull:
			continue
		case err == io.EOF:
			return nil, io.ErrUnexpectedEOF
		case err != nil:
			return nil, err
		}
		if !bytes.HasSuffix(line, []byte("\r\n")) {
			return nil, fmt.Errorf("%w: a line ends without CRLF", errFormSyntax)
		}
		return line[:len(line)-2], nil
	}
}

// readHeaders reads a part's header lines up to the empty line.
func (f *formReader) readHeaders() (textproto.MIMEHeader, error) {
	h := textproto.MIMEHeader{}
	read := 0
	for n := 0; ; n++ {
		line, err := f.readLine(maxPartHeaders - read)
		if err != nil {
			return nil, err
		}
		read += len(line) + 2
		if len(line) == 0 {
			return h, nil
		}
		if n == maxPartHeaderNum {
			return nil, fmt.Errorf("%w: too many part headers", errFormSyntax)
		}
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok || len(name) == 0 || bytes.ContainsAny(name, " \t") || line[0] == ' ' || line[0] == '\t' {
			return nil, fmt.Errorf("%w: a bad part header", errFormSyntax)
		}
		h.Add(textproto.CanonicalMIMEHeaderKey(string(name)), string(bytes.Trim(value, " \t")))
	}
}

// Read reads the part's content.
func (p *formPart) Read(b []byte) (int, error) {
	if p.ended {
		return 0, io.EOF
	}
	f := p.f
	if p.safe == 0 && !p.found {
		if err := p.scan(); err != nil {
			return 0, err
		}
	}
	if p.safe == 0 {
		// The delimiter is next: the part ends.
		if _, err := f.br.Discard(p.cut); err != nil {
			return 0, err
		}
		p.ended = true
		// The rest of the delimiter's line: the last one's may end the
		// body without a CRLF (what follows a CRLF is an epilogue).
		rest, err := f.br.ReadSlice('\n')
		if err != nil && err != io.EOF {
			return 0, fmt.Errorf("%w: a boundary line is too long", errFormSyntax)
		}
		eol := bytes.HasSuffix(rest, []byte("\r\n"))
		rest = bytes.TrimSuffix(rest, []byte("\r\n"))
		final, ok := delimiterEnd(rest)
		if !ok || (!final && !eol) {
			return 0, fmt.Errorf("%w: a boundary is followed by other text", errFormSyntax)
		}
		f.done = final
		return 0, io.EOF
	}
	n, err := f.br.Read(b[:min(len(b), p.safe)])
	p.safe -= n
	return n, err
}

// scan finds how much of what is buffered is content: up to the
// delimiter when it is there, else all but the last bytes that could
// begin it (reading more when too little is buffered).
func (p *formPart) scan() error {
	f := p.f
	for {
		buf, err := f.br.Peek(max(f.br.Buffered(), len(f.delim)))
		if p.fresh && len(buf) >= len(f.dash) {
			p.fresh = false
			if bytes.HasPrefix(buf, f.dash) {
				p.safe, p.found, p.cut = 0, true, len(f.dash)
				return nil
			}
		}
		if i := bytes.Index(buf, f.delim); i >= 0 {
			p.safe, p.found, p.cut = i, true, len(f.delim)
			return nil
		}
		if n := len(buf) - (len(f.delim) - 1); n > 0 {
			p.safe = n
			return nil
		}
		if err != nil {
			if err == io.EOF {
				return io.ErrUnexpectedEOF
			}
			return err
		}
	}
}

// Close skips the rest of the part.
func (p *formPart) Close() error {
	_, err := io.Copy(io.Discard, p)
	return err
}
