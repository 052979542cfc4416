package webhook_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
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
		d := webhook.New(webhook.Config{Store: st, Backoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond})
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
