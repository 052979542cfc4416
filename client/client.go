// Package client is the Go SDK of torpor's native HTTP API. Errors come back
// as *torpor.Error with the code the server sent; IsNotFound, IsConflict and
// the other helpers test for them.
package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/wire"
)

// Client talks to one torpor daemon.
type Client struct {
	base  *url.URL
	key   string
	http  *http.Client
	retry RetryPolicy
}

// RetryPolicy says how the client retries a request that the server
// refused because the node is full (409 with reason "capacity"): such a
// refusal changed nothing, so sending the request again is safe.
type RetryPolicy struct {
	// Attempts is how many times a request is sent in all (1: no retry).
	Attempts int
	// MaxWait caps one wait; waits start at the server's Retry-After (or a
	// second) and double.
	MaxWait time.Duration
	// OnRetry, when set, is told of each retry before its wait.
	OnRetry func(err error, attempt int, wait time.Duration)
}

// DefaultRetry retries a full node five times over about half a minute.
var DefaultRetry = RetryPolicy{Attempts: 6, MaxWait: 10 * time.Second}

// New returns a client for the daemon at baseURL (e.g.
// "http://127.0.0.1:7070") authenticating with apiKey.
func New(baseURL, apiKey string) (*Client, error) {
	u, err := url.Parse(strings.TrimRight(baseURL, "/"))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("client: %q is not an http(s) URL", baseURL)
	}
	return &Client{base: u, key: strings.TrimSpace(apiKey), http: &http.Client{}, retry: DefaultRetry}, nil
}

// WithRetry returns a copy of c that retries capacity refusals by p.
func (c *Client) WithRetry(p RetryPolicy) *Client {
	cp := *c
	cp.retry = p
	return &cp
}

// IsCapacity reports whether err is a refusal because the node is full.
func IsCapacity(err error) bool {
	var te *torpor.Error
	return errors.As(err, &te) && te.Code == torpor.EConflict && te.Reason == "capacity"
}

// IsRateLimited reports whether err is a refusal because the key sent
// more requests than its rate (429); its RetryAfter says when to send
// again. The client does not retry these by itself.
func IsRateLimited(err error) bool { return torpor.IsCode(err, torpor.ERateLimited) }

// IsQuota reports whether err is a refusal because the tenant is at one
// of its quotas (403, reason quota): waiting does not help, freeing or a
// higher quota does.
func IsQuota(err error) bool {
	var te *torpor.Error
	return errors.As(err, &te) && te.Code == torpor.EForbidden && te.Reason == torpor.ReasonQuota
}

// WithHTTPClient returns a copy of c that uses hc.
func (c *Client) WithHTTPClient(hc *http.Client) *Client {
	cp := *c
	cp.http = hc
	return &cp
}

// Error helpers: each reports whether err carries that code.
func IsNotFound(err error) bool { return torpor.IsCode(err, torpor.ENotFound) }
func IsConflict(err error) bool { return torpor.IsCode(err, torpor.EConflict) }
func IsInvalid(err error) bool  { return torpor.IsCode(err, torpor.EInvalid) }
func IsGone(err error) bool     { return torpor.IsCode(err, torpor.EGone) }
func IsUnauthenticated(err error) bool {
	return torpor.IsCode(err, torpor.EUnauthenticated)
}
func IsForbidden(err error) bool   { return torpor.IsCode(err, torpor.EForbidden) }
func IsUnavailable(err error) bool { return torpor.IsCode(err, torpor.EUnavailable) }

// do sends a request with a JSON body (nil for none) and decodes a JSON
// answer into out (nil to drop it).
func (c *Client) do(ctx context.Context, method, path string, query url.Values, body, out any) error {
	resp, err := c.send(ctx, method, path, query, body, "application/json")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if out == nil {
		_, _ = io.Copy(io.Discard, resp.Body)
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("client: decoding %s %s: %w", method, path, err)
	}
	return nil
}

// send performs a request, retrying capacity refusals by the client's
// retry policy.
func (c *Client) send(ctx context.Context, method, path string, query url.Values, body any, accept string) (*http.Response, error) {
	for attempt := 1; ; attempt++ {
		resp, err := c.sendOnce(ctx, method, path, query, body, accept)
		if err == nil || !IsCapacity(err) || attempt >= c.retry.Attempts {
			return resp, err
		}
		wait := time.Second
		var te *torpor.Error
		if errors.As(err, &te) && te.RetryAfter > 0 {
			wait = te.RetryAfter
		}
		wait <<= attempt - 1
		if c.retry.MaxWait > 0 && wait > c.retry.MaxWait {
			wait = c.retry.MaxWait
		}
		if c.retry.OnRetry != nil {
			c.retry.OnRetry(err, attempt, wait)
		}
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(wait):
		}
	}
}

// sendOnce performs a request and turns an error status into *torpor.Error.
func (c *Client) sendOnce(ctx context.Context, method, path string, query url.Values, body any, accept string) (*http.Response, error) {
	u := *c.base
	u.Path = c.base.Path + path
	u.RawQuery = query.Encode()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return nil, fmt.Errorf("client: encoding request: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, u.String(), rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	req.Header.Set("Accept", accept)
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode >= 400 {
		defer resp.Body.Close()
		return nil, decodeError(resp)
	}
	return resp, nil
}

func decodeError(resp *http.Response) error {
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var eb wire.ErrorBody
	e := &torpor.Error{}
	if json.Unmarshal(data, &eb) == nil && eb.Error.Code != "" {
		d := eb.Error
		e.Code, e.Message, e.Param, e.Reason, e.State = d.Code, d.Message, d.Param, d.Reason, d.State
	} else {
		e.Code = wire.CodeForStatus(resp.StatusCode)
		e.Message = strings.TrimSpace(string(data))
		if e.Message == "" {
			e.Message = resp.Status
		}
	}
	if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil {
		e.RetryAfter = time.Duration(s) * time.Second
	}
	return e
}

// Health returns nil once the daemon is ready.
func (c *Client) Health(ctx context.Context) error {
	return c.do(ctx, "GET", "/healthz", nil, nil, nil)
}

// Create makes a sandbox and returns it once it is running (or failed).
func (c *Client) Create(ctx context.Context, req torpor.CreateRequest) (*torpor.Sandbox, error) {
	var sb torpor.Sandbox
	return &sb, c.do(ctx, "POST", "/v1/sandboxes", nil, req, &sb)
}

// Get returns a sandbox.
func (c *Client) Get(ctx context.Context, id string) (*torpor.Sandbox, error) {
	var sb torpor.Sandbox
	return &sb, c.do(ctx, "GET", "/v1/sandboxes/"+url.PathEscape(id), nil, nil, &sb)
}

// ListOptions filter List.
type ListOptions struct {
	States []torpor.State
	// Metadata keeps sandboxes with all these key=value pairs.
	Metadata map[string]string
	// All includes terminated sandboxes.
	All bool
	// Tenant, for an admin key, lists that tenant's sandboxes, or with
	// AllTenants every tenant's (each with its tenant); empty: the key's
	// own tenant's. A tenant key may name only its own (docs/api.md,
	// "Acting as a tenant").
	Tenant string
}

// AllTenants, as ListOptions.Tenant, lists every tenant's sandboxes but
// the warm pools'. Only an admin key may use it.
const AllTenants = "*"

// List returns the caller's sandboxes.
func (c *Client) List(ctx context.Context, o ListOptions) ([]*torpor.Sandbox, error) {
	var out wire.SandboxList
	return out.Sandboxes, c.do(ctx, "GET", "/v1/sandboxes", o.query(), nil, &out)
}

// ListPage returns one page of the caller's sandboxes, oldest first: at
// most limit of them (1 to 1,000), after the cursor after ("" for the
// first page). next is the cursor of the page that follows, "" when this
// page is the last. A walk sees each sandbox at most once, and every one
// that existed when it began; one created meanwhile may be missed (its
// place in the order is its create's start, which can fall behind a page
// already read).
func (c *Client) ListPage(ctx context.Context, o ListOptions, limit int, after string) (sbs []*torpor.Sandbox, next string, err error) {
	q := o.query()
	q.Set("limit", strconv.Itoa(limit))
	if after != "" {
		q.Set("after", after)
	}
	var out wire.SandboxList
	err = c.do(ctx, "GET", "/v1/sandboxes", q, nil, &out)
	return out.Sandboxes, out.Next, err
}

// Pages walks every page of the caller's sandboxes, limit a page, for
// use with range:
//
//	for page, err := range c.Pages(ctx, opts, 100) { ... }
//
// An error ends the walk after it is yielded; so does a caller that
// stops ranging.
func (c *Client) Pages(ctx context.Context, o ListOptions, limit int) iter.Seq2[[]*torpor.Sandbox, error] {
	return func(yield func([]*torpor.Sandbox, error) bool) {
		after := ""
		for {
			sbs, next, err := c.ListPage(ctx, o, limit, after)
			if err != nil {
				yield(nil, err)
				return
			}
			if !yield(sbs, nil) || next == "" {
				return
			}
			after = next
		}
	}
}

// query is o as the list's query parameters.
func (o ListOptions) query() url.Values {
	q := url.Values{}
	for _, s := range o.States {
		q.Add("state", string(s))
	}
	for k, v := range o.Metadata {
		q.Set("metadata."+k, v)
	}
	if o.All {
		q.Set("all", "true")
	}
	if o.Tenant != "" {
		q.Set("tenant", o.Tenant)
	}
	return q
}

// Update changes a sandbox's metadata.
func (c *Client) Update(ctx context.Context, id string, req torpor.UpdateRequest) (*torpor.Sandbox, error) {
	var sb torpor.Sandbox
	return &sb, c.do(ctx, "PATCH", "/v1/sandboxes/"+url.PathEscape(id), nil, req, &sb)
}

func (c *Client) verb(ctx context.Context, id, verb string, body any) (*torpor.Sandbox, error) {
	var sb torpor.Sandbox
	return &sb, c.do(ctx, "POST", "/v1/sandboxes/"+url.PathEscape(id)+"/"+verb, nil, body, &sb)
}

// Pause freezes a running sandbox (mode "" is the runtime's default).
func (c *Client) Pause(ctx context.Context, id string, mode torpor.PauseMode) (*torpor.Sandbox, error) {
	return c.verb(ctx, id, "pause", wire.PauseRequest{Mode: mode})
}

// Start continues a paused sandbox or boots a hibernated one.
func (c *Client) Start(ctx context.Context, id string) (*torpor.Sandbox, error) {
	return c.verb(ctx, id, "start", nil)
}

// Connect is Start under the name E2B and CubeSandbox users know.
func (c *Client) Connect(ctx context.Context, id string) (*torpor.Sandbox, error) {
	return c.verb(ctx, id, "connect", nil)
}

// Hibernate ends a sandbox's processes and keeps its disk.
func (c *Client) Hibernate(ctx context.Context, id string) (*torpor.Sandbox, error) {
	return c.verb(ctx, id, "hibernate", nil)
}

// Archive packs a hibernated sandbox's disk into its archive now, as its
// archive_after_hibernated_seconds would (docs/archive.md).
func (c *Client) Archive(ctx context.Context, id string) (*torpor.Sandbox, error) {
	return c.verb(ctx, id, "archive", nil)
}

// Restart boots a running sandbox again on a fresh instance.
func (c *Client) Restart(ctx context.Context, id string) (*torpor.Sandbox, error) {
	return c.verb(ctx, id, "restart", nil)
}

// Touch records activity.
func (c *Client) Touch(ctx context.Context, id string) (*torpor.Sandbox, error) {
	return c.verb(ctx, id, "touch", nil)
}

// Delete terminates a sandbox and removes its disk.
func (c *Client) Delete(ctx context.Context, id string) (*torpor.Sandbox, error) {
	var sb torpor.Sandbox
	return &sb, c.do(ctx, "DELETE", "/v1/sandboxes/"+url.PathEscape(id), nil, nil, &sb)
}

// ExecRequest is a command to run; see wire.ExecRequest.
type ExecRequest = wire.ExecRequest

// ExecResult is how a command ended, with its output when not streamed.
type ExecResult = wire.ExecResponse

// Exec runs a command and returns its output once it ends.
func (c *Client) Exec(ctx context.Context, id string, req ExecRequest) (*ExecResult, error) {
	var out ExecResult
	return &out, c.do(ctx, "POST", "/v1/sandboxes/"+url.PathEscape(id)+"/exec", nil, req, &out)
}

// ExecStream runs a command, passing output to stdout and stderr as it is
// produced, and returns how it ended (the result carries no output).
func (c *Client) ExecStream(ctx context.Context, id string, req ExecRequest, stdout, stderr io.Writer) (*ExecResult, error) {
	resp, err := c.send(ctx, "POST", "/v1/sandboxes/"+url.PathEscape(id)+"/exec", nil, req, "text/event-stream")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var res *ExecResult
	err = readEvents(resp.Body, func(event string, data []byte) (bool, error) {
		switch event {
		case wire.EventStdout, wire.EventStderr:
			var ch wire.ExecChunk
			if err := json.Unmarshal(data, &ch); err != nil {
				return true, fmt.Errorf("client: bad output event: %w", err)
			}
			w := stdout
			if event == wire.EventStderr {
				w = stderr
			}
			if w != nil {
				_, _ = io.WriteString(w, ch.Data)
			}
		case wire.EventExit:
			res = &ExecResult{}
			if err := json.Unmarshal(data, res); err != nil {
				return true, fmt.Errorf("client: bad exit event: %w", err)
			}
			return true, nil
		case wire.EventError:
			return true, streamError(data)
		}
		return false, nil
	})
	if err != nil {
		return nil, err
	}
	if res != nil {
		return res, nil
	}
	return nil, errors.New("client: the exec stream ended without an exit status")
}

// Events returns events after the cursor since (of one sandbox when id is
// not empty) and the cursor to continue from.
func (c *Client) Events(ctx context.Context, id string, since int64) ([]torpor.Event, int64, error) {
	p := "/v1/events"
	if id != "" {
		p = "/v1/sandboxes/" + url.PathEscape(id) + "/events"
	}
	var out wire.EventList
	err := c.do(ctx, "GET", p, url.Values{"since": {strconv.FormatInt(since, 10)}}, nil, &out)
	return out.Events, out.Next, err
}

// Templates lists the templates sandboxes can be made from.
func (c *Client) Templates(ctx context.Context) ([]torpor.Template, error) {
	var out wire.TemplateList
	return out.Templates, c.do(ctx, "GET", "/v1/templates", nil, nil, &out)
}

// CreateTenant makes a tenant (admin keys only).
func (c *Client) CreateTenant(ctx context.Context, name string) (*torpor.Tenant, error) {
	var t torpor.Tenant
	return &t, c.do(ctx, "POST", "/v1/tenants", nil, wire.TenantRequest{Name: name}, &t)
}

// Tenants lists tenants, each with its quota and what its sandboxes hold
// (admin keys only).
func (c *Client) Tenants(ctx context.Context) ([]torpor.Tenant, error) {
	var out wire.TenantList
	return out.Tenants, c.do(ctx, "GET", "/v1/tenants", nil, nil, &out)
}

// SetTenantQuota changes the quota fields q names (0 removes a limit) and
// returns the tenant (admin keys only).
func (c *Client) SetTenantQuota(ctx context.Context, name string, q wire.QuotaUpdate) (*torpor.Tenant, error) {
	var t torpor.Tenant
	return &t, c.do(ctx, "PATCH", "/v1/tenants/"+url.PathEscape(name), nil, wire.TenantUpdate{Quota: &q}, &t)
}

// CreateKey makes an API key for a tenant, and the tenant if it is new
// (admin keys only). The secret is in the result's Key, shown only once.
func (c *Client) CreateKey(ctx context.Context, req wire.KeyRequest) (*wire.KeyCreated, error) {
	var out wire.KeyCreated
	return &out, c.do(ctx, "POST", "/v1/keys", nil, req, &out)
}

// UsageQuery selects a usage report (see GET /v1/usage). Zero fields are
// left out: the caller's own tenant, every sandbox, all time, no groups.
type UsageQuery struct {
	Tenant  string
	Sandbox string
	From    time.Time
	To      time.Time
	// GroupBy is torpor.GroupBySandbox, GroupByDay or GroupByTenant.
	GroupBy string
	// Rows asks for the rows as well as the groups.
	Rows bool
}

// Usage returns metered usage: ledger rows, groups and totals.
func (c *Client) Usage(ctx context.Context, q UsageQuery) (*wire.UsageReport, error) {
	v := url.Values{}
	set := func(k, val string) {
		if val != "" {
			v.Set(k, val)
		}
	}
	set("tenant", q.Tenant)
	set("sandbox", q.Sandbox)
	set("group_by", q.GroupBy)
	if !q.From.IsZero() {
		v.Set("from", q.From.UTC().Format(time.RFC3339Nano))
	}
	if !q.To.IsZero() {
		v.Set("to", q.To.UTC().Format(time.RFC3339Nano))
	}
	if q.Rows {
		v.Set("rows", "true")
	}
	var out wire.UsageReport
	return &out, c.do(ctx, "GET", "/v1/usage", v, nil, &out)
}

// Runtimes lists the runtimes the node can run and how each pauses.
func (c *Client) Runtimes(ctx context.Context) ([]torpor.RuntimeInfo, error) {
	var out wire.RuntimeList
	return out.Runtimes, c.do(ctx, "GET", "/v1/runtimes", nil, nil, &out)
}
