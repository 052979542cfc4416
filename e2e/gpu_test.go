package e2e

import (
	"strings"
	"testing"

	"github.com/torpor-dev/torpor"
)

// TestGPUSandboxOnTheSimulatedHost drives a GPU sandbox through the CLI
// of a daemon started with the simulated GPU host: a transparent lease
// spills on pause (the simulated host has no hard cap), exec wakes it as a
// job, and after a daemon crash the simulated host (which lives in the
// daemon) is gone, so the lease restores dead and its sandbox fails.
func TestGPUSandboxOnTheSimulatedHost(t *testing.T) {
	needs(t)
	bin := torporBin(t)
	dataDir := t.TempDir()
	d := startDaemon(t, bin, dataDir, "TORPOR_GPU_SIM=true")
	if _, stderr, code := d.cli("create", "--vram", "4096", "--gpu-idle-timeout", "5"); code == 0 || !strings.Contains(stderr, "accel.idle_timeout_s") {
		t.Fatalf("an idle timeout under 60 s was accepted (%d): %s", code, stderr)
	}
	id := strings.TrimSpace(d.ok("create", "--vram", "4096", "--suspend-mode", "transparent"))
	if out := d.ok("get", id); !strings.Contains(out, "phase resident") || !strings.Contains(out, "4096 MiB") {
		t.Fatalf("torpor get of a GPU sandbox:\n%s", out)
	}
	d.ok("pause", id)
	if out := d.ok("get", id); !strings.Contains(out, "phase suspended") || !strings.Contains(out, "spilled true") {
		t.Fatalf("after pause:\n%s", out)
	}
	if out := d.ok("exec", id, "--", "echo", "job"); out != "job\n" {
		t.Fatalf("exec: %q", out)
	}
	if sb := d.get(id); sb.State != torpor.StateRunning {
		t.Fatalf("after exec: %s", sb.State)
	}
	_ = d.cmd.Process.Kill()
	<-d.exited
	d = startDaemon(t, bin, dataDir, "TORPOR_GPU_SIM=true")
	sb := d.waitState(id, torpor.StateFailed)
	if sb.Failure == nil || sb.Failure.Code != "gpu_lease_dead" {
		t.Fatalf("failure %+v, want gpu_lease_dead", sb.Failure)
	}
	d.ok("rm", id)
}
