package api

import (
	"encoding/json"
	"net/http"
	"strconv"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/jsonbody"
	"github.com/torpor-dev/torpor/api/wire"
)

// decode reads a JSON body strictly (package jsonbody): the right content
// type, no unknown fields, one value, no key twice, at most
// jsonbody.DefaultLimit bytes. An empty body leaves v as it is when
// optional.
func decode(r *http.Request, v any, optional bool) error {
	return decodeLimit(r, v, optional, jsonbody.DefaultLimit)
}

// decodeLimit is decode with a body of at most limit bytes.
func decodeLimit(r *http.Request, v any, optional bool, limit int) error {
	present, err := jsonbody.Decode(r, v, jsonbody.Rules{Limit: limit})
	if err == nil && !present && !optional {
		return torpor.Invalid("body", "a JSON body is required")
	}
	return err
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	_ = enc.Encode(v)
}

// writeError writes err in the error shape. Internal errors are logged with
// their details and shown without them. A client that went away is no
// error: it is logged as such and recorded as 499, with no body.
func (s *Server) writeError(w http.ResponseWriter, r *http.Request, err error) {
	if clientGone(r, err) {
		s.log.Info("client went away", "method", r.Method, "path", r.URL.Path)
		w.WriteHeader(statusClientClosedRequest)
		return
	}
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
