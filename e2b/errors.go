package e2b

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

// errorBody is E2B's error shape; the SDKs branch on code.
type errorBody struct {
	Code      int    `json:"code"`
	Message   string `json:"message"`
	ErrorCode string `json:"error_code,omitempty"`
}

// errCapacity is E2B's error_code for a node that cannot take a sandbox
// now.
const errCapacity = "sandbox_capacity_unavailable"

// status maps an error to E2B's status, error_code and message. It is
// torpor's one table (api/wire) with E2B's exceptions: a terminated
// sandbox is not found (the SDK's kill then returns false and getInfo
// throws its not-found error), and a node without capacity is 429 with
// Retry-After, which the SDK retries by itself before it gives up.
func status(e *torpor.Error) (int, string) {
	switch {
	case e.Code == torpor.EGone:
		return http.StatusNotFound, ""
	case e.Code == torpor.EConflict && e.Reason == "capacity":
		return http.StatusTooManyRequests, errCapacity
	}
	return wire.Status(e.Code), ""
}

// writeError writes err in E2B's shape. Internal errors are logged with
// their details and shown without them.
func (a *API) writeError(w http.ResponseWriter, r *http.Request, err error) {
	e := torpor.AsError(err)
	if e.Code == torpor.EInternal {
		a.log.Error("internal error", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	code, errCode := status(e)
	if e.RetryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int((e.RetryAfter+999_999_999)/1_000_000_000)))
	}
	msg := e.Message
	if e.Param != "" && e.Code == torpor.EInvalid && !strings.Contains(msg, e.Param) {
		msg = e.Param + ": " + msg
	}
	writeJSON(w, code, errorBody{Code: code, Message: msg, ErrorCode: errCode})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// maxBody bounds a request body.
const maxBody = 1 << 20

// decode reads an optional JSON body into v. Fields E2B defines but
// torpor does not serve are refused by the handlers; fields nobody
// defines are ignored, as E2B's API does, so newer SDKs keep working. A
// value of the wrong type is a 400 naming the field.
func decode(r *http.Request, v any) (present bool, err error) {
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBody+1))
	if err != nil {
		return false, torpor.Invalid("body", "cannot read the request body")
	}
	if len(body) > maxBody {
		return false, torpor.Invalid("body", "the request body is larger than %d bytes", maxBody)
	}
	if strings.TrimSpace(string(body)) == "" {
		return false, nil
	}
	if ct := r.Header.Get("Content-Type"); ct != "" {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			return false, torpor.Invalid("Content-Type", "send the body as application/json")
		}
	}
	dec := json.NewDecoder(strings.NewReader(string(body)))
	if err := dec.Decode(v); err != nil {
		return false, jsonError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return false, torpor.Invalid("body", "the body must hold one JSON value")
	}
	return true, nil
}

// jsonError names the field a decoding error is about.
func jsonError(err error) error {
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case errors.As(err, &typeErr):
		field := typeErr.Field
		if field == "" {
			return torpor.Invalid("body", "the body must be a JSON object")
		}
		return torpor.Invalid(field, "%s must be of type %s", field, jsonKind(typeErr.Type.Kind().String()))
	case errors.As(err, &syntaxErr):
		return torpor.Invalid("body", "malformed JSON at byte %d", syntaxErr.Offset)
	case errors.Is(err, io.ErrUnexpectedEOF):
		return torpor.Invalid("body", "truncated JSON")
	}
	return torpor.Invalid("body", "malformed JSON")
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
