package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/torpor-dev/torpor"
)

// TestHooksInARealSandbox: script hooks run inside the sandbox on each
// transition (the pause hook before the freeze), an http hook reaches a
// server listening on the sandbox's own loopback, and a failing hook is
// recorded without stopping the transition.
func TestHooksInARealSandbox(t *testing.T) {
	needs(t)
	d := startDaemon(t, torporBin(t), t.TempDir())
	hooks := filepath.Join(t.TempDir(), "hooks.json")
	os.WriteFile(hooks, []byte(`[
	  {"type": "script", "on": "start",  "path": "/bin/sh", "arguments": ["-c", "echo start >> /hooks.log"], "wait": true},
	  {"type": "script", "on": "pause",  "path": "/bin/sh", "arguments": ["-c", "echo pause >> /hooks.log"], "wait": true},
	  {"type": "script", "on": "resume", "path": "/bin/sh", "arguments": ["-c", "echo resume >> /hooks.log"], "wait": true},
	  {"type": "http",   "on": "pause",  "port": 8080, "path": "/cgi-bin/flush", "wait": true, "timeout_seconds": 5},
	  {"type": "script", "on": "resume", "path": "/bin/false", "wait": true}
	]`), 0o600)
	id := strings.TrimSpace(d.ok("create", "--hooks-file", hooks,
		"--setup", `mkdir -p /www/cgi-bin && printf '#!/bin/sh\necho Content-Type: text/plain\necho\necho http >> /hooks.log\n' > /www/cgi-bin/flush && chmod +x /www/cgi-bin/flush`,
		"--", "httpd", "-f", "-p", "127.0.0.1:8080", "-h", "/www"))
	d.ok("pause", id)
	sb := d.get(id)
	if sb.HookFailure != nil {
		t.Fatalf("a pause hook failed: %+v", sb.HookFailure)
	}
	d.ok("start", id)
	if out := d.ok("exec", id, "--", "cat", "/hooks.log"); out != "start\npause\nhttp\nresume\n" {
		t.Fatalf("hooks.log: %q", out)
	}
	sb = d.get(id)
	if sb.State != torpor.StateRunning || sb.HookFailure == nil || sb.HookFailure.On != "resume" || sb.HookFailure.Index != 4 {
		t.Fatalf("after a failing resume hook: %s %+v", sb.State, sb.HookFailure)
	}
	evs := d.ok("events", id)
	if strings.Count(evs, "hook.ran") != 4 || strings.Count(evs, "hook.failed") != 1 {
		t.Fatalf("events:\n%s", evs)
	}
}
