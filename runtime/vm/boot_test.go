package vm

import (
	"context"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

// A first guest whose agent stays silent is ended and booted once more:
// the boot succeeds on the second QEMU instead of waiting out its caller.
func TestBootAgainWhenTheAgentIsSilent(t *testing.T) {
	needHost(t)
	cfg := testConfig(t)
	tmpl := baseTemplate(t)
	rt := newRuntime(t, cfg)
	rt.silentAfter = 3 * time.Second
	var attempts []int
	rt.started = func(id string, attempt int) {
		attempts = append(attempts, attempt)
		if attempt != 1 {
			return
		}
		// The first guest's vCPUs stop before its agent can answer.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := qmpDo(ctx, rt.sandboxPath(id, qmpSock), "stop", nil, nil); err != nil {
			t.Errorf("stop the first guest: %v", err)
		}
	}
	ctx := testCtx(t)
	spec := torpor.BootSpec{SandboxID: torpor.NewID("rt_", 12), Template: tmpl,
		Resources: torpor.Resources{VCPUs: 1, MemoryMiB: 128}, Hostname: "silent"}
	h, err := rt.Boot(ctx, spec)
	if err != nil {
		t.Fatalf("boot: %v", err)
	}
	if len(attempts) != 2 {
		t.Errorf("QEMU started %d times (%v), want 2", len(attempts), attempts)
	}
	ref := torpor.InstanceRef{SandboxID: spec.SandboxID, Handle: h}
	if out := sh(t, rt, ref, "echo up"); out != "up\n" {
		t.Errorf("exec after the second boot: %q", out)
	}
	if held := qemuHolds(rt.sandboxDir(ref.SandboxID)); len(held) != 1 {
		t.Errorf("processes holding the sandbox's files: %v, want the second QEMU alone", held)
	}
}
