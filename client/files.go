package client

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"

	"github.com/torpor-dev/torpor/api/wire"
	"github.com/torpor-dev/torpor/files"
)

// FileInfo describes a file in a sandbox; see docs/files.md.
type FileInfo = wire.FileInfo

// FileList is a directory listing.
type FileList = wire.FileList

// TarResult tells what an upload of a tar archive extracted.
type TarResult = wire.TarResult

// FileMode is a file's permission bits (0..07777).
type FileMode = files.Mode

// WriteOptions tune WriteFile.
type WriteOptions struct {
	// Mode sets the file's permission bits; nil keeps those of the file
	// it replaces, or 0644 for a new one.
	Mode *FileMode
}

// Mode returns a pointer to m, for WriteOptions and MkdirOptions.
func Mode(m FileMode) *FileMode { return &m }

// MkdirOptions tune Mkdir.
type MkdirOptions struct {
	// Parents makes missing parents and accepts an existing directory.
	Parents bool
	// Mode of the new directory; nil is 0755.
	Mode *FileMode
}

func filesPath(id, sub string) string {
	if name, ok := strings.CutPrefix(id, volumeRef); ok {
		return "/v1/volumes/" + url.PathEscape(name) + "/files" + sub
	}
	return "/v1/sandboxes/" + url.PathEscape(id) + "/files" + sub
}

// ReadFile streams the file at path in a sandbox (a sandbox path, such as
// "/root/data.csv"). Close the reader when done. Reading the files of a
// paused sandbox does not wake it.
func (c *Client) ReadFile(ctx context.Context, id, path string) (io.ReadCloser, error) {
	resp, err := c.send(ctx, "GET", filesPath(id, ""), url.Values{"path": {path}}, nil, "application/octet-stream")
	if err != nil {
		return nil, err
	}
	return bigReads{resp.Body}, nil
}

// bigReads makes io.Copy from a response body use a large buffer (through
// WriteTo) rather than 32 KiB pieces.
type bigReads struct{ io.ReadCloser }

// WriteTo copies the whole body to w.
func (b bigReads) WriteTo(w io.Writer) (int64, error) {
	return io.CopyBuffer(onlyWriter{w}, onlyReader{b.ReadCloser}, make([]byte, 256<<10))
}

// onlyWriter and onlyReader hide ReadFrom and WriteTo from io.CopyBuffer.
type (
	onlyWriter struct{ io.Writer }
	onlyReader struct{ io.Reader }
)

// WriteFile replaces the file at path with what r holds, making missing
// parent directories; the file changes at once when r is fully sent (a
// failed upload leaves nothing). r is streamed: when it is an *os.File or
// has a Len (bytes.Reader, strings.Reader), its size is sent ahead.
func (c *Client) WriteFile(ctx context.Context, id, path string, r io.Reader, o *WriteOptions) (*FileInfo, error) {
	q := url.Values{"path": {path}}
	if o != nil && o.Mode != nil {
		q.Set("mode", o.Mode.String())
	}
	var info FileInfo
	return &info, c.upload(ctx, filesPath(id, ""), q, r, "application/octet-stream", &info)
}

// ListFiles lists the directory at path, depth levels down (0 is 1).
func (c *Client) ListFiles(ctx context.Context, id, path string, depth int) (*FileList, error) {
	q := url.Values{"path": {path}}
	if depth > 0 {
		q.Set("depth", strconv.Itoa(depth))
	}
	var out FileList
	return &out, c.do(ctx, "GET", filesPath(id, "/list"), q, nil, &out)
}

// StatFile describes the file at path without following a final symlink.
func (c *Client) StatFile(ctx context.Context, id, path string) (*FileInfo, error) {
	var out FileInfo
	return &out, c.do(ctx, "GET", filesPath(id, "/stat"), url.Values{"path": {path}}, nil, &out)
}

// Mkdir makes a directory.
func (c *Client) Mkdir(ctx context.Context, id, path string, o *MkdirOptions) (*FileInfo, error) {
	req := wire.MkdirRequest{Path: path}
	if o != nil {
		req.Parents = o.Parents
		if o.Mode != nil {
			req.Mode = o.Mode.String()
		}
	}
	var out FileInfo
	return &out, c.do(ctx, "POST", filesPath(id, "/mkdir"), nil, req, &out)
}

// Rename moves a file or directory; without overwrite an existing
// destination is a conflict.
func (c *Client) Rename(ctx context.Context, id, from, to string, overwrite bool) (*FileInfo, error) {
	var out FileInfo
	return &out, c.do(ctx, "POST", filesPath(id, "/rename"), nil, wire.RenameRequest{From: from, To: to, Overwrite: overwrite}, &out)
}

// RemoveFile deletes a file, a symlink, an empty directory, or with
// recursive any directory.
func (c *Client) RemoveFile(ctx context.Context, id, path string, recursive bool) error {
	q := url.Values{"path": {path}}
	if recursive {
		q.Set("recursive", "true")
	}
	return c.do(ctx, "DELETE", filesPath(id, ""), q, nil, nil)
}

// UploadTar extracts the tar archive r into the directory dir (made when
// missing) and says what it extracted and skipped.
func (c *Client) UploadTar(ctx context.Context, id, dir string, r io.Reader) (*TarResult, error) {
	var out TarResult
	return &out, c.upload(ctx, filesPath(id, "/tar"), url.Values{"path": {dir}}, r, "application/x-tar", &out)
}

// DownloadTar streams path as a tar archive: a directory's contents
// relative to it, or a single file under its base name. A stream that
// ends in an error (rather than at the archive's end) was cut by the
// server: the archive is incomplete.
func (c *Client) DownloadTar(ctx context.Context, id, path string) (io.ReadCloser, error) {
	resp, err := c.send(ctx, "GET", filesPath(id, "/tar"), url.Values{"path": {path}}, nil, "application/x-tar")
	if err != nil {
		return nil, err
	}
	return bigReads{resp.Body}, nil
}

// upload sends r as a raw request body and decodes the JSON answer into
// out. It is not retried: a stream cannot be sent twice.
func (c *Client) upload(ctx context.Context, path string, query url.Values, r io.Reader, contentType string, out any) error {
	u := *c.base
	u.Path = c.base.Path + path
	u.RawQuery = query.Encode()
	if r == nil {
		r = http.NoBody
	}
	req, err := http.NewRequestWithContext(ctx, "PUT", u.String(), r)
	if err != nil {
		return err
	}
	req.ContentLength = sizeOf(r)
	if req.ContentLength == 0 {
		req.Body = http.NoBody
	}
	req.Header.Set("Content-Type", contentType)
	req.Header.Set("Accept", "application/json")
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 400 {
		return decodeError(resp)
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("client: decoding PUT %s: %w", path, err)
	}
	return nil
}

// sizeOf returns the number of bytes r will yield when it can tell, else
// -1 (the body is then sent chunked).
func sizeOf(r io.Reader) int64 {
	switch v := r.(type) {
	case *bytes.Reader:
		return int64(v.Len())
	case *bytes.Buffer:
		return int64(v.Len())
	case *strings.Reader:
		return int64(v.Len())
	case *os.File:
		st, err := v.Stat()
		if err != nil || !st.Mode().IsRegular() {
			return -1
		}
		pos, err := v.Seek(0, io.SeekCurrent)
		if err != nil {
			return -1
		}
		return st.Size() - pos
	}
	if r == http.NoBody {
		return 0
	}
	return -1
}
