package api

import (
	"archive/tar"
	"bufio"
	"bytes"
	"errors"
	"io"
	"net/http"
	"strconv"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/wire"
	"github.com/torpor-dev/torpor/files"
)

// The files endpoints (docs/files.md). Every input is checked before the
// engine is asked for the sandbox's files, so bad input never wakes a
// sandbox. Reads leave a paused sandbox paused; writes follow its
// auto_resume rule (lifecycle.Engine.Files).

// withFiles opens the sandbox's root filesystem for fn and ends the
// operation (activity, busy mark) when fn returns.
//
// Under /v1/volumes/{name}/files it opens the tenant's volume instead
// (volumes.go): the same handlers, the same confinement.
func (s *Server) withFiles(r *http.Request, p principal, write bool, fn func(fsys files.FS) error) error {
	if r.PathValue("id") == "" {
		fsys, err := s.eng.VolumeFS(r.Context(), p.tenant, r.PathValue("name"))
		if err != nil {
			return err
		}
		defer fsys.Close()
		return fn(fsys)
	}
	fsys, done, err := s.eng.Files(r.Context(), p.tenant, r.PathValue("id"), write)
	if err != nil {
		return err
	}
	defer done()
	return fn(fsys)
}

// queryPath reads and checks the path query parameter; def, when not
// empty, stands for a missing one.
func queryPath(r *http.Request, def string) (string, error) {
	v := r.URL.Query().Get("path")
	if v == "" && def != "" {
		v = def
	}
	return files.Clean("path", v)
}

// notRoot refuses the root directory where a write or a removal names a
// path, before the sandbox is woken for it.
func notRoot(param, path string) error {
	if path == "/" {
		return torpor.Invalid(param, "this cannot be done to the root directory")
	}
	return nil
}

// queryMode reads the optional octal mode query parameter.
func queryMode(r *http.Request) (*files.Mode, error) {
	v := r.URL.Query().Get("mode")
	if v == "" {
		return nil, nil
	}
	m, err := files.ParseMode("mode", v)
	return &m, err
}

// body returns the request body bounded by the server's upload limit; a
// declared Content-Length over the limit is refused before anything
// happens.
func (s *Server) body(w http.ResponseWriter, r *http.Request) (io.Reader, error) {
	if s.maxUpload <= 0 {
		return r.Body, nil
	}
	if r.ContentLength > s.maxUpload {
		return nil, torpor.Invalid("body", "the body (%d bytes) is larger than the server's limit of %d bytes", r.ContentLength, s.maxUpload)
	}
	return http.MaxBytesReader(w, r.Body, s.maxUpload), nil
}

// bodyError turns a failure to read the request body into a 400.
func bodyError(err error) error {
	var tooBig *http.MaxBytesError
	if errors.As(err, &tooBig) {
		return torpor.Invalid("body", "the body is larger than the server's limit of %d bytes", tooBig.Limit)
	}
	var re *files.ReadError
	if errors.As(err, &re) {
		return torpor.Invalid("body", "cannot read the body: %v", re.Err)
	}
	return err
}

func (s *Server) readFile(w http.ResponseWriter, r *http.Request, p principal) error {
	path, err := queryPath(r, "")
	if err != nil {
		return err
	}
	return s.withFiles(r, p, false, func(root files.FS) error {
		f, info, err := root.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		w.Header().Set("Content-Type", "application/octet-stream")
		http.ServeContent(w, r, info.Name, info.ModTime, f)
		return nil
	})
}

func (s *Server) writeFile(w http.ResponseWriter, r *http.Request, p principal) error {
	path, err := queryPath(r, "")
	if err == nil {
		err = notRoot("path", path)
	}
	if err != nil {
		return err
	}
	mode, err := queryMode(r)
	if err != nil {
		return err
	}
	body, err := s.body(w, r)
	if err != nil {
		return err
	}
	return s.withFiles(r, p, true, func(root files.FS) error {
		info, err := root.Write(path, body, files.WriteOptions{Mode: mode})
		if err != nil {
			return bodyError(err)
		}
		writeJSON(w, http.StatusOK, info)
		return nil
	})
}

func (s *Server) removeFile(w http.ResponseWriter, r *http.Request, p principal) error {
	path, err := queryPath(r, "")
	if err == nil {
		err = notRoot("path", path)
	}
	if err != nil {
		return err
	}
	recursive, err := queryBool(r, "recursive")
	if err != nil {
		return err
	}
	return s.withFiles(r, p, true, func(root files.FS) error {
		if err := root.Remove(path, recursive); err != nil {
			return err
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	})
}

func (s *Server) statFile(w http.ResponseWriter, r *http.Request, p principal) error {
	path, err := queryPath(r, "")
	if err != nil {
		return err
	}
	return s.withFiles(r, p, false, func(root files.FS) error {
		info, err := root.Stat(path)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, info)
		return nil
	})
}

func (s *Server) listFiles(w http.ResponseWriter, r *http.Request, p principal) error {
	path, err := queryPath(r, "/")
	if err != nil {
		return err
	}
	depth := 1
	if v := r.URL.Query().Get("depth"); v != "" {
		if depth, err = strconv.Atoi(v); err != nil || depth < 1 || depth > files.MaxDepth {
			return torpor.Invalid("depth", "must be an integer between 1 and %d", files.MaxDepth)
		}
	}
	return s.withFiles(r, p, false, func(root files.FS) error {
		l, err := root.List(path, depth, files.MaxEntries)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, l)
		return nil
	})
}

func (s *Server) mkdir(w http.ResponseWriter, r *http.Request, p principal) error {
	var req wire.MkdirRequest
	if err := decode(r, &req, false); err != nil {
		return err
	}
	path, err := files.Clean("path", req.Path)
	if err != nil {
		return err
	}
	o := files.MkdirOptions{Parents: req.Parents}
	if req.Mode != "" {
		m, err := files.ParseMode("mode", req.Mode)
		if err != nil {
			return err
		}
		o.Mode = &m
	}
	return s.withFiles(r, p, true, func(root files.FS) error {
		info, err := root.Mkdir(path, o)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, info)
		return nil
	})
}

func (s *Server) rename(w http.ResponseWriter, r *http.Request, p principal) error {
	var req wire.RenameRequest
	if err := decode(r, &req, false); err != nil {
		return err
	}
	from, err := files.Clean("from", req.From)
	if err != nil {
		return err
	}
	to, err := files.Clean("to", req.To)
	if err != nil {
		return err
	}
	if err := notRoot("from", from); err != nil {
		return err
	}
	if err := notRoot("to", to); err != nil {
		return err
	}
	return s.withFiles(r, p, true, func(root files.FS) error {
		info, err := root.Rename(from, to, req.Overwrite)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, info)
		return nil
	})
}

func (s *Server) downloadTar(w http.ResponseWriter, r *http.Request, p principal) error {
	path, err := queryPath(r, "")
	if err != nil {
		return err
	}
	return s.withFiles(r, p, false, func(root files.FS) error {
		lw := &lazyWriter{w: w, contentType: "application/x-tar"}
		bw := bufio.NewWriterSize(lw, 64<<10)
		err := root.WriteTar(bw, path)
		if err == nil {
			err = bw.Flush()
		}
		if err != nil && lw.started {
			// Too late for an error response: cut the connection, so
			// that the client sees a broken archive, never a short one.
			s.log.Warn("tar download failed mid-stream", "sandbox", r.PathValue("id"), "path", path, "err", err)
			panic(http.ErrAbortHandler)
		}
		return err
	})
}

func (s *Server) uploadTar(w http.ResponseWriter, r *http.Request, p principal) error {
	path, err := queryPath(r, "")
	if err != nil {
		return err
	}
	body, err := s.body(w, r)
	if err != nil {
		return err
	}
	tarBody := bufio.NewReaderSize(body, tarBlock)
	if err := checkTarStart(tarBody); err != nil {
		return err
	}
	return s.withFiles(r, p, true, func(root files.FS) error {
		res, err := root.ExtractTar(path, tarBody)
		if err != nil {
			var re *files.ReadError
			if errors.As(err, &re) && !errors.As(err, new(*http.MaxBytesError)) {
				return torpor.Invalid("body", "the archive is malformed or was cut after %d entries: %v", res.Entries, re.Err)
			}
			return bodyError(err)
		}
		writeJSON(w, http.StatusOK, res)
		return nil
	})
}

// tarBlock is the size of a tar header.
const tarBlock = 512

// checkTarStart refuses a body whose first block is not a tar header
// before the sandbox is asked for anything, so that an archive malformed
// from its start changes nothing (the target directory is made before the
// first entry). One found malformed later keeps the entries before the
// fault (docs/files.md). An empty body is an empty archive.
func checkTarStart(br *bufio.Reader) error {
	head, err := br.Peek(tarBlock)
	switch {
	case len(head) == 0 && errors.Is(err, io.EOF):
		return nil
	case errors.Is(err, io.EOF):
		return torpor.Invalid("body", "the archive is malformed or was cut after 0 entries: %d bytes, less than one tar header", len(head))
	case err != nil:
		return bodyError(&files.ReadError{Err: err})
	}
	// A header that needs the blocks after it (a long name) is left to
	// the extraction: only a block that is no header is refused here.
	if _, err := tar.NewReader(bytes.NewReader(head)).Next(); errors.Is(err, tar.ErrHeader) {
		return torpor.Invalid("body", "the archive is malformed or was cut after 0 entries: %v", err)
	}
	return nil
}

// lazyWriter starts a 200 response with its content type at the first
// write, so that an error found before any byte is ready can still be an
// error response.
type lazyWriter struct {
	w           http.ResponseWriter
	contentType string
	started     bool
}

func (l *lazyWriter) Write(p []byte) (int, error) {
	if !l.started {
		l.w.Header().Set("Content-Type", l.contentType)
		l.w.WriteHeader(http.StatusOK)
		l.started = true
	}
	return l.w.Write(p)
}
