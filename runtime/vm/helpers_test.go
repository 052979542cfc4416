package vm

import (
	"bytes"
	"context"
	"crypto/md5"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/torpor-dev/torpor/files"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/rootfs"
)

// needHost skips unless the host can run microVMs: root (mounts for
// multi-layer templates, the guest kernel's directory), QEMU, qemu-img,
// mkfs.ext4, static busybox and the guest kernel that scripts/test.sh
// fetches.
func needHost(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	for _, tool := range []struct{ bin, pkg string }{
		{"qemu-system-x86_64", "qemu-system-x86"}, {"qemu-img", "qemu-utils"}, {"mkfs.ext4", "e2fsprogs"},
	} {
		if _, err := exec.LookPath(tool.bin); err != nil {
			t.Skipf("needs %s (apt-get install %s, or scripts/test.sh)", tool.bin, tool.pkg)
		}
	}
	if _, err := os.Stat(rootfs.BusyboxPath); err != nil {
		t.Skip("needs busybox-static (apt-get install busybox-static)")
	}
	if _, err := os.Stat(filepath.Join(kernelDir(), "vmlinux")); err != nil {
		t.Skipf("needs the guest kernel in %s (scripts/test.sh fetches it: ensure_vm_support)", kernelDir())
	}
}

func kernelDir() string {
	if d := os.Getenv("TORPOR_VM_KERNEL_DIR"); d != "" {
		return filepath.Join(d, "current")
	}
	return DefaultKernelDir
}

// buildAgent builds the static agent once per test process.
var buildAgent = sync.OnceValues(func() (string, error) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	dir := filepath.Join(os.TempDir(), fmt.Sprintf("torpor-test-agent-%d", os.Getuid()))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	out := filepath.Join(dir, "torpor-agent")
	tmp := fmt.Sprintf("%s.%d", out, os.Getpid())
	var lastErr error
	for attempt := 0; attempt < 20; attempt++ {
		if attempt > 0 {
			time.Sleep(3 * time.Second)
		}
		cmd := exec.Command(goTool, "build", "-trimpath", "-ldflags=-s -w", "-o", tmp, "github.com/torpor-dev/torpor/cmd/torpor-agent")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		var stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stderr, &stderr
		if err := cmd.Run(); err != nil {
			lastErr = fmt.Errorf("go build torpor-agent: %w\n%s", err, stderr.Bytes())
			continue
		}
		return out, os.Rename(tmp, out)
	}
	return "", lastErr
})

// accel is the acceleration the tests use: TORPOR_VM_ACCEL, else the
// probe's answer (once per test process).
var testAccel = sync.OnceValue(func() string {
	if a := os.Getenv("TORPOR_VM_ACCEL"); a != "" {
		return a
	}
	return ""
})

// testConfig returns a Config over a temporary directory and destroys
// what is left there at the end.
func testConfig(t testing.TB) Config {
	t.Helper()
	agent, err := buildAgent()
	if err != nil {
		t.Fatal(err)
	}
	cfg := Config{
		Dir:       filepath.Join(t.TempDir(), "state"),
		AgentPath: agent,
		KernelDir: kernelDir(),
		Accel:     testAccel(),
		DiskMiB:   256,
	}
	t.Cleanup(func() {
		r, err := New(context.Background(), cfg)
		if err != nil {
			return
		}
		ctx := context.Background()
		ids, _ := r.List(ctx)
		for _, id := range ids {
			if err := r.Destroy(ctx, torpor.InstanceRef{SandboxID: id}); err != nil {
				t.Errorf("cleanup: destroy %s: %v", id, err)
			}
		}
	})
	return cfg
}

// baseTemplate builds the busybox base template once per test.
func baseTemplate(t testing.TB) torpor.Template {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "templates", "base")
	if err := rootfs.BuildBase(context.Background(), dir); err != nil {
		t.Fatal(err)
	}
	return torpor.Template{Name: "base", RootFS: dir}
}

func newRuntime(t testing.TB, cfg Config) *Runtime {
	t.Helper()
	r, err := New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func md5hex(b []byte) string {
	sum := md5.Sum(b)
	return hex.EncodeToString(sum[:])
}

func asReadError(err error, re **files.ReadError) bool { return errors.As(err, re) }
