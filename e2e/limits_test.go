package e2e

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/client"
)

// TestQuotaAndRateLimit sets a tenant's quota with the CLI, creates until
// the quota refuses, and hammers the API with another of its keys until
// the rate limit answers 429, on both surfaces, through the real daemon.
func TestQuotaAndRateLimit(t *testing.T) {
	needs(t)
	d := startDaemon(t, torporBin(t), t.TempDir(), "TORPOR_RATE_LIMIT_PER_SECOND=1", "TORPOR_RATE_LIMIT_BURST=20")
	creator := strings.TrimSpace(d.ok("keys", "create", "--tenant", "acme"))
	hammer := strings.TrimSpace(d.ok("keys", "create", "--tenant", "acme"))
	t.Cleanup(func() { removeAll(t, d, creator) })

	out := d.ok("tenants", "set", "acme", "--max-sandboxes", "2", "--max-vcpus", "4")
	if !strings.Contains(out, "acme") || !strings.Contains(out, "0/2") || !strings.Contains(out, "0/4") {
		t.Fatalf("tenants set printed:\n%s", out)
	}
	env := []string{"TORPOR_API_KEY=" + creator}
	for i := range 2 {
		if _, errs, code := d.cliEnv(env, "create"); code != 0 {
			t.Fatalf("create %d within the quota: exit %d %s", i+1, code, errs)
		}
	}
	_, errs, code := d.cliEnv(env, "create")
	if code == 0 || !strings.Contains(errs, `tenant "acme": quota max_sandboxes is 2 sandboxes and it has 2`) || !strings.Contains(errs, "(forbidden)") {
		t.Fatalf("a create past the quota: exit %d %q", code, errs)
	}
	var ts []torpor.Tenant
	if err := json.Unmarshal([]byte(d.ok("tenants", "ls", "--json")), &ts); err != nil {
		t.Fatal(err)
	}
	for _, tn := range ts {
		if tn.Name == "acme" && (tn.Quota != (torpor.Quota{MaxSandboxes: 2, MaxVCPUs: 4}) || tn.Usage == nil || tn.Usage.Sandboxes != 2) {
			t.Fatalf("tenants ls shows acme as %+v (usage %+v)", tn, tn.Usage)
		}
	}
	// The quota holds across a restart of the daemon.
	d.stop()
	d = startDaemon(t, d.bin, d.dataDir, "TORPOR_RATE_LIMIT_PER_SECOND=1", "TORPOR_RATE_LIMIT_BURST=20")
	t.Cleanup(func() { removeAll(t, d, creator) }) // before this daemon's shutdown
	if _, errs, code := d.cliEnv(env, "create"); code == 0 || !strings.Contains(errs, "max_sandboxes") {
		t.Fatalf("a create past the quota after a restart: exit %d %q", code, errs)
	}

	// Hammer: the burst goes through, then 429 with Retry-After.
	var limited *http.Response
	var body []byte
	for i := 0; i < 200 && limited == nil; i++ {
		resp := send(t, "GET", "http://"+d.addr+"/v1/sandboxes", "Authorization", "Bearer "+hammer)
		data, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		switch resp.StatusCode {
		case http.StatusOK:
		case http.StatusTooManyRequests:
			limited, body = resp, data
			if i < 20 {
				t.Fatalf("429 after %d requests, within the burst of 20", i)
			}
		default:
			t.Fatalf("request %d: %d %s", i+1, resp.StatusCode, data)
		}
	}
	if limited == nil {
		t.Fatal("200 requests went through a limit of 1 a second")
	}
	if limited.Header.Get("Retry-After") != "1" || !strings.Contains(string(body), `"code":"rate_limited"`) {
		t.Fatalf("429: Retry-After %q %s", limited.Header.Get("Retry-After"), body)
	}
	// The E2B surface shares the key's bucket, and answers in E2B's shape.
	resp := send(t, "GET", "http://"+d.addr+"/v2/sandboxes", "X-API-KEY", hammer)
	data, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusTooManyRequests || resp.Header.Get("Retry-After") == "" || !strings.Contains(string(data), `"code":429`) {
		t.Fatalf("E2B's answer for a limited key: %d %v %s", resp.StatusCode, resp.Header, data)
	}
	// The CLI says so; the admin key is not limited.
	if _, errs, code := d.cliEnv([]string{"TORPOR_API_KEY=" + hammer}, "ls"); code == 0 || !strings.Contains(errs, "too many requests") || !strings.Contains(errs, "(rate_limited)") {
		t.Fatalf("the CLI with a limited key: exit %d %q", code, errs)
	}
	for range 30 {
		d.ok("ls")
	}
	time.Sleep(1100 * time.Millisecond)
	if _, errs, code := d.cliEnv([]string{"TORPOR_API_KEY=" + hammer}, "ls"); code != 0 {
		t.Fatalf("the key a second later: %s", errs)
	}
}

// send makes one request with one header.
func send(t *testing.T, method, url, header, value string) *http.Response {
	t.Helper()
	req, _ := http.NewRequest(method, url, nil)
	req.Header.Set(header, value)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	return resp
}

// removeAll deletes every sandbox key's tenant has, waiting out the rate
// limit, so that none outlives the test; a daemon already stopped (a
// restart's first one) has nothing of its own to remove.
func removeAll(t *testing.T, d *daemon, key string) {
	select {
	case <-d.exited:
		return
	default:
	}
	cl, err := client.New("http://"+d.addr, key)
	if err != nil {
		t.Error(err)
		return
	}
	ctx := context.Background()
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(200 * time.Millisecond) {
		sbs, err := cl.List(ctx, client.ListOptions{})
		if client.IsRateLimited(err) {
			continue
		}
		if err != nil {
			t.Errorf("listing acme's sandboxes to remove them: %v", err)
			return
		}
		if len(sbs) == 0 {
			return
		}
		for _, sb := range sbs {
			_, _ = cl.Delete(ctx, sb.ID)
		}
	}
	t.Error("acme's sandboxes outlived the test")
}
