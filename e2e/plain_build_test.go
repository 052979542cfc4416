package e2e

import (
	"bytes"
	"context"
	"debug/elf"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/client"
)

// plainBuild builds cmd/torpor the way `go build` and `go install` do on a
// host with a C compiler: with cgo, so that it is linked against the
// host's C library. It skips where there is no C compiler.
func plainBuild(t *testing.T) string {
	t.Helper()
	cc, err := exec.Command("go", "env", "CC").Output()
	if err != nil {
		t.Fatalf("go env CC: %v", err)
	}
	if _, err := exec.LookPath(strings.Fields(string(cc) + " gcc")[0]); err != nil {
		t.Skipf("needs a C compiler (%s) for a cgo build: apt-get install build-essential", strings.TrimSpace(string(cc)))
	}
	bin := filepath.Join(t.TempDir(), "torpor")
	var lastErr error
	var out bytes.Buffer
	// cmd/torpor may be mid-edit by someone else: retry for a while.
	for attempt := 0; attempt < 10; attempt++ {
		if attempt > 0 {
			time.Sleep(3 * time.Second)
		}
		out.Reset()
		cmd := exec.Command("go", "build", "-o", bin, "github.com/torpor-dev/torpor/cmd/torpor")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=1")
		cmd.Stdout, cmd.Stderr = &out, &out
		if lastErr = cmd.Run(); lastErr == nil {
			break
		}
	}
	if lastErr != nil {
		t.Fatalf("go build: %v\n%s", lastErr, out.Bytes())
	}
	f, err := elf.Open(bin)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return bin
		}
	}
	t.Fatalf("a cgo build of cmd/torpor is statically linked: the test would prove nothing")
	return ""
}

// TestPlainGoBuildRunsSandboxes: the daemon that a plain `go build` makes
// (dynamically linked) boots sandboxes whose root file system has no C
// library (the base template is busybox alone), and its init, exec helper
// and code server work in them.
func TestPlainGoBuildRunsSandboxes(t *testing.T) {
	needs(t)
	d := startDaemon(t, plainBuild(t), t.TempDir())
	cl := d.client(t)
	ctx := context.Background()
	id := strings.TrimSpace(d.ok("create", "--template", "base", "--setup", "echo set > /setup"))
	if out := d.ok("exec", id, "--", "echo", "ok"); out != "ok\n" {
		t.Fatalf("exec: %q", out)
	}
	if out := d.ok("exec", id, "--", "cat", "/setup"); out != "set\n" {
		t.Fatalf("setup: %q", out)
	}
	if _, err := os.Stat(filepath.Join(d.dataDir, "templates", "base", "rootfs", "lib64")); err == nil {
		t.Log("the base template has /lib64: the test is weaker than meant")
	}
	res, err := cl.RunCode(ctx, id, client.CodeRequest{Language: "sh", Code: "echo code"})
	if err != nil || res.Stdout != "code\n" {
		t.Fatalf("run_code: %+v %v\n%s", res, err, d.logs.String())
	}
	d.ok("pause", id)
	if sb := d.get(id); sb.State != torpor.StatePaused {
		t.Fatalf("after pause: %s", sb.State)
	}
	d.ok("resume", id)
	if out := d.ok("exec", id, "--", "echo", "ok"); out != "ok\n" {
		t.Fatalf("exec after resume: %q", out)
	}
	d.ok("rm", id)
	assertNoTrace(t, id)
}

// TestSwitchingBuildsKeepsSandboxes: a daemon built the other way (static
// or dynamic) adopts the running sandboxes of the one before it and runs
// its helpers in each as that sandbox was booted to run them.
func TestSwitchingBuildsKeepsSandboxes(t *testing.T) {
	needs(t)
	static, dynamic := torporBin(t), plainBuild(t)
	dataDir := t.TempDir()
	d := startDaemon(t, static, dataDir)
	a := strings.TrimSpace(d.ok("create", "--template", "base"))
	d.stop()

	d = startDaemon(t, dynamic, dataDir)
	b := strings.TrimSpace(d.ok("create", "--template", "base"))
	for _, id := range []string{a, b} {
		if out := d.ok("exec", id, "--", "echo", "ok"); out != "ok\n" {
			t.Fatalf("exec in %s under the dynamic build: %q", id, out)
		}
	}
	d.stop()

	d = startDaemon(t, static, dataDir)
	cl := d.client(t)
	for _, id := range []string{a, b} {
		if out := d.ok("exec", id, "--", "echo", "ok"); out != "ok\n" {
			t.Fatalf("exec in %s under the static build: %q", id, out)
		}
		res, err := cl.RunCode(context.Background(), id, client.CodeRequest{Language: "sh", Code: "echo code"})
		if err != nil || res.Stdout != "code\n" {
			t.Fatalf("run_code in %s under the static build: %+v %v", id, res, err)
		}
	}
}
