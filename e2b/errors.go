package e2b

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/jsonbody"
	"github.com/torpor-dev/torpor/api/wire"
)

// errorBody is E2B's error shape; the SDKs branch on code.
type errorBody struct {
	Code      int    `json:"code"`
	Message   string `json:"message"`
	ErrorCode string `json:"error_code,omitempty"`
}

// errCapacity is E2B's error_code for a node that cannot take a sandbox
// now, errQuota for a tenant at one of its quotas.
const (
	errCapacity = "sandbox_capacity_unavailable"
	errQuota    = "sandbox_quota_exceeded"
)

// status maps an error to E2B's status, error_code and message. It is
// torpor's one table (api/wire) with E2B's exceptions: a terminated
// sandbox is not found (the SDK's kill then returns false and getInfo
// throws its not-found error), a node without capacity is 429 with
// Retry-After, which the SDK retries by itself before it gives up, and a
// tenant at its quota is 429 as E2B answers too many concurrent
// sandboxes, so the SDK shows its rate-limit error.
func status(e *torpor.Error) (int, string) {
	switch {
	case e.Code == torpor.EGone:
		return http.StatusNotFound, ""
	case e.Code == torpor.EConflict && e.Reason == "capacity":
		return http.StatusTooManyRequests, errCapacity
	case e.Code == torpor.EForbidden && e.Reason == torpor.ReasonQuota:
		return http.StatusTooManyRequests, errQuota
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

// decode reads an optional JSON body into v (package jsonbody: one
// value, no key twice, at most jsonbody.DefaultLimit bytes). Fields E2B
// defines but torpor does not serve are refused by the handlers; fields
// nobody defines are ignored, as E2B's API does, so newer SDKs keep
// working, and so is a missing Content-Type. A value of the wrong type is
// a 400 naming the field.
func decode(r *http.Request, v any) (present bool, err error) {
	return jsonbody.Decode(r, v, jsonbody.Rules{AllowUnknownFields: true, AllowNoContentType: true})
}
