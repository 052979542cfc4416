package webhook_test

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/clocktest"
	"github.com/torpor-dev/torpor/store/sqlite"
	"github.com/torpor-dev/torpor/webhook"
)

const stateSecret = "whsec_never_shown"

// runOne stores acme's webhook to url and one event, and runs a dispatcher
// with guard and clock; state reads the webhook's delivery state the way
// the API does, with the stored webhook.
func runOne(t *testing.T, url string, guard *webhook.Guard, clock torpor.Clock) (state func() torpor.WebhookDelivery) {
	t.Helper()
	ctx := t.Context()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "torpor.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	st.CreateTenant(ctx, torpor.Tenant{Name: "acme", CreatedAt: time.Now()})
	st.CreateTenant(ctx, torpor.Tenant{Name: "other", CreatedAt: time.Now()})
	if err := st.CreateWebhook(ctx, torpor.Webhook{ID: "wh_1", Tenant: "acme", URL: url, Secret: stateSecret, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	emit(t, st, "other", "sbo", 3) // not acme's: never counted as behind
	emit(t, st, "acme", "sba", 1)
	dctx, cancel := context.WithCancel(ctx)
	d := webhook.New(webhook.Config{Store: st, Guard: guard, Clock: clock, Backoff: 5 * time.Millisecond, MaxBackoff: 5 * time.Millisecond})
	if err := d.Run(dctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); d.Wait() })
	return func() torpor.WebhookDelivery {
		hooks, err := st.ListWebhooks(ctx, "acme")
		if err != nil || len(hooks) != 1 {
			t.Fatalf("listing: %v %v", hooks, err)
		}
		return d.WebhookDelivery(ctx, hooks[0])
	}
}

// TestDeliveryStateCountsFailuresThenResets: a receiver answering 500 is
// counted as consecutive failures with a next retry; once it answers 200
// the failures reset, the delivery is counted and nothing is behind. The
// error names the status, never the secret or the URL's token.
func TestDeliveryStateCountsFailuresThenResets(t *testing.T) {
	var failing atomic.Bool
	failing.Store(true)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if failing.Load() {
			w.WriteHeader(http.StatusInternalServerError)
		}
	}))
	defer srv.Close()
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	clock := clocktest.New(t0)
	state := runOne(t, srv.URL+"/hook?token=tok_in_url", allowLoopback(), clock)

	waitFor(t, "two failures", func() bool { return state().ConsecutiveFailures >= 2 })
	s := state()
	if s.Delivered != 0 || s.LastStatus != 500 || !strings.Contains(s.LastError, "500") || s.Behind != 1 {
		t.Fatalf("while failing: %+v", s)
	}
	if s.LastAttemptAt == nil || !s.LastAttemptAt.Equal(t0) || s.NextRetryAt == nil || !s.NextRetryAt.Equal(t0.Add(5*time.Millisecond)) {
		t.Fatalf("while failing, times from the injected clock: %+v", s)
	}
	for _, leak := range []string{stateSecret, "tok_in_url", srv.URL} {
		if strings.Contains(s.LastError, leak) {
			t.Fatalf("the error %q carries %q", s.LastError, leak)
		}
	}

	// Time moves on first, so the success is stamped later.
	clock.Advance(time.Minute)
	failing.Store(false)
	waitFor(t, "the delivery", func() bool { return state().Delivered == 1 })
	s = state()
	if s.ConsecutiveFailures != 0 || s.LastStatus != 200 || s.LastError != "" || s.NextRetryAt != nil || s.Behind != 0 {
		t.Fatalf("after the recovery: %+v", s)
	}
	if s.LastAttemptAt == nil || !s.LastAttemptAt.Equal(t0.Add(time.Minute)) {
		t.Fatalf("the last attempt at %v, want %v", s.LastAttemptAt, t0.Add(time.Minute))
	}
}

// TestDeliveryStateSaysWhyWithoutDetails: an address the guard refuses
// reads as such, without the address or the rule; a closed port reads as
// a refused connection.
func TestDeliveryStateSaysWhyWithoutDetails(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer srv.Close()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closed := "http://" + ln.Addr().String() + "/"
	ln.Close()
	for _, c := range []struct {
		name, url string
		guard     *webhook.Guard
		want      string
	}{
		{"guarded", srv.URL, webhook.NewGuard(webhook.GuardConfig{}), "the address is refused by the daemon's webhook guard"},
		{"closed port", closed, allowLoopback(), "the endpoint refused the connection"},
	} {
		t.Run(c.name, func(t *testing.T) {
			state := runOne(t, c.url, c.guard, clocktest.New(time.Now()))
			waitFor(t, "a failure", func() bool { return state().ConsecutiveFailures > 0 })
			if s := state(); s.LastError != c.want || s.LastStatus != 0 || s.Delivered != 0 {
				t.Fatalf("%+v, want the error %q", s, c.want)
			}
		})
	}
}
