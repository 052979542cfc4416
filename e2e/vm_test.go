package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/runtime/vm"
)

var (
	agentOnce sync.Once
	agentPath string
	agentErr  error
)

// needsVM skips unless this host can run microVMs, and returns the
// environment that points a daemon at a freshly built guest agent.
func needsVM(t *testing.T) []string {
	needs(t)
	for _, tool := range []string{"qemu-system-x86_64", "qemu-img", "mkfs.ext4"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s (scripts/test.sh installs QEMU: ensure_vm_support)", tool)
		}
	}
	if _, err := os.Stat(filepath.Join(vm.DefaultKernelDir, "vmlinux")); err != nil {
		t.Skipf("needs the guest kernel in %s (scripts/test.sh fetches it: ensure_vm_support)", vm.DefaultKernelDir)
	}
	agentOnce.Do(func() {
		agentPath = filepath.Join(os.TempDir(), "torpor-e2e-agent")
		cmd := exec.Command("go", "build", "-trimpath", "-o", agentPath, "github.com/torpor-dev/torpor/cmd/torpor-agent")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			agentErr = err
			t.Logf("%s", out)
		}
	})
	if agentErr != nil {
		t.Fatalf("build the guest agent: %v", agentErr)
	}
	env := []string{"TORPOR_VM_AGENT=" + agentPath}
	if a := os.Getenv("TORPOR_VM_ACCEL"); a != "" {
		env = append(env, "TORPOR_VM_ACCEL="+a)
	}
	return env
}

// TestVMSandboxPausesToDisk creates a microVM sandbox through the CLI,
// pauses it by snapshot (the VM default: QEMU exits and the memory is on
// disk), wakes it with an exec, and finds what it kept in memory.
func TestVMSandboxPausesToDisk(t *testing.T) {
	env := needsVM(t)
	d := startDaemon(t, torporBin(t), t.TempDir(), env...)
	if out := d.ok("runtimes"); !strings.Contains(out, "vm") || !strings.Contains(out, "snapshot") || !strings.Contains(out, "accel=") {
		t.Fatalf("torpor runtimes does not list the VM runtime:\n%s", out)
	}
	id := strings.TrimSpace(d.ok("create", "--isolation", "vm", "--memory", "256"))
	if sb := d.get(id); sb.State != torpor.StateRunning || sb.Runtime.Kind != "vm" || sb.PauseModes[0] != torpor.PauseSnapshot {
		t.Fatalf("a VM sandbox: %s on %s, pause modes %v", sb.State, sb.Runtime.Kind, sb.PauseModes)
	}
	d.ok("exec", id, "--", "sh", "-c", "echo in-memory > /dev/shm/kept; echo on-disk > /kept")
	if out := d.ok("files", "cat", id, "/kept"); out != "on-disk\n" {
		t.Fatalf("files cat: %q", out)
	}
	d.ok("pause", id)
	sb := d.get(id)
	if sb.State != torpor.StatePaused || sb.PauseMode != torpor.PauseSnapshot || sb.Snapshot == nil || sb.Snapshot.SizeBytes == 0 {
		t.Fatalf("after pause: %s %s %+v", sb.State, sb.PauseMode, sb.Snapshot)
	}
	if out, _ := exec.Command("pgrep", "-f", "qemu-system.*"+id).Output(); len(out) > 0 {
		t.Fatalf("QEMU still runs for a snapshot-paused sandbox: %s", out)
	}
	if out := d.ok("exec", id, "--", "cat", "/dev/shm/kept"); out != "in-memory\n" {
		t.Fatalf("memory after restore: %q", out)
	}
	if sb := d.get(id); sb.State != torpor.StateRunning || sb.Boots != 1 || sb.Meters.AutoResumed != 1 {
		t.Fatalf("after the exec: %s, boots %d, auto-resumed %d", sb.State, sb.Boots, sb.Meters.AutoResumed)
	}
	d.ok("rm", id)
}
