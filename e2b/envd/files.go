package envd

// GET and POST /files, and the signed transfer URLs of the SDKs'
// downloadUrl and uploadUrl.

import (
	"compress/gzip"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/files"
)

// filesRoutes mounts GET and POST /files.
func (s *Server) filesRoutes() {
	s.mux.HandleFunc("GET /files", s.getFile)
	s.mux.HandleFunc("POST /files", s.postFiles)
}

// The signing operations, as the SDKs name them.
const (
	signRead  = "read"
	signWrite = "write"
)

// signature computes the signature of a transfer as the SDKs do: "v1_"
// and the unpadded base64 of the SHA-256 of
// path:operation:username:token[:expiration], where path and username
// are the query's values ("" when absent).
func signature(p, op, username, token, expiration string) string {
	raw := p + ":" + op + ":" + username + ":" + token
	if expiration != "" {
		raw += ":" + expiration
	}
	sum := sha256.Sum256([]byte(raw))
	return "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
}

// signedTransfer tells whether r is a GET or POST /files signed with sb's
// access token (the SDK's downloadUrl/uploadUrl): ok when the signature
// is valid, an error when it is present but wrong or expired.
func (s *Server) signedTransfer(r *http.Request, sb *torpor.Sandbox) (ok bool, err error) {
	q := r.URL.Query()
	sig := q.Get("signature")
	if r.URL.Path != "/files" || sig == "" {
		return false, nil
	}
	var op string
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		op = signRead
	case http.MethodPost:
		op = signWrite
	default:
		return false, nil
	}
	if sb.TrafficToken == "" {
		return false, torpor.Errorf(torpor.EUnauthenticated, "invalid signature")
	}
	exp := q.Get("signature_expiration")
	want := signature(q.Get("path"), op, q.Get("username"), sb.TrafficToken, exp)
	if subtle.ConstantTimeCompare([]byte(sig), []byte(want)) != 1 {
		return false, torpor.Errorf(torpor.EUnauthenticated, "invalid signature")
	}
	if exp != "" {
		at, err := strconv.ParseInt(exp, 10, 64)
		if err != nil {
			return false, torpor.Errorf(torpor.EUnauthenticated, "invalid signature expiration")
		}
		if at < time.Now().Unix() {
			return false, torpor.Errorf(torpor.EUnauthenticated, "signature is already expired")
		}
	}
	return true, nil
}

// httpError answers with envd's error body, {"code": status, "message"}.
func (s *Server) httpError(w http.ResponseWriter, err error) {
	e := torpor.AsError(err)
	status := http.StatusInternalServerError
	switch e.Code {
	case torpor.ENotFound:
		status = http.StatusNotFound
	case torpor.EInvalid:
		status = http.StatusBadRequest
	case torpor.EConflict:
		switch e.Reason {
		case "no_space":
			status = http.StatusInsufficientStorage
		case "state", "capacity":
			status = http.StatusBadGateway // the SDKs' "sandbox is not running"
		default:
			status = http.StatusBadRequest
		}
	case torpor.EUnauthenticated:
		status = http.StatusUnauthorized
	case torpor.EForbidden:
		status = http.StatusForbidden
	case torpor.EGone:
		status = http.StatusBadGateway
	case torpor.EUnavailable:
		status = http.StatusServiceUnavailable
	}
	var tooBig *http.MaxBytesError
	var re *files.ReadError
	if errors.As(err, &tooBig) {
		status, e = http.StatusRequestEntityTooLarge, &torpor.Error{Message: fmt.Sprintf("the upload is larger than this server's limit of %d bytes", tooBig.Limit)}
	} else if errors.As(err, &re) {
		status, e = http.StatusBadRequest, &torpor.Error{Message: re.Error()}
	}
	if status == http.StatusInternalServerError {
		s.log.Error("envd files", "err", err)
	}
	writeError(w, status, e.Message)
}

func writeError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(struct {
		Code    int    `json:"code"`
		Message string `json:"message"`
	}{status, msg})
}

// acceptsGzip tells whether the client asked for a gzip body (and not a
// range or a conditional one, which ServeContent answers).
func acceptsGzip(r *http.Request) bool {
	for _, h := range []string{"Range", "If-Modified-Since", "If-None-Match", "If-Range"} {
		if r.Header.Get(h) != "" {
			return false
		}
	}
	// Only a client that asks for gzip alone (the SDK's `gzip` option)
	// gets it: fetch offers "gzip, deflate, br" on every request, and on
	// the short way from the proxy compressing costs far more time than
	// it saves (a 10 MiB file took 15x as long).
	name, params, _ := strings.Cut(strings.TrimSpace(r.Header.Get("Accept-Encoding")), ";")
	return strings.EqualFold(strings.TrimSpace(name), "gzip") && !strings.Contains(name, ",") &&
		strings.ReplaceAll(strings.TrimSpace(params), " ", "") != "q=0"
}

// getFile answers GET /files?path=&username=: the file's bytes, streamed.
func (s *Server) getFile(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	c, done, err := s.open(r.Context(), q.Get("username"), false)
	if err != nil {
		s.httpError(w, err)
		return
	}
	defer done()
	p, err := resolve("path", q.Get("path"), c.user)
	if err != nil {
		s.httpError(w, err)
		return
	}
	f, info, err := c.fs.Open(p)
	if err != nil {
		if torpor.IsCode(err, torpor.ENotFound) {
			err = torpor.Errorf(torpor.ENotFound, "path '%s' does not exist", p)
		} else if st, serr := c.fs.Stat(p); serr == nil && st.Type == files.TypeDir {
			err = torpor.Invalid("path", "path '%s' is a directory", p)
		}
		s.httpError(w, err)
		return
	}
	defer f.Close()
	w.Header().Set("Vary", "Accept-Encoding")
	w.Header().Set("Content-Disposition", mime.FormatMediaType("inline", map[string]string{"filename": path.Base(p)}))
	if acceptsGzip(r) {
		ctype := mime.TypeByExtension(path.Ext(p))
		if ctype == "" {
			ctype = "application/octet-stream"
		}
		w.Header().Set("Content-Type", ctype)
		w.Header().Set("Content-Encoding", "gzip")
		gw := gzip.NewWriter(w)
		if _, err := io.Copy(gw, f); err != nil {
			s.log.Debug("envd files: download cut off", "path", p, "err", err)
			return
		}
		gw.Close()
		return
	}
	http.ServeContent(w, r, p, info.ModTime, f)
}

// uploaded is one file of POST /files's answer.
type uploaded struct {
	Name string `json:"name"`
	Type string `json:"type"`
	Path string `json:"path"`
}

// postFiles answers POST /files: a multipart form whose "file" parts are
// written (each to ?path= or to its file name), or an
// application/octet-stream body written to ?path=. Parent directories
// are made; what is made belongs to the request's user. Bodies stream to
// the sandbox's disk, within the server's upload limit: the body as sent
// and as decompressed each count against it.
func (s *Server) postFiles(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	if s.maxUpload > 0 {
		if r.ContentLength > s.maxUpload {
			writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("the body (%d bytes) is larger than this server's limit of %d bytes", r.ContentLength, s.maxUpload))
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, s.maxUpload)
	}
	var body io.Reader = r.Body
	switch enc := strings.ToLower(strings.TrimSpace(r.Header.Get("Content-Encoding"))); enc {
	case "", "identity":
	case "gzip":
		zr, err := gzip.NewReader(r.Body)
		if err != nil {
			writeError(w, http.StatusBadRequest, "error decompressing request body: "+err.Error())
			return
		}
		defer zr.Close()
		body = zr
		if s.maxUpload > 0 {
			body = http.MaxBytesReader(w, zr, s.maxUpload)
		}
	default:
		writeError(w, http.StatusBadRequest, fmt.Sprintf("unsupported Content-Encoding: %s, supported: [gzip]", enc))
		return
	}
	media, params, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	raw := media == "application/octet-stream"
	if !raw && !strings.HasPrefix(media, "multipart/") {
		writeError(w, http.StatusBadRequest, fmt.Sprintf("unsupported content type: %s, expected multipart/form-data or application/octet-stream", r.Header.Get("Content-Type")))
		return
	}
	if raw && q.Get("path") == "" {
		writeError(w, http.StatusBadRequest, "path query parameter is required for raw body upload")
		return
	}
	c, done, err := s.open(r.Context(), q.Get("username"), true)
	if err != nil {
		s.httpError(w, err)
		return
	}
	defer done()
	var out []uploaded
	if raw {
		p, err := resolve("path", q.Get("path"), c.user)
		if err == nil {
			err = c.write(p, body)
		}
		if err != nil {
			s.httpError(w, err)
			return
		}
		out = append(out, uploaded{Name: path.Base(p), Type: "file", Path: p})
	} else {
		if params["boundary"] == "" {
			writeError(w, http.StatusBadRequest, "the multipart body has no boundary")
			return
		}
		mr, err := newFormReader(body, params["boundary"])
		if err != nil {
			writeError(w, http.StatusBadRequest, err.Error())
			return
		}
		if out, err = c.writeParts(mr, q.Get("path")); err != nil {
			s.httpError(w, err)
			return
		}
	}
	if out == nil {
		out = []uploaded{}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}

// write writes the file p from src as the call's user.
func (c *fsCall) write(p string, src io.Reader) error {
	if st, err := c.fs.Stat(p); err == nil && st.Type == files.TypeDir {
		return torpor.Invalid("path", "path is a directory: %s", p)
	}
	_, err := c.fs.Write(p, src, files.WriteOptions{Owner: c.user.owner()})
	if err != nil && torpor.IsCode(err, torpor.EConflict) && strings.Contains(torpor.AsError(err).Message, "is a directory") {
		return torpor.Invalid("path", "path is a directory: %s", p)
	}
	return err
}

// writeParts writes each "file" part of a form: to target when given,
// else to the part's file name, a path (read whole from the part's
// Content-Disposition, not cut to its base name).
func (c *fsCall) writeParts(mr *formReader, target string) ([]uploaded, error) {
	var out []uploaded
	seen := map[string]bool{}
	for {
		part, err := mr.NextPart()
		if err == io.EOF {
			return out, nil
		}
		if err != nil {
			if errors.As(err, new(*http.MaxBytesError)) {
				return nil, err
			}
			return nil, torpor.Invalid("body", "error reading the multipart form: %v", err)
		}
		if part.FormName() != "file" {
			part.Close()
			continue
		}
		name := target
		if name == "" {
			_, dp, err := mime.ParseMediaType(part.Header.Get("Content-Disposition"))
			if err != nil || dp["filename"] == "" {
				part.Close()
				return nil, torpor.Invalid("path", "a part has no file name and the request no path")
			}
			name = dp["filename"]
		}
		p, err := resolve("path", name, c.user)
		if err != nil {
			part.Close()
			return nil, err
		}
		if seen[p] {
			part.Close()
			return nil, torpor.Invalid("path", "you cannot upload multiple files to the same path '%s' in one upload request", p)
		}
		seen[p] = true
		err = c.write(p, part)
		part.Close()
		if err != nil {
			return nil, err
		}
		out = append(out, uploaded{Name: path.Base(p), Type: "file", Path: p})
	}
}
