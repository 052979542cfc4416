package e2e

import (
	"io"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/network"
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
// with a disk of its own size and a web server, finds it on the sandbox
// network (its address in the API, reached from the host), pauses it by
// snapshot (the VM default: QEMU exits and the memory is on disk), wakes
// it with an exec, and finds what it kept in memory and its address.
func TestVMSandboxPausesToDisk(t *testing.T) {
	env := needsVM(t)
	d := startDaemon(t, torporBin(t), t.TempDir(), env...)
	if out := d.ok("runtimes"); !strings.Contains(out, "vm") || !strings.Contains(out, "snapshot") || !strings.Contains(out, "accel=") {
		t.Fatalf("torpor runtimes does not list the VM runtime:\n%s", out)
	}
	id := strings.TrimSpace(d.ok("create", "--isolation", "vm", "--memory", "256", "--disk", "768",
		"--setup", "mkdir -p /www && echo vm-web > /www/index.html", "--", "httpd", "-f", "-p", "8080", "-h", "/www"))
	sb := d.get(id)
	if sb.State != torpor.StateRunning || sb.Runtime.Kind != "vm" || sb.PauseModes[0] != torpor.PauseSnapshot {
		t.Fatalf("a VM sandbox: %s on %s, pause modes %v", sb.State, sb.Runtime.Kind, sb.PauseModes)
	}
	addr, err := netip.ParseAddr(sb.Address)
	if err != nil || !network.DefaultPrefix.Contains(addr) {
		t.Fatalf("the VM's address in the API: %q (%v), want one of %s", sb.Address, err, network.DefaultPrefix)
	}
	if got := sandboxAddr(t, d, id); got != addr {
		t.Fatalf("the API says %s, the guest's eth0 has %s", addr, got)
	}
	web := "http://" + sb.Address + ":8080/"
	if got := vmWeb(t, web); got != "vm-web\n" {
		t.Fatalf("the host to the VM's server: %q", got)
	}
	if out := strings.Fields(d.ok("exec", id, "--", "sh", "-c", "df -k / | tail -n 1")); len(out) < 2 || !within(out[1], 768<<10*9/10, 768<<10) {
		t.Fatalf("df in a VM of 768 MiB disk: %v", out)
	}
	d.ok("exec", id, "--", "sh", "-c", "echo in-memory > /dev/shm/kept; echo on-disk > /kept")
	if out := d.ok("files", "cat", id, "/kept"); out != "on-disk\n" {
		t.Fatalf("files cat: %q", out)
	}
	d.ok("pause", id)
	sb = d.get(id)
	if sb.State != torpor.StatePaused || sb.PauseMode != torpor.PauseSnapshot || sb.Snapshot == nil || sb.Snapshot.SizeBytes == 0 {
		t.Fatalf("after pause: %s %s %+v", sb.State, sb.PauseMode, sb.Snapshot)
	}
	if out, _ := exec.Command("pgrep", "-f", "qemu-system.*"+id).Output(); len(out) > 0 {
		t.Fatalf("QEMU still runs for a snapshot-paused sandbox: %s", out)
	}
	if out := d.ok("exec", id, "--", "cat", "/dev/shm/kept"); out != "in-memory\n" {
		t.Fatalf("memory after restore: %q", out)
	}
	if sb := d.get(id); sb.State != torpor.StateRunning || sb.Boots != 1 || sb.Meters.AutoResumed != 1 || sb.Address != addr.String() {
		t.Fatalf("after the exec: %s, boots %d, auto-resumed %d, address %q (was %s)", sb.State, sb.Boots, sb.Meters.AutoResumed, sb.Address, addr)
	}
	if got := vmWeb(t, web); got != "vm-web\n" {
		t.Fatalf("the host to the restored VM's server: %q", got)
	}
	d.ok("rm", id)
	if leaseExists(addr) {
		t.Errorf("the address %s is still leased after rm", addr)
	}
}

// vmWeb GETs url from the host, waiting for the VM's server to listen
// (it starts as the entrypoint: it may not listen yet when create
// returns).
func vmWeb(t *testing.T, url string) string {
	t.Helper()
	hc := &http.Client{Timeout: 20 * time.Second}
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := hc.Get(url)
		if err == nil {
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			return string(b)
		}
		if time.Now().After(deadline) {
			t.Fatalf("GET %s: %v", url, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// within reports whether the decimal n is in [lo, hi].
func within(n string, lo, hi int64) bool {
	v, err := strconv.ParseInt(n, 10, 64)
	return err == nil && v >= lo && v <= hi
}
