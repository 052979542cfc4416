package api

import (
	"encoding/json"
	"errors"
	"io"
	"mime"
	"net/http"
	"strconv"
	"strings"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/wire"
)

// maxBody bounds a request body.
const maxBody = 1 << 20

// decode reads a JSON body strictly: the right content type, no unknown
// fields, one value, bounded size. An empty body leaves v as it is when
// optional.
func decode(r *http.Request, v any, optional bool) error {
	return decodeLimit(r, v, optional, maxBody)
}

// decodeLimit is decode with a body of at most maxBody bytes.
func decodeLimit(r *http.Request, v any, optional bool, maxBody int) error {
	body, err := io.ReadAll(io.LimitReader(r.Body, int64(maxBody)+1))
	if err != nil {
		return torpor.Invalid("body", "cannot read the request body")
	}
	if len(body) > maxBody {
		return torpor.Invalid("body", "the request body is larger than %d bytes", maxBody)
	}
	if len(strings.TrimSpace(string(body))) == 0 {
		if optional {
			return nil
		}
		return torpor.Invalid("body", "a JSON body is required")
	}
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		return torpor.Invalid("Content-Type", "send the body as application/json")
	}
	dec := json.NewDecoder(strings.NewReader(string(body)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return jsonError(err)
	}
	if dec.More() {
		return torpor.Invalid("body", "the body must hold one JSON value")
	}
	if _, err := dec.Token(); err != io.EOF {
		return torpor.Invalid("body", "the body must hold one JSON value")
	}
	return nil
}

// jsonError names the field a decoding error is about.
func jsonError(err error) error {
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case errors.As(err, &typeErr):
		field := jsonPath(typeErr.Field)
		if field == "" {
			field = "body"
		}
		return torpor.Invalid(field, "must be of type %s", jsonKind(typeErr.Type.Kind().String()))
	case errors.As(err, &syntaxErr):
		return torpor.Invalid("body", "malformed JSON at byte %d", syntaxErr.Offset)
	case strings.HasPrefix(err.Error(), "json: unknown field "):
		name := strings.Trim(strings.TrimPrefix(err.Error(), "json: unknown field "), `"`)
		return torpor.Invalid(name, "unknown field %q", name)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return torpor.Invalid("body", "truncated JSON")
	}
	return torpor.Invalid("body", "malformed JSON")
}

// jsonPath drops the names of embedded Go structs (capitalized) from a
// decoder's field path, leaving the JSON names a caller sent.
func jsonPath(p string) string {
	var keep []string
	for _, part := range strings.Split(p, ".") {
		if part != "" && !(part[0] >= 'A' && part[0] <= 'Z') {
			keep = append(keep, part)
		}
	}
	return strings.Join(keep, ".")
}

func jsonKind(k string) string {
	switch k {
	case "int", "int64", "int32", "float64", "float32", "uint", "uint64":
		return "number"
	case "map", "struct":
		return "object"
	case "slice":
		return "array"
	}
	return k
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	_ = enc.Encode(v)
}

// writeError writes err in the error shape. Internal errors are logged with
// their details and shown without them.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	e := torpor.AsError(err)
	if e.Code == torpor.EInternal {
		s.log.Error("internal error", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	if e.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int((e.RetryAfter+999_999_999)/1_000_000_000)))
	}
	writeJSON(w, wire.Status(e.Code), wire.ErrorBody{Error: wire.ErrorDetail{
		Code: e.Code, Message: e.Message, Param: e.Param, Reason: e.Reason, State: e.State,
	}})
}

// queryBool reads a boolean query parameter.
func queryBool(r *http.Request, name string) (bool, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return false, torpor.Invalid(name, "must be true or false")
	}
	return b, nil
}

// queryInt reads a non-negative integer query parameter.
func queryInt(r *http.Request, name string, def int64) (int64, error) {
	v := r.URL.Query().Get(name)
	if v == "" {
		return def, nil
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil || n < 0 {
		return 0, torpor.Invalid(name, "must be a non-negative integer")
	}
	return n, nil
}
