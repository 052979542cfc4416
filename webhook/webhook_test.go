package webhook_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/store/sqlite"
	"github.com/torpor-dev/torpor/webhook"
)

// receiver is a webhook endpoint that refuses its first failures
// deliveries and checks every signature.
type receiver struct {
	t        *testing.T
	secret   string
	mu       sync.Mutex
	failures int
	got      []int64 // acknowledged seqs, in arrival order
	attempts int
}

func (r *receiver) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	body, _ := io.ReadAll(req.Body)
	if err := webhook.Verify(r.secret, req.Header, body, time.Minute, time.Now()); err != nil {
		r.t.Errorf("delivery: %v", err)
		w.WriteHeader(400)
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.attempts++
	if r.failures > 0 {
		r.failures--
		w.WriteHeader(503)
		return
	}
	seq, _ := strconv.ParseInt(req.Header.Get(webhook.HeaderEventSeq), 10, 64)
	r.got = append(r.got, seq)
}

func (r *receiver) seqs() []int64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int64(nil), r.got...)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// emit stores n events for a sandbox of tenant.
func emit(t *testing.T, st *sqlite.Store, tenant, id string, n int) {
	ctx := context.Background()
	sb, err := st.GetSandbox(ctx, id)
	if err != nil {
		now := time.Now()
		sb = &torpor.Sandbox{ID: id, Tenant: tenant, Template: "base", State: torpor.StateRunning, CreatedAt: now, StateSince: now, LastActivityAt: now}
		if err := st.CreateSandbox(ctx, sb, torpor.Event{Type: torpor.EventCreated, SandboxID: id, Tenant: tenant, Time: now}); err != nil {
			t.Fatal(err)
		}
		n--
	}
	for i := 0; i < n; i++ {
		if err := st.UpdateSandbox(ctx, sb, torpor.Event{Type: torpor.EventStateChange, SandboxID: id, Tenant: tenant, Time: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
}

// allowLoopback is the guard of tests whose receiver is an httptest
// server: the loopback is refused unless allowed.
func allowLoopback() *webhook.Guard {
	return webhook.NewGuard(webhook.GuardConfig{Allow: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128")}})
}

func TestDeliversSignedInOrderWithRetriesAndAcrossRestarts(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "torpor.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for _, tn := range []string{"acme", "other"} {
		st.CreateTenant(ctx, torpor.Tenant{Name: tn, CreatedAt: time.Now()})
	}
	rcv := &receiver{t: t, secret: "whsec", failures: 3}
	srv := httptest.NewServer(rcv)
	defer srv.Close()
	if err := st.CreateWebhook(ctx, torpor.Webhook{ID: "wh_1", Tenant: "acme", URL: srv.URL, Secret: "whsec", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	emit(t, st, "acme", "sba", 5)
	emit(t, st, "other", "sbo", 3) // never delivered to acme's endpoint
	emit(t, st, "acme", "sbb", 5)

	start := func() (context.CancelFunc, *webhook.Dispatcher) {
		dctx, cancel := context.WithCancel(ctx)
		d := webhook.New(webhook.Config{Store: st, Guard: allowLoopback(), Backoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
		if err := d.Run(dctx); err != nil {
			t.Fatal(err)
		}
		return cancel, d
	}
	cancel, d := start()
	waitFor(t, "10 deliveries", func() bool { return len(rcv.seqs()) >= 10 })
	cancel()
	d.Wait()

	// While the daemon is down, more events; a new dispatcher carries on
	// from the stored cursor.
	emit(t, st, "acme", "sba", 4)
	cancel, d = start()
	defer func() { cancel(); d.Wait() }()
	waitFor(t, "14 deliveries", func() bool { return len(rcv.seqs()) >= 14 })

	evs, _ := st.ListEvents(ctx, torpor.EventFilter{Tenant: "acme"})
	got := rcv.seqs()
	if len(got) != len(evs) {
		t.Fatalf("delivered %v, want the %d events of acme once each", got, len(evs))
	}
	for i, ev := range evs {
		if got[i] != ev.Seq {
			t.Fatalf("delivery %d was seq %d, want %d (in order, none lost): %v", i, got[i], ev.Seq, got)
		}
	}
	if rcv.attempts < len(evs)+3 {
		t.Fatalf("%d attempts: the refused deliveries were not retried", rcv.attempts)
	}
	// The cursor is stored once the last delivery's answer is in, which
	// may be just after the receiver counted it.
	waitFor(t, "the cursor at the last event", func() bool {
		hooks, _ := st.ListWebhooks(ctx, "acme")
		return hooks[0].Cursor == evs[len(evs)-1].Seq
	})
}

func TestVerifyRejectsTampering(t *testing.T) {
	body := []byte(`{"seq":1}`)
	now := time.Unix(1_700_000_000, 0)
	ts := fmt.Sprint(now.Unix())
	h := http.Header{}
	h.Set(webhook.HeaderTimestamp, ts)
	h.Set(webhook.HeaderSignature, "v1="+webhook.Sign("k", ts, body))
	if err := webhook.Verify("k", h, body, time.Minute, now); err != nil {
		t.Fatalf("a good delivery: %v", err)
	}
	for name, check := range map[string]func() error{
		"other body":   func() error { return webhook.Verify("k", h, []byte(`{"seq":2}`), time.Minute, now) },
		"other secret": func() error { return webhook.Verify("k2", h, body, time.Minute, now) },
		"replayed":     func() error { return webhook.Verify("k", h, body, time.Minute, now.Add(time.Hour)) },
	} {
		if check() == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

// staticResolver answers every name with one address.
type staticResolver netip.Addr

func (r staticResolver) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	return []netip.Addr{netip.Addr(r)}, nil
}

// counter is an endpoint that counts requests and acknowledges them.
type counter struct {
	mu sync.Mutex
	n  int
}

func (c *counter) ServeHTTP(http.ResponseWriter, *http.Request) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.n++
}

func (c *counter) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.n
}

// logBuffer collects a logger's lines.
type logBuffer struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// deliverOnce stores a webhook to url straight in the store (no
// registration check) and one event, runs a dispatcher with guard, and
// returns its log once a delivery attempt failed or target was reached.
func deliverOnce(t *testing.T, url string, guard *webhook.Guard, target *counter) string {
	t.Helper()
	ctx := t.Context()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "torpor.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	st.CreateTenant(ctx, torpor.Tenant{Name: "acme", CreatedAt: time.Now()})
	if err := st.CreateWebhook(ctx, torpor.Webhook{ID: "wh_1", Tenant: "acme", URL: url, Secret: "whsec", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	emit(t, st, "acme", "sba", 1)
	logs := &logBuffer{}
	dctx, cancel := context.WithCancel(ctx)
	d := webhook.New(webhook.Config{Store: st, Guard: guard, Logger: slog.New(slog.NewTextHandler(logs, nil)), Backoff: time.Hour})
	if err := d.Run(dctx); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); d.Wait() }()
	waitFor(t, "a delivery", func() bool { return strings.Contains(logs.String(), "webhook delivery failed") || target.count() > 0 })
	return logs.String()
}

// TestDeliveryRefusesTheLoopbackAtDialTime: a name that resolves to the
// loopback when the daemon dials is refused then, although registration
// saw a public address (DNS rebinding) — here the name is "localhost",
// and registration is told it is 93.184.215.14.
func TestDeliveryRefusesTheLoopbackAtDialTime(t *testing.T) {
	rcv := &counter{}
	srv := httptest.NewServer(rcv)
	defer srv.Close()
	url := "http://localhost:" + srv.URL[strings.LastIndex(srv.URL, ":")+1:] + "/hook"
	guard := webhook.NewGuard(webhook.GuardConfig{Resolver: staticResolver(netip.MustParseAddr("93.184.215.14"))})
	if err := guard.CheckURL(t.Context(), url); err != nil {
		t.Fatalf("registration, the name resolving to a public address: %v", err)
	}
	logs := deliverOnce(t, url, guard, rcv)
	if n := rcv.count(); n != 0 {
		t.Fatalf("the loopback endpoint got %d requests", n)
	}
	if !strings.Contains(logs, "refusing to deliver to 127.0.0.1") && !strings.Contains(logs, "refusing to deliver to [::1]") {
		t.Fatalf("the failure is not the guard's refusal:\n%s", logs)
	}
}

// TestDeliveryFollowsNoRedirect: an allowed endpoint that redirects does
// not lead the daemon elsewhere, and a 3xx is no acknowledgement.
func TestDeliveryFollowsNoRedirect(t *testing.T) {
	target := &counter{}
	inner := httptest.NewServer(target)
	defer inner.Close()
	outer := httptest.NewServer(http.RedirectHandler(inner.URL, http.StatusTemporaryRedirect))
	defer outer.Close()
	logs := deliverOnce(t, outer.URL, allowLoopback(), target)
	if n := target.count(); n != 0 {
		t.Fatalf("the redirect was followed (%d requests)", n)
	}
	if !strings.Contains(logs, "307") {
		t.Fatalf("the redirect is not the failure:\n%s", logs)
	}
}

// TestCheckURLRefusesTheHostsOwnNetworks: registration refuses, on the
// url field, each address the rule refuses, also behind a name.
func TestCheckURLRefusesTheHostsOwnNetworks(t *testing.T) {
	public := webhook.NewGuard(webhook.GuardConfig{Resolver: staticResolver(netip.MustParseAddr("93.184.215.14"))})
	for _, url := range []string{"https://hooks.example.com/torpor", "http://93.184.215.14:8080/", "https://[2606:2800:21f:cb07:6820:80da:af6b:8b2c]/"} {
		if err := public.CheckURL(t.Context(), url); err != nil {
			t.Errorf("%s: %v", url, err)
		}
	}
	for _, url := range []string{"http://127.0.0.1:7070/v1/sandboxes", "http://[::1]/", "http://10.0.0.1/", "http://192.168.0.1/",
		"http://172.16.0.1/", "http://169.254.169.254/latest/meta-data", "http://100.64.0.1/", "http://0.0.0.0:22/",
		"http://[fe80::1%25eth0]/", "http://[fd00::1]/", "http://224.0.0.1/", "http://[::ffff:127.0.0.1]/"} {
		if err := public.CheckURL(t.Context(), url); !torpor.IsCode(err, torpor.EInvalid) {
			t.Errorf("%s: %v, want invalid_argument", url, err)
		}
	}
	for name, ip := range map[string]string{"loopback": "127.0.0.1", "metadata": "169.254.169.254", "private": "10.2.3.4"} {
		g := webhook.NewGuard(webhook.GuardConfig{Resolver: staticResolver(netip.MustParseAddr(ip))})
		err := g.CheckURL(t.Context(), "https://rebind.example.com/")
		var e *torpor.Error
		if !errors.As(err, &e) || e.Code != torpor.EInvalid || e.Param != "url" {
			t.Errorf("a name resolving to the %s address: %v, want invalid_argument on url", name, err)
		} else if strings.Contains(e.Message, ip) {
			t.Errorf("the refusal tells the tenant what the name resolves to: %s", e.Message)
		}
	}
}
