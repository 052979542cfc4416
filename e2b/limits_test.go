package e2b_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/ratelimit"
	"github.com/torpor-dev/torpor/e2b"
)

// A key past its rate gets E2B's error shape with 429 and Retry-After;
// another key is not slowed by it, and the key is let through again once
// its bucket refilled.
func TestRateLimitIs429(t *testing.T) {
	f := newFixture(t)
	lim := ratelimit.New(ratelimit.Config{PerSecond: 1, Burst: 2, Clock: f.clock})
	hs := httptest.NewServer(e2b.New(e2b.Config{Engine: f.eng, Auth: f.store, TemplateStore: f.store, Templates: f.tmpls, RateLimit: lim}))
	t.Cleanup(hs.Close)
	f.url = hs.URL
	for i := range 2 {
		if r := f.do("GET", "/v2/sandboxes", f.acme, ""); r.status != http.StatusOK {
			t.Fatalf("request %d within the burst: %d %s", i+1, r.status, r.body)
		}
	}
	r := f.do("GET", "/v2/sandboxes", f.acme, "")
	if r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") != "1" {
		t.Fatalf("past the burst: %d Retry-After %q %s", r.status, r.header.Get("Retry-After"), r.body)
	}
	if msg := r.errBody(t)["message"].(string); !strings.Contains(msg, "at most 1 a second") {
		t.Fatalf("message %q does not say the limit", msg)
	}
	if r := f.do("GET", "/v2/sandboxes", f.other, ""); r.status != http.StatusOK {
		t.Fatalf("another key: %d %s", r.status, r.body)
	}
	f.clock.Advance(time.Second)
	if r := f.do("GET", "/v2/sandboxes", f.acme, ""); r.status != http.StatusOK {
		t.Fatalf("after a second: %d %s", r.status, r.body)
	}
}

// A tenant at its quota is 429, as E2B answers too many concurrent
// sandboxes, naming the quota; nothing is left behind.
func TestQuotaIs429(t *testing.T) {
	f := newFixture(t)
	if err := f.store.SetTenantQuota(ctx, "acme", torpor.Quota{MaxSandboxes: 1}); err != nil {
		t.Fatal(err)
	}
	f.create(`{"templateID":"base"}`)
	r := f.do("POST", "/v2/sandboxes", f.acme, `{"templateID":"base"}`)
	if r.status != http.StatusTooManyRequests {
		t.Fatalf("create past max_sandboxes: %d %s", r.status, r.body)
	}
	body := r.errBody(t)
	if body["error_code"] != "sandbox_quota_exceeded" || !strings.Contains(body["message"].(string), "max_sandboxes is 1") {
		t.Fatalf("quota refusal: %s", r.body)
	}
	if got := f.eng.TenantUsage("acme"); got.Sandboxes != 1 {
		t.Fatalf("acme holds %+v after the refusal", got)
	}
}
