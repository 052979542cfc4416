package runtimetest

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"sync"
	"testing"
	"time"
)

// initPackage is the torpor command; its binary is the sandboxes' init.
const initPackage = "github.com/torpor-dev/torpor/cmd/torpor"

// buildInit builds the init binary once per test process.
var buildInit = sync.OnceValues(func() (string, error) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
		if _, statErr := os.Stat(goTool); statErr != nil {
			return "", fmt.Errorf("needs the go tool to build the init binary: %w", err)
		}
	}
	// One stable path per user and checkout: repeated runs overwrite it
	// instead of leaving binaries behind, and tests of two checkouts
	// (worktrees) at once do not run each other's build. A running
	// sandbox keeps the file it bind-mounted even when the path gets a
	// new one.
	dir := filepath.Join(os.TempDir(), fmt.Sprintf("torpor-test-init-%d-%s", os.Getuid(), checkoutTag()))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	out := filepath.Join(dir, "torpor")
	tmp := fmt.Sprintf("%s.%d", out, os.Getpid())
	var lastErr error
	// cmd/torpor may be mid-edit by someone else: retry for a while.
	for attempt := 0; attempt < 20; attempt++ {
		if attempt > 0 {
			time.Sleep(3 * time.Second)
		}
		cmd := exec.Command(goTool, "build", "-o", tmp, initPackage)
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		var stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stderr, &stderr
		if err := cmd.Run(); err != nil {
			lastErr = fmt.Errorf("go build %s: %w\n%s", initPackage, err, stderr.Bytes())
			continue
		}
		if err := os.Rename(tmp, out); err != nil {
			return "", err
		}
		return out, nil
	}
	os.Remove(tmp)
	return "", lastErr
})

// BuildInit returns the path of a statically linked torpor binary (built
// with CGO_ENABLED=0) for runtimes to use as the sandboxes' init. It is
// built once per test process and retried for about a minute while
// cmd/torpor does not compile.
func BuildInit(t testing.TB) string {
	t.Helper()
	p, err := buildInit()
	if err != nil {
		t.Fatalf("build the init binary: %v", err)
	}
	return p
}

// checkoutTag names the checkout the test runs in: a short hash of the
// directory of the go.mod above the working directory.
func checkoutTag() string {
	dir, _ := os.Getwd()
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			dir = d
			break
		}
		if filepath.Dir(d) == d {
			break
		}
	}
	sum := sha256.Sum256([]byte(dir))
	return hex.EncodeToString(sum[:4])
}
