package e2e

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/torpor-dev/torpor"
)

// TestProxyWakesAnIdleSandbox: a server inside a real sandbox is reached
// through the proxy by host name; the idle policy pauses the sandbox, and
// the next request wakes it and gets its answer.
func TestProxyWakesAnIdleSandbox(t *testing.T) {
	needs(t)
	d := startDaemon(t, torporBin(t), t.TempDir())
	id := strings.TrimSpace(d.ok("create", "--pause-after", "2",
		"--setup", "mkdir -p /www && echo hello from the sandbox > /www/index.html",
		"--", "httpd", "-f", "-p", "127.0.0.1:8080", "-h", "/www"))
	token := d.get(id).TrafficToken
	get := func(tok string) (int, string) {
		req, _ := http.NewRequest("GET", "http://"+d.proxy+"/index.html", nil)
		req.Host = "8080-" + id + ".localhost"
		if tok != "" {
			req.Header.Set("X-Torpor-Token", tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if status, body := get(token); status != 200 || body != "hello from the sandbox\n" {
		t.Fatalf("through the proxy: %d %q", status, body)
	}
	if status, _ := get(""); status != 401 {
		t.Fatalf("without the token: %d", status)
	}
	d.waitState(id, torpor.StatePaused)
	if status, _ := get("wrong"); status != 403 || d.get(id).State != torpor.StatePaused {
		t.Fatal("a wrong token woke the sandbox")
	}
	if status, body := get(token); status != 200 || body != "hello from the sandbox\n" {
		t.Fatalf("the waking request: %d %q", status, body)
	}
	if sb := d.get(id); sb.State != torpor.StateRunning || sb.Meters.AutoResumed != 1 {
		t.Fatalf("after the waking request: %s %+v", sb.State, sb.Meters)
	}
	// From hibernation: the entrypoint boots again and the proxy waits for
	// it to listen before forwarding.
	d.ok("hibernate", id)
	if status, body := get(token); status != 200 || body != "hello from the sandbox\n" {
		t.Fatalf("the request to a hibernated sandbox: %d %q", status, body)
	}
}
