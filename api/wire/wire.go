// Package wire is the native HTTP API's wire format, shared by the server
// (api/) and the Go client (client/): the request and response bodies that
// are not domain types, and the one table that maps error codes to HTTP
// status codes.
package wire

import (
	"net/http"
	"time"

	"github.com/torpor-dev/torpor"
)

// statusByCode is the one table from error code to HTTP status.
var statusByCode = map[torpor.ErrorCode]int{
	torpor.EInvalid:         http.StatusBadRequest,
	torpor.EUnauthenticated: http.StatusUnauthorized,
	torpor.EForbidden:       http.StatusForbidden,
	torpor.ENotFound:        http.StatusNotFound,
	torpor.EConflict:        http.StatusConflict,
	torpor.EGone:            http.StatusGone,
	torpor.ERateLimited:     http.StatusTooManyRequests,
	torpor.EUnavailable:     http.StatusServiceUnavailable,
	torpor.EInternal:        http.StatusInternalServerError,
}

// Status returns the HTTP status for an error code.
func Status(code torpor.ErrorCode) int {
	if s, ok := statusByCode[code]; ok {
		return s
	}
	return http.StatusInternalServerError
}

// CodeForStatus inverts the table, for responses that carry no error body.
func CodeForStatus(status int) torpor.ErrorCode {
	for c, s := range statusByCode {
		if s == status {
			return c
		}
	}
	if status >= 500 {
		return torpor.EInternal
	}
	return torpor.EInvalid
}

// ErrorBody is the JSON shape of every error response.
type ErrorBody struct {
	Error ErrorDetail `json:"error"`
}

// ErrorDetail describes one error.
type ErrorDetail struct {
	Code    torpor.ErrorCode `json:"code"`
	Message string           `json:"message"`
	Param   string           `json:"param,omitempty"`
	Reason  string           `json:"reason,omitempty"`
	State   torpor.State     `json:"state,omitempty"`
}

// PauseRequest is the optional body of POST .../pause.
type PauseRequest struct {
	Mode torpor.PauseMode `json:"mode,omitempty"`
}

// ExecRequest is the body of POST .../exec.
type ExecRequest struct {
	Cmd            []string          `json:"cmd"`
	Stdin          string            `json:"stdin,omitempty"`
	Env            map[string]string `json:"env,omitempty"`
	Cwd            string            `json:"cwd,omitempty"`
	User           string            `json:"user,omitempty"`
	TimeoutSeconds float64           `json:"timeout_seconds,omitempty"`
}

// ExecResponse is the result of a command run without streaming.
type ExecResponse struct {
	ExitCode  int    `json:"exit_code"`
	Stdout    string `json:"stdout"`
	Stderr    string `json:"stderr"`
	TimedOut  bool   `json:"timed_out"`
	Truncated bool   `json:"truncated,omitempty"`
}

// Server-sent event names of a streamed exec. Output events carry
// ExecChunk; the last event is "exit" with an ExecResponse (without output)
// or "error" with an ErrorBody.
const (
	EventStdout = "stdout"
	EventStderr = "stderr"
	EventExit   = "exit"
	EventError  = "error"
)

// ExecChunk is one piece of streamed output.
type ExecChunk struct {
	Data string `json:"data"`
}

// SandboxList is the body of GET /v1/sandboxes.
type SandboxList struct {
	Sandboxes []*torpor.Sandbox `json:"sandboxes"`
	// Next, only on a page asked for with ?limit= that has more after
	// it, is the cursor to pass as ?after= for the next page.
	Next string `json:"next,omitempty"`
}

// EventList is the body of GET /v1/events without streaming.
type EventList struct {
	Events []torpor.Event `json:"events"`
	// Next is the cursor to pass as ?since= for the following events.
	Next int64 `json:"next"`
}

// TenantRequest is the body of POST /v1/tenants.
type TenantRequest struct {
	Name string `json:"name"`
	// Quota, when given, is the new tenant's quota.
	Quota *torpor.Quota `json:"quota,omitempty"`
}

// KeyRequest is the body of POST /v1/keys.
type KeyRequest struct {
	Tenant string `json:"tenant"`
	Admin  bool   `json:"admin,omitempty"`
	// Tier is "standard" (the default) or "free".
	Tier string `json:"tier,omitempty"`
}

// KeyCreated answers POST /v1/keys: the secret is shown only here.
type KeyCreated struct {
	torpor.APIKey
	Key string `json:"key"`
}

// TenantList is the body of GET /v1/tenants.
type TenantList struct {
	Tenants []torpor.Tenant `json:"tenants"`
}

// PoolList is the body of GET /v1/pools.
type PoolList struct {
	Pools []torpor.PoolStatus `json:"pools"`
}

// TemplateList is the body of GET /v1/templates.
type TemplateList struct {
	Templates []torpor.Template `json:"templates"`
}

// WebhookRequest is the body of POST /v1/webhooks.
type WebhookRequest struct {
	URL string `json:"url"`
}

// WebhookCreated answers POST /v1/webhooks: the signing secret is shown
// only here.
type WebhookCreated struct {
	torpor.Webhook
	Secret string `json:"secret"`
}

// WebhookList is the body of GET /v1/webhooks.
type WebhookList struct {
	Webhooks []torpor.Webhook `json:"webhooks"`
}

// UsageReport is the body of GET /v1/usage.
type UsageReport struct {
	Tenant   string     `json:"tenant,omitempty"`
	From     *time.Time `json:"from,omitempty"`
	To       *time.Time `json:"to,omitempty"`
	GroupBy  string     `json:"group_by,omitempty"`
	Currency string     `json:"currency"`
	// Rows are the ledger rows in the window (clipped to it), then the
	// intervals still open, marked open; left out when grouping unless
	// asked for with rows=true.
	Rows      []torpor.UsageRecord `json:"rows,omitempty"`
	Truncated bool                 `json:"truncated,omitempty"`
	Groups    []torpor.UsageTotals `json:"groups,omitempty"`
	Total     torpor.UsageTotals   `json:"total"`
}

// RuntimeList is the body of GET /v1/runtimes.
type RuntimeList struct {
	Runtimes []torpor.RuntimeInfo `json:"runtimes"`
}
