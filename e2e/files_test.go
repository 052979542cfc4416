package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/client"
	"github.com/torpor-dev/torpor/files"
)

// TestFiles drives the files API of a real sandbox through the CLI and the
// Go client: the operations, files shared with processes inside, paused
// sandboxes, escapes prepared from inside, and tar round trips.
func TestFiles(t *testing.T) {
	needs(t)
	d := startDaemon(t, torporBin(t), t.TempDir())
	cl := d.client(t)
	id := strings.TrimSpace(d.ok("create"))

	t.Run("operations", func(t *testing.T) { filesOperations(t, d.in(t), id) })
	t.Run("shared with exec", func(t *testing.T) { filesSharedWithExec(t, d.in(t), cl, id) })
	t.Run("escapes from inside", func(t *testing.T) { filesEscapesFromInside(t, d.in(t), cl, id) })
	t.Run("tar round trip", func(t *testing.T) { filesTarRoundTrip(t, d.in(t), id) })
	t.Run("paused", func(t *testing.T) { filesOfPausedSandboxes(t, d.in(t), cl, id) })
}

// in returns the daemon with its helpers reporting to the subtest t.
func (d *daemon) in(t *testing.T) *daemon {
	c := *d
	c.t = t
	return &c
}

func filesOperations(t *testing.T, d *daemon, id string) {
	local := filepath.Join(t.TempDir(), "hello.txt")
	os.WriteFile(local, []byte("hello\n"), 0o640)
	d.ok("files", "put", "--mode", "0640", id, "/root/a/b/hello.txt", local)
	if out := d.ok("files", "cat", id, "/root/a/b/hello.txt"); out != "hello\n" {
		t.Fatalf("cat %q", out)
	}
	var info files.Info
	if err := json.Unmarshal([]byte(d.ok("files", "stat", id, "/root/a/b/hello.txt", "--json")), &info); err != nil ||
		info.Size != 6 || info.Type != files.TypeFile || info.Mode != 0o640 {
		t.Fatalf("stat %+v %v", info, err)
	}
	d.ok("files", "mkdir", "-p", id, "/root/x/y")
	d.ok("files", "mv", id, "/root/a/b/hello.txt", "/root/x/y/moved.txt")
	var l files.Listing
	if err := json.Unmarshal([]byte(d.ok("files", "ls", id, "/root", "-d", "3", "--json")), &l); err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, e := range l.Entries {
		paths = append(paths, e.Path)
	}
	if strings.Join(paths, " ") != "/root/a /root/a/b /root/x /root/x/y /root/x/y/moved.txt" {
		t.Fatalf("ls: %v", paths)
	}
	if _, errs, code := d.cli("files", "rm", id, "/root/x"); code == 0 || !strings.Contains(errs, "not empty") {
		t.Fatalf("rm of a non-empty dir: %d %q", code, errs)
	}
	d.ok("files", "rm", "-r", id, "/root/x", "/root/a")
	if out := d.ok("files", "ls", id, "/root"); strings.Count(out, "\n") != 1 {
		t.Fatalf("ls after rm:\n%s", out)
	}
	if _, errs, code := d.cli("files", "cat", id, "/proc/1/environ"); code == 0 || !strings.Contains(errs, "invalid_argument") {
		t.Fatalf("cat of /proc: %d %q", code, errs)
	}
}

func filesSharedWithExec(t *testing.T, d *daemon, cl *client.Client, id string) {
	ctx := context.Background()
	d.ok("exec", id, "--", "sh", "-c", "echo from-exec > /tmp/e")
	if got := readString(t, cl, id, "/tmp/e"); got != "from-exec\n" {
		t.Fatalf("a file written by exec reads %q", got)
	}
	if _, err := cl.WriteFile(ctx, id, "/tmp/api", strings.NewReader("from-api"), nil); err != nil {
		t.Fatal(err)
	}
	if out := d.ok("exec", id, "--", "cat", "/tmp/api"); out != "from-api" {
		t.Fatalf("exec reads %q", out)
	}
}

func readString(t *testing.T, cl *client.Client, id, p string) string {
	t.Helper()
	rc, err := cl.ReadFile(context.Background(), id, p)
	if err != nil {
		t.Fatalf("read %s: %v", p, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// hostShadow returns the first line of the host's /etc/shadow: what must
// never come back from a sandbox.
func hostShadow(t *testing.T) string {
	b, err := os.ReadFile("/etc/shadow")
	if err != nil || len(b) == 0 {
		t.Skip("no /etc/shadow on the host")
	}
	return strings.SplitN(string(b), "\n", 2)[0]
}

// filesEscapesFromInside: symlinks made by a process inside the sandbox,
// fixed and swapped in a loop during many reads, never lead to the host.
func filesEscapesFromInside(t *testing.T, d *daemon, cl *client.Client, id string) {
	ctx := context.Background()
	shadow := hostShadow(t)
	d.ok("exec", id, "--", "sh", "-c", `cd /root && ln -s /etc/shadow abs && ln -s ../../../../../../etc/shadow rel &&
		ln -s /proc/1/root/etc/shadow magic && mkdir -p real && echo inside > real/shadow && echo inside > plain`)
	for _, p := range []string{"/root/abs", "/root/rel", "/root/magic", "/root/../../etc/shadow"} {
		rc, err := cl.ReadFile(ctx, id, p)
		if err == nil {
			b, _ := io.ReadAll(rc)
			rc.Close()
			t.Fatalf("%s read %q", p, b)
		}
		if !client.IsNotFound(err) {
			t.Fatalf("%s: %v, want not_found (the sandbox has no /etc/shadow)", p, err)
		}
	}
	// A process inside swaps a file and a directory with symlinks to
	// /etc/shadow and /etc, as fast as it can, while the daemon reads.
	d.ok("exec", id, "--", "sh", "-c", `cd /root && nohup sh -c 'while :; do
		ln -s /etc/shadow t1; mv -f t1 swap; cp plain t2; mv -f t2 swap;
		ln -s /etc t3; rm -rf dir; mv -f t3 dir; rm -f dir; cp -r real t4; mv -f t4 dir; done' >/dev/null 2>&1 &
		echo $! > /tmp/swap.pid`)
	defer d.ok("exec", id, "--", "sh", "-c", "kill $(cat /tmp/swap.pid)")
	ok := 0
	for i := 0; i < 300; i++ {
		for _, p := range []string{"/root/swap", "/root/dir/shadow"} {
			rc, err := cl.ReadFile(ctx, id, p)
			if err != nil {
				if torpor.ErrorCodeOf(err) == torpor.EInternal {
					t.Fatalf("read %s: %v", p, err)
				}
				continue
			}
			b, _ := io.ReadAll(rc)
			rc.Close()
			if strings.Contains(string(b), shadow) || string(b) != "inside\n" {
				t.Fatalf("read %d of %s returned %q", i, p, b)
			}
			ok++
		}
	}
	t.Logf("%d of 600 reads succeeded while the links were swapped", ok)
	if ok == 0 {
		t.Fatal("no read succeeded: the swap was not exercised")
	}
}

func filesTarRoundTrip(t *testing.T, d *daemon, id string) {
	d.ok("exec", id, "--", "sh", "-c", `mkdir -p /root/proj/sub/deep && cd /root/proj && echo alpha > a &&
		head -c 300000 /dev/urandom > sub/blob && ln -s sub/blob link && ln -s /etc/shadow bad && chmod 0751 sub`)
	local := filepath.Join(t.TempDir(), "proj")
	d.ok("cp", id+":/root/proj", local)
	if b, _ := os.ReadFile(filepath.Join(local, "a")); string(b) != "alpha\n" {
		t.Fatalf("copied a: %q", b)
	}
	if target, _ := os.Readlink(filepath.Join(local, "bad")); target != "/etc/shadow" {
		t.Fatalf("symlinks are copied as symlinks: %q", target)
	}
	d.ok("cp", local, id+":/root/proj2")
	sum := func(dir string) string {
		return d.ok("exec", id, "--", "sh", "-c", "cd "+dir+" && find . | sort && stat -c '%a %n' a sub sub/deep sub/blob && md5sum a sub/blob && readlink link && readlink bad")
	}
	if a, b := sum("/root/proj"), sum("/root/proj2"); a != b {
		t.Fatalf("round trip differs:\n%s\n---\n%s", a, b)
	}
	// cp of a single file both ways, and into an existing directory.
	d.ok("cp", filepath.Join(local, "a"), id+":/root/")
	if out := d.ok("files", "cat", id, "/root/a"); out != "alpha\n" {
		t.Fatalf("cp into a directory: %q", out)
	}
	d.ok("cp", id+":/root/proj/sub/blob", local)
	if st, err := os.Stat(filepath.Join(local, "blob")); err != nil || st.Size() != 300000 {
		t.Fatalf("cp out into a directory: %v %v", st, err)
	}
}

// filesOfPausedSandboxes: a read leaves a paused sandbox paused; a write
// wakes it, or with auto_resume off is a 409.
func filesOfPausedSandboxes(t *testing.T, d *daemon, cl *client.Client, id string) {
	ctx := context.Background()
	local := filepath.Join(t.TempDir(), "p")
	os.WriteFile(local, []byte("p"), 0o644)
	d.ok("files", "put", id, "/root/p", local)
	d.ok("pause", id)
	if _, err := cl.StatFile(ctx, id, "/root/p"); err != nil {
		t.Fatal(err)
	}
	readString(t, cl, id, "/root/p")
	if sb := d.get(id); sb.State != torpor.StatePaused {
		t.Fatalf("a read woke the sandbox: %s", sb.State)
	}
	if _, err := cl.WriteFile(ctx, id, "/root/w", strings.NewReader("w"), nil); err != nil {
		t.Fatal(err)
	}
	if sb := d.get(id); sb.State != torpor.StateRunning || sb.Meters.AutoResumed != 1 {
		t.Fatalf("a write did not wake the sandbox: %s %+v", sb.State, sb.Meters)
	}

	off := strings.TrimSpace(d.ok("create", "--auto-resume=false"))
	d.ok("pause", off)
	if out := d.ok("files", "ls", off, "/etc"); !strings.Contains(out, "passwd") {
		t.Fatalf("ls of a paused sandbox:\n%s", out)
	}
	_, err := cl.WriteFile(ctx, off, "/root/w", strings.NewReader("w"), nil)
	if !client.IsConflict(err) || !strings.Contains(err.Error(), "connect") {
		t.Fatalf("a write with auto_resume off: %v", err)
	}
	if sb := d.get(off); sb.State != torpor.StatePaused {
		t.Fatalf("a refused write changed the state: %s", sb.State)
	}
}

// zeroReader yields zeros without end.
type zeroReader struct{}

func (zeroReader) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}

// rssWatch samples a process's resident memory until stopped and keeps
// the highest value.
type rssWatch struct {
	pid  int
	stop chan struct{}
	done chan struct{}
	mu   sync.Mutex
	max  int64
}

func watchRSS(t *testing.T, pid int) *rssWatch {
	w := &rssWatch{pid: pid, stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for {
			if kb := vmRSS(t, pid); kb > 0 {
				w.mu.Lock()
				w.max = max(w.max, kb)
				w.mu.Unlock()
			}
			select {
			case <-w.stop:
				return
			case <-time.After(20 * time.Millisecond):
			}
		}
	}()
	return w
}

func (w *rssWatch) peak() int64 {
	close(w.stop)
	<-w.done
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.max
}

// vmRSS returns a process's resident set in KiB.
func vmRSS(t *testing.T, pid int) int64 {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			n, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return n
		}
	}
	return 0
}

// TestFilesLargeStream streams 1 GiB into a sandbox and back out through
// the API; the daemon's memory stays bounded.
func TestFilesLargeStream(t *testing.T) {
	needs(t)
	const size = 1 << 30
	d := startDaemon(t, torporBin(t), t.TempDir())
	cl := d.client(t)
	ctx := context.Background()
	id := strings.TrimSpace(d.ok("create"))
	pid := d.cmd.Process.Pid
	base := vmRSS(t, pid)
	w := watchRSS(t, pid)

	start := time.Now()
	info, err := cl.WriteFile(ctx, id, "/root/big", io.LimitReader(zeroReader{}, size), nil)
	if err != nil || info.Size != size {
		t.Fatalf("write: %+v %v", info, err)
	}
	wrote := time.Since(start)
	if out := d.ok("exec", id, "--", "stat", "-c", "%s", "/root/big"); strings.TrimSpace(out) != strconv.Itoa(size) {
		t.Fatalf("the sandbox sees %q bytes", out)
	}
	start = time.Now()
	rc, err := cl.ReadFile(ctx, id, "/root/big")
	if err != nil {
		t.Fatal(err)
	}
	n, nonzero := countZeros(t, rc)
	rc.Close()
	read := time.Since(start)
	peak := w.peak()
	if n != size || nonzero != 0 {
		t.Fatalf("read back %d bytes, %d of them not zero", n, nonzero)
	}
	growth := (peak - base) >> 10
	t.Logf("1 GiB in %v (%.0f MB/s), out in %v (%.0f MB/s); daemon RSS %d MiB -> peak %d MiB (+%d MiB)",
		wrote.Round(time.Millisecond), size/1e6/wrote.Seconds(), read.Round(time.Millisecond), size/1e6/read.Seconds(),
		base>>10, peak>>10, growth)
	if growth > 100 {
		t.Fatalf("the daemon grew by %d MiB streaming 1 GiB", growth)
	}
	d.ok("files", "rm", id, "/root/big")
}

func countZeros(t *testing.T, r io.Reader) (n, nonzero int64) {
	buf := make([]byte, 1<<20)
	zero := make([]byte, 1<<20)
	for {
		k, err := r.Read(buf)
		if k > 0 {
			n += int64(k)
			if !bytes.Equal(buf[:k], zero[:k]) {
				nonzero++
			}
		}
		if err == io.EOF {
			return n, nonzero
		}
		if err != nil {
			t.Fatal(fmt.Errorf("reading after %d bytes: %w", n, err))
		}
	}
}
