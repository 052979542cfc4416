package s3test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The S3 server is tools/s3server, a small main over Versity's S3 gateway
// (github.com/versity/versitygw) in a module of its own. Its binary is
// built once per machine, when missing, into
// $XDG_CACHE_HOME/torpor-test/s3server-HASH/s3server (HASH: of the files
// of tools/s3server, so a change to them builds a new one), or taken from
// $TORPOR_S3SERVER when that is set (scripts/test.sh builds it there in
// the background, holding the lock file beside it, .lock, while it does;
// Start waits for that).

// ServerEnv names the environment variable that gives the path of a built
// tools/s3server binary; when it is set, Start uses it and builds nothing.
const ServerEnv = "TORPOR_S3SERVER"

// serverBinary returns the path of the server's binary, building it if it
// is missing. skip is true when the machine cannot build it for want of
// something outside the checkout (the go tool, the modules), not because
// the build is broken.
var serverBinary = sync.OnceValues(func() (path string, err error) {
	if p := os.Getenv(ServerEnv); p != "" {
		// scripts/test.sh builds it there in the background under the
		// lock beside it: wait for that build to end.
		if _, err := os.Stat(p); err != nil {
			if err := waitLock(filepath.Join(filepath.Dir(p), ".lock")); err != nil {
				return "", err
			}
		}
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("$%s: %w (did its build fail?)", ServerEnv, err)
		}
		return p, nil
	}
	src, err := sourceDir()
	if err != nil {
		return "", &missingError{err.Error()}
	}
	out, err := CachedPath(src)
	if err != nil {
		return "", err
	}
	if _, err := os.Stat(out); err == nil {
		return out, nil
	}
	return out, build(src, out)
})

// sourceDir finds tools/s3server: beside this file's package in the
// checkout the test was built from, or above the working directory.
func sourceDir() (string, error) {
	var tries []string
	if _, file, _, ok := runtime.Caller(0); ok && filepath.IsAbs(file) {
		tries = append(tries, filepath.Join(filepath.Dir(file), "..", "..", "tools", "s3server"))
	}
	if wd, err := os.Getwd(); err == nil {
		for d := wd; ; d = filepath.Dir(d) {
			tries = append(tries, filepath.Join(d, "tools", "s3server"))
			if filepath.Dir(d) == d {
				break
			}
		}
	}
	for _, d := range tries {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			return filepath.Clean(d), nil
		}
	}
	return "", errors.New("the source of the S3 server, tools/s3server, is not found")
}

// CachedPath returns where the binary built from the source directory src
// (tools/s3server) is kept: a path named by a hash of src's files, which
// scripts/test.sh computes the same way (sha256 of the files' contents
// one after the other, in the order of their names).
func CachedPath(src string) (string, error) {
	entries, err := os.ReadDir(src)
	if err != nil {
		return "", err
	}
	h := sha256.New()
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(src, e.Name()))
		if err != nil {
			return "", err
		}
		h.Write(b)
	}
	cache := os.Getenv("XDG_CACHE_HOME")
	if cache == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", err
		}
		cache = filepath.Join(home, ".cache")
	}
	return filepath.Join(cache, "torpor-test", "s3server-"+hex.EncodeToString(h.Sum(nil))[:12], "s3server"), nil
}

// missingError is a server that cannot be built on this machine for want
// of something the checkout does not hold.
type missingError struct{ what string }

func (e *missingError) Error() string { return e.what }

// offline matches the go tool's complaints about modules it cannot fetch.
var offline = regexp.MustCompile(`GOPROXY=off|GOFLAGS=-mod=|dial tcp|no such host|connection refused|i/o timeout|network is unreachable|Get "https?://|module lookup disabled|missing go.sum entry|cannot find module`)

// build builds the binary into out, under a lock that lets one build run
// per machine at a time (test binaries of several packages start at once).
func build(src, out string) error {
	goTool, err := exec.LookPath("go")
	if err != nil {
		goTool = filepath.Join(runtime.GOROOT(), "bin", "go")
		if _, statErr := os.Stat(goTool); statErr != nil {
			return &missingError{"the go tool, to build the S3 server (tools/s3server)"}
		}
	}
	dir := filepath.Dir(out)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	lock, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return err
	}
	if _, err := os.Stat(out); err == nil {
		return nil // built by another process while this one waited
	}
	tmp := fmt.Sprintf("%s.%d", out, os.Getpid())
	defer os.Remove(tmp)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, goTool, "build", "-trimpath", "-o", tmp, ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "GOWORK=off", "GOFLAGS=", "CGO_ENABLED=0")
	var output bytes.Buffer
	cmd.Stdout, cmd.Stderr = &output, &output
	start := time.Now()
	if err := cmd.Run(); err != nil {
		msg := fmt.Sprintf("go build %s: %v\n%s", src, err, output.Bytes())
		if offline.Match(output.Bytes()) {
			return &missingError{"the S3 server's modules (github.com/versity/versitygw, from the Go module proxy) to build it, or a built binary at " + out + " or in $" + ServerEnv + ": " + msg}
		}
		return errors.New(msg)
	}
	fmt.Fprintf(os.Stderr, "s3test: built the S3 server in %v: %s\n", time.Since(start).Round(100*time.Millisecond), out)
	return os.Rename(tmp, out)
}

// waitLock waits until no one holds the lock file, if there is one.
func waitLock(path string) error {
	f, err := os.Open(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	return syscall.Flock(int(f.Fd()), syscall.LOCK_SH)
}

// serverProcess is a running tools/s3server.
type serverProcess struct {
	cmd   *exec.Cmd
	stdin *os.File // its end of the pipe on the server's stdin: closing it stops the server
	done  chan struct{}
	log   string
	dir   string
}

// startServer starts the server serving on a UNIX socket in a new
// temporary directory, which also holds its data, and waits until it
// answers.
func startServer(tb testing.TB) *serverProcess {
	tb.Helper()
	bin, err := serverBinary()
	if err != nil {
		var missing *missingError
		if errors.As(err, &missing) {
			tb.Skipf("s3test: no S3 server on this machine; it needs %v", err)
		}
		tb.Fatalf("s3test: build the S3 server: %v", err)
	}
	// A short directory of its own: a UNIX socket's path is limited to
	// 108 bytes, which a test's TempDir can pass.
	dir, err := os.MkdirTemp("", "s3test-")
	if err != nil {
		tb.Fatalf("s3test: %v", err)
	}
	p := &serverProcess{dir: dir, log: filepath.Join(dir, "server.log"), done: make(chan struct{})}
	for _, d := range []string{"data", "meta"} {
		if err := os.Mkdir(filepath.Join(dir, d), 0o755); err != nil {
			tb.Fatalf("s3test: %v", err)
		}
	}
	logFile, err := os.Create(p.log)
	if err != nil {
		tb.Fatalf("s3test: %v", err)
	}
	defer logFile.Close()
	r, w, err := os.Pipe()
	if err != nil {
		tb.Fatalf("s3test: %v", err)
	}
	defer r.Close()
	p.stdin = w
	sock := filepath.Join(dir, "s3.sock")
	p.cmd = exec.Command(bin, "-listen", sock, "-root", filepath.Join(dir, "data"),
		"-meta", filepath.Join(dir, "meta"), "-region", Region, "-watch-stdin")
	p.cmd.Env = append(os.Environ(), "S3SERVER_ACCESS_KEY="+AccessKey, "S3SERVER_SECRET_KEY="+SecretKey)
	p.cmd.Stdin, p.cmd.Stdout, p.cmd.Stderr = r, logFile, logFile
	if err := p.cmd.Start(); err != nil {
		w.Close()
		os.RemoveAll(dir)
		tb.Fatalf("s3test: start the S3 server: %v", err)
	}
	go func() { p.cmd.Wait(); close(p.done) }()
	tb.Cleanup(p.stop)

	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := net.Dial("unix", sock)
		if err == nil {
			conn.Close()
			return p
		}
		select {
		case <-p.done:
			tb.Fatalf("s3test: the S3 server exited: %v\n%s", p.cmd.ProcessState, p.logTail())
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			tb.Fatalf("s3test: the S3 server does not answer on %s after 30s\n%s", sock, p.logTail())
		}
	}
}

func (p *serverProcess) socket() string { return filepath.Join(p.dir, "s3.sock") }

func (p *serverProcess) logTail() string {
	b, _ := os.ReadFile(p.log)
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// stop stops the server (SIGTERM, then SIGKILL after 5 seconds) and
// removes its data.
func (p *serverProcess) stop() {
	p.stdin.Close()
	p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(5 * time.Second):
		p.cmd.Process.Kill()
		<-p.done
	}
	os.RemoveAll(p.dir)
}
