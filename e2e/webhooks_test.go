package e2e

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
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
	d := startDaemon(t, bin, dataDir)
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

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(30 * time.Second); !cond(); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
	}
}
