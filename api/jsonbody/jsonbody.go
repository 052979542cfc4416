// Package jsonbody reads the JSON bodies of requests to torpor's HTTP
// APIs, the native one (api/) and the E2B one (e2b/): bounded in size, one
// value, no key twice in an object at any depth, and decoding errors that
// name the field they are about.
//
// Duplicate keys are refused because parsers disagree on them (the first
// wins in some, the last in encoding/json): a body that a proxy or an
// audit log reads one way must not act another way here.
package jsonbody

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"strings"

	"github.com/torpor-dev/torpor"
)

// DefaultLimit bounds a body whose Rules set no Limit.
const DefaultLimit = 1 << 20

// Rules say how strictly a body is read. The zero value is the strictest.
type Rules struct {
	// Limit is the largest body accepted, in bytes (0: DefaultLimit).
	Limit int
	// AllowUnknownFields ignores fields v does not define instead of
	// refusing them (E2B's API does, so that newer SDKs keep working).
	AllowUnknownFields bool
	// AllowNoContentType accepts a body sent without a Content-Type
	// header; one that names another type is refused either way.
	AllowNoContentType bool
}

// Decode reads r's body into v. An empty body (or one of white space)
// leaves v as it is and reports present false; whether that is an error
// is the caller's to say. Every refusal is an invalid-argument error that
// names the field, or "body" or "Content-Type".
func Decode(r *http.Request, v any, rules Rules) (present bool, err error) {
	limit := rules.Limit
	if limit <= 0 {
		limit = DefaultLimit
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, int64(limit)+1))
	if err != nil {
		return false, torpor.Invalid("body", "cannot read the request body")
	}
	if len(body) > limit {
		return false, torpor.Invalid("body", "the request body is larger than %d bytes", limit)
	}
	if len(bytes.TrimSpace(body)) == 0 {
		return false, nil
	}
	if ct := r.Header.Get("Content-Type"); ct != "" || !rules.AllowNoContentType {
		if mt, _, err := mime.ParseMediaType(ct); err != nil || mt != "application/json" {
			return false, torpor.Invalid("Content-Type", "send the body as application/json")
		}
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	if !rules.AllowUnknownFields {
		dec.DisallowUnknownFields()
	}
	if err := dec.Decode(v); err != nil {
		return false, fieldError(err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return false, torpor.Invalid("body", "the body must hold one JSON value")
	}
	if err := checkKeys(body, v); err != nil {
		return false, err
	}
	return true, nil
}

// fieldError names the field a decoding error is about.
func fieldError(err error) error {
	var typeErr *json.UnmarshalTypeError
	var syntaxErr *json.SyntaxError
	switch {
	case errors.As(err, &typeErr):
		kind := "value"
		if typeErr.Type != nil {
			kind = jsonKind(typeErr.Type.Kind().String())
		}
		field := jsonPath(typeErr.Field)
		if field == "" {
			return torpor.Invalid("body", "the body must be a JSON %s", kind)
		}
		return torpor.Invalid(field, "%s must be of type %s", field, kind)
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

// jsonKind names a Go kind by the JSON type that decodes into it.
func jsonKind(k string) string {
	switch k {
	case "int", "int64", "int32", "int16", "int8", "float64", "float32", "uint", "uint64", "uint32", "uint16", "uint8":
		return "number"
	case "map", "struct":
		return "object"
	case "slice", "array":
		return "array"
	}
	return k
}

// keyPath is the path of key in the object at path, in the form the
// validators use for params: a.b for objects, a[0] for arrays.
func keyPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func indexPath(path string, i int) string { return fmt.Sprintf("%s[%d]", path, i) }
