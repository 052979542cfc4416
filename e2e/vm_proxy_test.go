package e2e

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/torpor-dev/torpor"
)

// TestVMSandboxBehindTheProxy: a server in a microVM sandbox is reached
// through the port proxy; the idle policy pauses the VM by snapshot (QEMU
// exits), and the next request restores it and gets its answer, through
// the same auto-resume path as a container.
func TestVMSandboxBehindTheProxy(t *testing.T) {
	env := needsVM(t)
	d := startDaemon(t, torporBin(t), t.TempDir(), env...)
	id := strings.TrimSpace(d.ok("create", "--isolation", "vm", "--memory", "256", "--pause-after", "3",
		"--setup", "mkdir -p /www && echo hello from the vm > /www/index.html",
		"--", "httpd", "-f", "-p", "127.0.0.1:8080", "-h", "/www"))
	token := d.get(id).TrafficToken
	get := func() (int, string) {
		t.Helper()
		req, _ := http.NewRequest("GET", "http://"+d.proxy+"/index.html", nil)
		req.Host = "8080-" + id + ".localhost"
		req.Header.Set("X-Torpor-Token", token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if status, body := get(); status != 200 || body != "hello from the vm\n" {
		t.Fatalf("through the proxy: %d %q", status, body)
	}
	sb := d.waitState(id, torpor.StatePaused)
	if sb.PauseMode != torpor.PauseSnapshot {
		t.Fatalf("the idle engine paused the VM by %q, want snapshot (the VM default)", sb.PauseMode)
	}
	if status, body := get(); status != 200 || body != "hello from the vm\n" {
		t.Fatalf("the waking request: %d %q", status, body)
	}
	if sb := d.get(id); sb.State != torpor.StateRunning || sb.Meters.AutoResumed != 1 || sb.Boots != 1 {
		t.Fatalf("after the waking request: %s, auto-resumed %d, boots %d", sb.State, sb.Meters.AutoResumed, sb.Boots)
	}
	d.ok("rm", id)
}
