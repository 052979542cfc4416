package s3test

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// minio-go signs uploads over plain HTTP chunk by chunk
// (STREAMING-AWS4-HMAC-SHA256-PAYLOAD), which wraps the object's bytes in
// the aws-chunked encoding. gofakes3 v1.2.0 unwraps it for PutObject but
// not for UploadPart, where it would store the chunk headers as part of
// the object; decodeAWSChunked unwraps every upload before gofakes3 sees
// it, as if it had been sent unsigned.

const (
	streamingPayload        = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD"
	streamingPayloadTrailer = "STREAMING-AWS4-HMAC-SHA256-PAYLOAD-TRAILER"
	unsignedTrailer         = "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
)

// decodeAWSChunked replaces the body of an aws-chunked upload with the
// bytes it carries, and its headers with those of a plain upload.
func decodeAWSChunked(r *http.Request) error {
	switch r.Header.Get("X-Amz-Content-Sha256") {
	case streamingPayload:
	case streamingPayloadTrailer, unsignedTrailer:
		// minio-go sends these only with Options.TrailingHeaders, which
		// objstore leaves off.
		return errors.New("s3test: uploads with trailing checksums are not supported")
	default:
		return nil
	}
	size, err := strconv.ParseInt(r.Header.Get("X-Amz-Decoded-Content-Length"), 10, 64)
	if err != nil || size < 0 {
		return errors.New("s3test: an aws-chunked upload without a valid X-Amz-Decoded-Content-Length")
	}
	r.Body = &awsChunkedReader{body: r.Body, br: bufio.NewReader(r.Body), want: size}
	r.ContentLength = size
	r.Header.Set("Content-Length", strconv.FormatInt(size, 10))
	r.Header.Set("X-Amz-Content-Sha256", "UNSIGNED-PAYLOAD")
	r.Header.Del("X-Amz-Decoded-Content-Length")
	// The object's own encoding, if it has one, is what is left once
	// aws-chunked is taken off.
	var encs []string
	for enc := range strings.SplitSeq(r.Header.Get("Content-Encoding"), ",") {
		if enc = strings.TrimSpace(enc); enc != "" && enc != "aws-chunked" {
			encs = append(encs, enc)
		}
	}
	if len(encs) == 0 {
		r.Header.Del("Content-Encoding")
	} else {
		r.Header.Set("Content-Encoding", strings.Join(encs, ","))
	}
	return nil
}

// awsChunkedReader reads the data out of an aws-chunked body: chunks of
// "HEX-SIZE;chunk-signature=SIGNATURE\r\n", the data and "\r\n", the last
// of size 0. It checks the sizes, not the signatures.
type awsChunkedReader struct {
	body io.Closer
	br   *bufio.Reader
	want int64 // the decoded length the headers announced
	got  int64
	left int64 // bytes left in the current chunk
	more bool  // a chunk's data was read, its "\r\n" is next
	err  error
}

func (c *awsChunkedReader) Read(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	if c.left == 0 {
		if err := c.next(); err != nil {
			c.err = err
			return 0, err
		}
	}
	n, err := c.br.Read(p[:min(int64(len(p)), c.left)])
	c.left -= int64(n)
	c.got += int64(n)
	if errors.Is(err, io.EOF) {
		err = io.ErrUnexpectedEOF
	}
	if err != nil {
		c.err = err
	}
	return n, err
}

// next reads the header of the next chunk; the last one ends the body.
func (c *awsChunkedReader) next() error {
	if c.more {
		var crlf [2]byte
		if _, err := io.ReadFull(c.br, crlf[:]); err != nil {
			return noEOF(err)
		}
		if string(crlf[:]) != "\r\n" {
			return errors.New("s3test: aws-chunked data not followed by CRLF")
		}
	}
	line, err := c.br.ReadSlice('\n')
	if err != nil {
		return noEOF(err)
	}
	hexSize, _, _ := strings.Cut(strings.TrimRight(string(line), "\r\n"), ";")
	size, err := strconv.ParseInt(hexSize, 16, 64)
	if err != nil || size < 0 {
		return fmt.Errorf("s3test: bad aws-chunked chunk header %q", line)
	}
	if size == 0 {
		if c.got != c.want {
			return fmt.Errorf("s3test: aws-chunked body of %d bytes, announced %d", c.got, c.want)
		}
		return io.EOF
	}
	if c.got+size > c.want {
		return fmt.Errorf("s3test: aws-chunked body longer than the %d bytes announced", c.want)
	}
	c.left, c.more = size, true
	return nil
}

// noEOF turns the end of a body in the middle of a chunk into the error
// it is.
func noEOF(err error) error {
	if errors.Is(err, io.EOF) {
		return io.ErrUnexpectedEOF
	}
	return err
}

func (c *awsChunkedReader) Close() error { return c.body.Close() }
