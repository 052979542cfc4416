package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/webhook"
)

// TestWebhooksSurviveADaemonCrash: a receiver that refuses the first
// deliveries still gets every event, signed and in order, although the
// daemon is killed with SIGKILL in the middle.
func TestWebhooksSurviveADaemonCrash(t *testing.T) {
	needs(t)
	var (
		mu     sync.Mutex
		secret string
		seqs   []int64
		types  []string
		refuse = 2
	)
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		mu.Lock()
		defer mu.Unlock()
		if err := webhook.Verify(secret, r.Header, body, time.Minute, time.Now()); err != nil {
			t.Errorf("delivery: %v", err)
			w.WriteHeader(401)
			return
		}
		if refuse > 0 {
			refuse--
			w.WriteHeader(503)
			return
		}
		seq, _ := strconv.ParseInt(r.Header.Get(webhook.HeaderEventSeq), 10, 64)
		if n := len(seqs); n > 0 && seq <= seqs[n-1] {
			return // a redelivery after the crash: acknowledged, not counted twice
		}
		seqs = append(seqs, seq)
		types = append(types, strings.SplitN(strings.SplitN(string(body), `"type":"`, 2)[1], `"`, 2)[0])
	}))
	defer rcv.Close()
	got := func() []string {
		mu.Lock()
		defer mu.Unlock()
		return append([]string(nil), types...)
	}
	bin, dataDir := torporBin(t), t.TempDir()
	// The receiver is on the loopback, which webhooks reach only when the
	// administrator allows it.
	if err := os.WriteFile(filepath.Join(dataDir, "torpor.toml"), []byte("webhook_allow_cidrs = [\"127.0.0.0/8\"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, bin, dataDir)
	for _, self := range []string{d.addr, d.proxy} {
		if out, errs, code := d.cli("webhooks", "add", "http://"+self+"/v1/sandboxes"); code == 0 || !strings.Contains(errs, "url") {
			t.Fatalf("an endpoint at the daemon's own %s, although the loopback is allowed: exit %d\n%s%s", self, code, out, errs)
		}
	}
	out := d.ok("webhooks", "add", rcv.URL)
	mu.Lock()
	secret = strings.TrimSpace(strings.SplitN(out, "secret: ", 2)[1])
	mu.Unlock()
	id := strings.TrimSpace(d.ok("create"))
	d.ok("pause", id)
	waitUntil(t, "the first deliveries", func() bool { return len(got()) >= 3 })
	_ = d.cmd.Process.Signal(syscall.SIGKILL)
	<-d.exited
	d = startDaemon(t, bin, dataDir)
	d.ok("start", id)
	d.ok("rm", id)
	want := "sandbox.created,sandbox.started,sandbox.paused,sandbox.resumed,sandbox.terminated"
	waitUntil(t, "every event", func() bool { return strings.Join(got(), ",") == want })
	mu.Lock()
	defer mu.Unlock()
	for i := 1; i < len(seqs); i++ {
		if seqs[i] <= seqs[i-1] {
			t.Fatalf("out of order: %v", seqs)
		}
	}
}

// TestWebhooksRefuseTheHostsOwnNetworks: by default the daemon registers
// no endpoint on the loopback, a private or a link-local address.
func TestWebhooksRefuseTheHostsOwnNetworks(t *testing.T) {
	needs(t)
	rcv := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	defer rcv.Close()
	d := startDaemon(t, torporBin(t), t.TempDir())
	for _, url := range []string{rcv.URL, "http://localhost:22/", "http://[::1]/", "http://10.0.0.1/", "http://169.254.169.254/latest/meta-data/"} {
		if out, errs, code := d.cli("webhooks", "add", url); code == 0 || !strings.Contains(errs, "url") {
			t.Errorf("%s: exit %d\n%s%s", url, code, out, errs)
		}
	}
	if hooks := d.ok("webhooks", "ls"); strings.Contains(hooks, "wh_") {
		t.Fatalf("refused endpoints were registered:\n%s", hooks)
	}
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}

// TestWebhookDeliveryStateShowsFailureThenRecovery: an endpoint answering
// 500 shows, in GET /v1/webhooks and `torpor webhooks ls`, its last status
// and consecutive failures with a next retry; once it answers 200 the
// failures reset, the deliveries are counted and nothing is behind.
func TestWebhookDeliveryStateShowsFailureThenRecovery(t *testing.T) {
	needs(t)
	var failing atomic.Bool
	failing.Store(true)
	rcv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if failing.Load() {
			w.WriteHeader(http.StatusInternalServerError)
		}
	}))
	defer rcv.Close()
	dataDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dataDir, "torpor.toml"), []byte("webhook_allow_cidrs = [\"127.0.0.0/8\"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, torporBin(t), dataDir)
	out := d.ok("webhooks", "add", rcv.URL+"/hook")
	id, secret := strings.TrimSpace(strings.SplitN(out, "\n", 2)[0]), strings.TrimSpace(strings.SplitN(out, "secret: ", 2)[1])
	// delivery reads the webhook's delivery object from the wire.
	delivery := func() map[string]any {
		req, _ := http.NewRequest("GET", "http://"+d.addr+"/v1/webhooks", nil)
		req.Header.Set("Authorization", "Bearer "+d.key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if strings.Contains(string(body), secret) {
			t.Fatalf("the list carries the secret: %s", body)
		}
		var list struct {
			Webhooks []struct {
				ID       string         `json:"id"`
				Delivery map[string]any `json:"delivery"`
			} `json:"webhooks"`
		}
		if err := json.Unmarshal(body, &list); err != nil || len(list.Webhooks) != 1 || list.Webhooks[0].ID != id || list.Webhooks[0].Delivery == nil {
			t.Fatalf("GET /v1/webhooks: %s (%v)", body, err)
		}
		return list.Webhooks[0].Delivery
	}
	sb := strings.TrimSpace(d.ok("create"))

	waitUntil(t, "a failed delivery", func() bool { f, _ := delivery()["consecutive_failures"].(float64); return f >= 1 })
	got := delivery()
	if got["last_status"] != float64(500) || got["delivered"] != float64(0) || got["next_retry_at"] == nil || got["last_attempt_at"] == nil ||
		!strings.Contains(got["last_error"].(string), "500") || got["behind"].(float64) < 1 {
		t.Fatalf("while failing: %v", got)
	}
	// ID URL DELIVERED-UP-TO DELIVERED FAILURES LAST-STATUS BEHIND CREATED.
	row := func() []string {
		lines := strings.Split(strings.TrimSpace(d.ok("webhooks", "ls")), "\n")
		if len(lines) != 2 || !strings.HasPrefix(lines[0], "ID") || !strings.Contains(lines[0], "FAILURES") {
			t.Fatalf("webhooks ls:\n%s", strings.Join(lines, "\n"))
		}
		return strings.Fields(lines[1])
	}
	if r := row(); r[0] != id || r[3] != "0" || r[4] == "0" || r[5] != "500" || r[6] == "0" {
		t.Fatalf("webhooks ls while failing: %v", r)
	}

	failing.Store(false)
	waitUntil(t, "the recovery", func() bool {
		g := delivery()
		return g["consecutive_failures"] == float64(0) && g["behind"] == float64(0) && g["delivered"].(float64) >= 1
	})
	got = delivery()
	if got["last_status"] != float64(200) || got["last_error"] != nil || got["next_retry_at"] != nil {
		t.Fatalf("after the recovery: %v", got)
	}
	if r := row(); r[3] == "0" || r[4] != "0" || r[5] != "200" || r[6] != "0" {
		t.Fatalf("webhooks ls after the recovery: %v", r)
	}
	d.ok("rm", sb)
}
