package runc

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"github.com/torpor-dev/torpor"
)

// TestExecRunsThroughTheCodeServer: an exec's helper is started by the
// sandbox's code server, not by runc exec, and its command has the
// capabilities one that runc exec starts has (not the code server's).
func TestExecRunsThroughTheCodeServer(t *testing.T) {
	needHost(t)
	ctx := context.Background()
	r, base := newTestRuntime(t)
	ref := bootOne(t, r, base, nil)
	script := `grep CapEff /proc/self/status; tr '\0' ' ' < /proc/$(awk '{print $4}' /proc/$PPID/stat)/cmdline`
	var out bytes.Buffer
	if res, err := r.Exec(ctx, ref, torpor.ExecRequest{Cmd: []string{"/bin/sh", "-c", script}, Stdout: &out}); err != nil || res.ExitCode != 0 {
		t.Fatalf("exec: %+v, %v", res, err)
	}
	var direct bytes.Buffer
	if _, _, err := r.runExec(ctx, ref.SandboxID, staticInitArgv, torpor.ExecRequest{Cmd: []string{"grep", "CapEff", "/proc/self/status"}, Stdout: &direct}); err != nil {
		t.Fatal(err)
	}
	caps, parent, _ := strings.Cut(out.String(), "\n")
	if !strings.Contains(parent, "init code-server") {
		t.Errorf("the helper's parent is %q, want the code server", parent)
	}
	if caps+"\n" != direct.String() {
		t.Errorf("capabilities through the code server %q, through runc exec %q", caps, direct.String())
	}
	// Each of the server's threads may fork the next helper.
	for i := 0; i < 10; i++ {
		var again bytes.Buffer
		if _, err := r.Exec(ctx, ref, torpor.ExecRequest{Cmd: []string{"grep", "CapEff", "/proc/self/status"}, Stdout: &again}); err != nil {
			t.Fatal(err)
		}
		if again.String() != direct.String() {
			t.Fatalf("capabilities through the code server %q, through runc exec %q", again.String(), direct.String())
		}
	}
}
