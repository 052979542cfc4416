package initproc

import (
	"strings"
	"testing"
)

func TestSandboxEnv(t *testing.T) {
	if got := strings.Join(SandboxEnv(nil), " "); got != "HOME=/root PATH="+DefaultPath+" TERM=xterm" {
		t.Errorf("SandboxEnv(nil) = %s", got)
	}
	env := SandboxEnv(map[string]string{"PATH": "/custom", "A": "1"})
	if got := strings.Join(env, " "); got != "A=1 HOME=/root PATH=/custom TERM=xterm" {
		t.Errorf("SandboxEnv with PATH and A = %s", got)
	}
	// What an exec sets goes over the sandbox's environment.
	if got := strings.Join(MergeEnv(env, map[string]string{"A": "2", "B": "3"}), " "); got != "A=2 B=3 HOME=/root PATH=/custom TERM=xterm" {
		t.Errorf("MergeEnv = %s", got)
	}
	// Each caller gets its own copy of the defaults.
	SandboxEnv(nil)[0] = "HOME=/elsewhere"
	if got := SandboxEnv(nil)[0]; got != "HOME=/root" {
		t.Errorf("SandboxEnv(nil) after a caller changed its copy: %s", got)
	}
}
