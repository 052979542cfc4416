package e2e

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/client"
)

// TestEscapes drives a real sandbox's tar import and export, its files
// API and exec's user selection with the tricks its owner, or a process
// inside, can play on them: climbing "..", absolute and relative
// symlinks to host paths, hard links to host files, device nodes, fifos,
// symlinks planted where the daemon will write, and a tree swapped with
// symlinks to the host while the daemon walks it. No host file is read or
// written: a canary directory on the host keeps its one secret, the host's
// account files keep their contents, and no file of the traps appears on
// the host. (TestFiles covers reads through planted and swapped symlinks;
// package files covers each case against a plain directory.)
func TestEscapes(t *testing.T) {
	needs(t)
	d := startDaemon(t, torporBin(t), t.TempDir())
	cl := d.client(t)
	id := strings.TrimSpace(d.ok("create"))
	host := newHostWatch(t, d.dataDir)

	t.Run("tar import", func(t *testing.T) { escapeTarImport(t, d.in(t), cl, id, host) })
	t.Run("tar export", func(t *testing.T) { escapeTarExport(t, d.in(t), cl, id, host) })
	t.Run("swapped during calls", func(t *testing.T) { escapeSwaps(t, d.in(t), cl, id, host) })
	t.Run("device nodes", func(t *testing.T) { escapeDevices(t, d.in(t), cl, id) })
	t.Run("exec user", func(t *testing.T) { escapeExecUser(t, d.in(t), cl, id, host) })
	host.check(t)
}

// hostWatch is what must not change on the host: a canary directory with
// a secret, the account files, and the places a trap would write to.
type hostWatch struct {
	canary, secret string
	sums           map[string]string
	traps          []string // globs where a trap's file would land
}

func newHostWatch(t *testing.T, dataDir string) *hostWatch {
	var b [12]byte
	rand.Read(b[:])
	h := &hostWatch{canary: t.TempDir(), secret: "host secret " + hex.EncodeToString(b[:])}
	if err := os.WriteFile(filepath.Join(h.canary, "secret"), []byte(h.secret), 0o600); err != nil {
		t.Fatal(err)
	}
	h.sums = h.sum()
	for _, dir := range []string{"/", "/tmp", "/etc", "/root", h.canary, dataDir, filepath.Join(dataDir, "runc", "sandboxes"),
		filepath.Join(dataDir, "runc", "sandboxes", "*")} {
		h.traps = append(h.traps, filepath.Join(dir, "pwned*"))
	}
	return h
}

// sum hashes the watched files and lists the canary directory.
func (h *hostWatch) sum() map[string]string {
	out := map[string]string{}
	for _, p := range []string{"/etc/passwd", "/etc/shadow", "/etc/group", "/etc/hostname", filepath.Join(h.canary, "secret")} {
		b, err := os.ReadFile(p)
		s := sha256.Sum256(b)
		out[p] = fmt.Sprintf("%x %v", s[:8], err)
	}
	entries, _ := os.ReadDir(h.canary)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	out[h.canary+"/"] = strings.Join(names, " ")
	return out
}

// check fails the test if a watched file changed or a trap's file landed.
func (h *hostWatch) check(t *testing.T) {
	t.Helper()
	for p, was := range h.sums {
		if now := h.sum()[p]; now != was {
			t.Errorf("the host's %s changed: %s, was %s", p, now, was)
		}
	}
	for _, g := range h.traps {
		if m, _ := filepath.Glob(g); len(m) > 0 {
			t.Errorf("a trap wrote to the host: %v", m)
		}
	}
}

// climb is a path that leaves the sandbox's root and any directory of the
// daemon's above it, were ".." not confined.
var climb = strings.Repeat("../", 16)

// tarEntry is one entry of an archive a test builds: its header, and a
// regular file's body.
type tarEntry struct {
	tar.Header
	body string
}

func reg(name, body string) tarEntry {
	return tarEntry{tar.Header{Name: name, Typeflag: tar.TypeReg}, body}
}

func link(name string, flag byte, target string) tarEntry {
	return tarEntry{Header: tar.Header{Name: name, Typeflag: flag, Linkname: target}}
}

// tarOf builds an archive of entries in order.
func tarOf(t *testing.T, entries ...tarEntry) *bytes.Buffer {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.Header
		h.Size = int64(len(e.body))
		if h.Mode == 0 {
			h.Mode = 0o644
		}
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		io.WriteString(tw, e.body)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return &buf
}

// escapeTarImport: archives whose entries climb out, write through
// symlinks (their own, or planted by the sandbox), hard-link host files or
// make devices are extracted without any of those, and the rest lands
// where it belongs, inside the sandbox.
func escapeTarImport(t *testing.T, d *daemon, cl *client.Client, id string, host *hostWatch) {
	ctx := context.Background()
	canary := host.canary
	d.ok("exec", id, "--", "sh", "-c", fmt.Sprintf(`mkdir -p /root/imp && cd /root/imp && ln -s %s planted && ln -s / slash &&
		ln -s %s%s climbing && cp /etc/passwd /root/passwd.before`, canary, climb, canary[1:]))
	pwned := func(name string) tarEntry { return reg(name, "pwned by "+name) }
	evil := []tarEntry{
		pwned(climb + canary[1:] + "/pwned1"),
		pwned("a/" + climb + canary[1:] + "/pwned2"),
		link("ln", tar.TypeSymlink, canary),
		pwned("ln/pwned3"),
		link("up", tar.TypeSymlink, climb),
		pwned("up/" + canary[1:] + "/pwned4"),
		pwned("planted/pwned5"),
		pwned("climbing/pwned6"),
		pwned("slash/etc/passwd"),
		pwned("slash/root/pwned7"),
		link("hl1", tar.TypeLink, canary+"/secret"),
		link("hl2", tar.TypeLink, climb+canary[1:]+"/secret"),
		link("hl3", tar.TypeLink, "ln/secret"),
		link("hl4", tar.TypeLink, "/etc/shadow"),
		link("hl5", tar.TypeLink, "planted/secret"),
		{Header: tar.Header{Name: "null", Typeflag: tar.TypeChar, Devmajor: 1, Devminor: 3}},
		{Header: tar.Header{Name: "disk", Typeflag: tar.TypeBlock, Devmajor: 8, Devminor: 0}},
		{Header: tar.Header{Name: "fifo", Typeflag: tar.TypeFifo}},
		link("shadow", tar.TypeSymlink, "/etc/shadow"),
	}
	fine := []tarEntry{
		reg(canary+"/pwned8", "absolute, kept inside"), // an absolute name lands under the target
		reg("shadow", "replaced the symlink"),
		reg("ok/file", "fine"),
		link("ok/hard", tar.TypeLink, "ok/file"),
		link("ok/outside", tar.TypeSymlink, canary+"/secret"),
	}
	res, err := cl.UploadTar(ctx, id, "/root/imp", tarOf(t, append(evil, fine...)...))
	if err != nil {
		t.Fatal(err)
	}
	var skipped []string
	for _, s := range res.Skipped {
		skipped = append(skipped, s.Name)
	}
	for _, e := range evil {
		if e.Typeflag != tar.TypeSymlink && !slices.Contains(skipped, e.Name) {
			t.Errorf("%s was not skipped: %+v", e.Name, res)
		}
	}
	t.Logf("tar import: %d entries extracted, %d skipped", res.Entries, res.SkippedCount)
	check := `cd /root/imp && cat ok/file ok/hard shadow .` + canary + `/pwned8 && echo && for l in planted climbing slash ok/outside; do readlink $l; done &&
		test ! -e /root/pwned7 && test ! -L shadow && cmp /etc/passwd /root/passwd.before && find / -xdev -name 'pwned[0-7]' | wc -l`
	want := "finefinereplaced the symlinkabsolute, kept inside\n" + canary + "\n" + climb + canary[1:] + "\n/\n" + canary + "/secret\n0\n"
	if out := d.ok("exec", id, "--", "sh", "-c", check); out != want {
		t.Errorf("inside the sandbox after the import:\n%s\nwant\n%s", out, want)
	}
	// The target directory itself planted as a symlink to the host, or
	// named through "..": resolved inside the sandbox, as the sandbox
	// would (an import that is refused is fine too).
	d.ok("exec", id, "--", "sh", "-c", "ln -s "+canary+" /root/tgt")
	for dir, inside := range map[string]string{"/root/tgt": canary, "/root/tgt/sub": canary + "/sub",
		"/../../../root/up2": "/root/up2", "/root/imp/planted/x": canary + "/x"} {
		_, err := cl.UploadTar(ctx, id, dir, tarOf(t, reg("pwned9", "in "+dir)))
		if err != nil {
			t.Logf("import into %s: %v", dir, err)
			if torpor.ErrorCodeOf(err) == torpor.EInternal {
				t.Errorf("import into %s: %v", dir, err)
			}
			continue
		}
		if out, _, _ := d.cli("exec", id, "--", "cat", inside+"/pwned9"); out != "in "+dir {
			t.Errorf("the import into %s is not at %s inside the sandbox: %q", dir, inside, out)
		}
		t.Logf("import into %s: at %s inside the sandbox", dir, inside)
	}
	host.check(t)
}

// escapeTarExport: an archive of a tree full of links out, fifos and
// links to directories carries the links as links, leaves out what is not
// a file or directory, never descends a link, and holds nothing of the
// host.
func escapeTarExport(t *testing.T, d *daemon, cl *client.Client, id string, host *hostWatch) {
	canary := host.canary
	d.ok("exec", id, "--", "sh", "-c", fmt.Sprintf(`mkdir -p /root/exp/sub && cd /root/exp && echo inside > sub/plain &&
		ln -s %[1]s/secret abs && ln -s %[2]s%[3]s/secret rel && ln -s %[1]s dirlink && ln -s / rootlink &&
		ln -s /proc/1/root%[1]s/secret magic && ln sub/plain hard && mkfifo fifo && ln -s fifo fifolink`, canary, climb, canary[1:]))
	entries := downloadTar(t, cl, id, "/root/exp", host)
	want := map[string]string{
		"sub/": "dir", "sub/plain": "inside\n", "hard": "inside\n",
		"abs": "-> " + canary + "/secret", "rel": "-> " + climb + canary[1:] + "/secret", "dirlink": "-> " + canary,
		"rootlink": "-> /", "magic": "-> /proc/1/root" + canary + "/secret", "fifolink": "-> fifo",
	}
	for name, got := range entries {
		if want[name] != got {
			t.Errorf("the archive of /root/exp has %s: %q, want %q", name, got, want[name])
		}
	}
	if len(entries) != len(want) {
		t.Errorf("the archive of /root/exp: %v, want %v", entries, want)
	}
	// A link named as the path to archive is followed inside the sandbox,
	// where the host's paths are the sandbox's own (or do not exist).
	for _, p := range []string{"/root/exp/abs", "/root/exp/rel", "/root/exp/dirlink", "/root/exp/magic", "/root/exp/fifo", "/root/exp/rootlink/etc"} {
		rc, err := cl.DownloadTar(context.Background(), id, p)
		if err != nil {
			if torpor.ErrorCodeOf(err) == torpor.EInternal {
				t.Errorf("the archive of %s: %v", p, err)
			}
			continue
		}
		b, _ := io.ReadAll(rc)
		rc.Close()
		if bytes.Contains(b, []byte(host.secret)) {
			t.Fatalf("the archive of %s holds the host's secret", p)
		}
	}
	// The whole root: the sandbox's own mounts (/proc, /sys, /dev) are
	// not in it, and nothing of the host is.
	entries = downloadTar(t, cl, id, "/", host)
	for name := range entries {
		if top, _, _ := strings.Cut(name, "/"); top == "proc" || top == "sys" || top == "dev" || top == ".torpor" {
			if entries[name] != "dir" {
				t.Errorf("the archive of / has %s", name)
			}
		}
	}
	t.Logf("the archive of / has %d entries", len(entries))
}

// downloadTar reads the archive of p: each entry's body (a directory's is
// "dir", a link's "-> target"). An archive that holds the host's secret
// fails the test at once.
func downloadTar(t *testing.T, cl *client.Client, id, p string, host *hostWatch) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rc, err := cl.DownloadTar(ctx, id, p)
	if err != nil {
		t.Fatalf("the archive of %s: %v", p, err)
	}
	defer rc.Close()
	out := map[string]string{}
	tr := tar.NewReader(rc)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return out
		}
		if err != nil {
			t.Fatalf("the archive of %s: %v", p, err)
		}
		b, err := io.ReadAll(tr)
		if err != nil {
			t.Fatalf("the archive of %s, %s: %v", p, h.Name, err)
		}
		if bytes.Contains(b, []byte(host.secret)) || strings.Contains(h.Linkname, host.secret) {
			t.Fatalf("the archive of %s holds the host's secret in %s", p, h.Name)
		}
		switch h.Typeflag {
		case tar.TypeDir:
			out[h.Name] = "dir"
		case tar.TypeSymlink:
			out[h.Name] = "-> " + h.Linkname
		case tar.TypeReg:
			out[h.Name] = string(b)
		default:
			out[h.Name] = fmt.Sprintf("type %c", h.Typeflag)
		}
	}
}

// escapeSwaps: a process inside swaps a directory with symlinks to the
// host's canary and to / as fast as it can, while the daemon reads,
// writes and archives through it. Each call either works inside the
// sandbox or fails cleanly; none reaches the host.
func escapeSwaps(t *testing.T, d *daemon, cl *client.Client, id string, host *hostWatch) {
	ctx := context.Background()
	canary := host.canary
	d.ok("exec", id, "--", "sh", "-c", fmt.Sprintf(`mkdir -p /root/swp/real && echo inside > /root/swp/real/secret && cd /root/swp &&
		nohup sh -c 'while :; do ln -s %[1]s t1; rm -rf d; mv -f t1 d; rm -f d; cp -r real t2; mv -f t2 d;
			ln -s / t3; rm -rf d; mv -f t3 d; rm -f d; cp -r real t4; mv -f t4 d; done' >/dev/null 2>&1 &
		echo $! > /tmp/swp.pid`, canary))
	defer d.ok("exec", id, "--", "sh", "-c", "kill $(cat /tmp/swp.pid)")
	const rounds = 150
	var (
		mu     sync.Mutex
		counts = map[string]int{}
	)
	note := func(what string, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err == nil {
			counts[what+" ok"]++
			return
		}
		counts[what+" "+string(torpor.ErrorCodeOf(err))]++
		if torpor.ErrorCodeOf(err) == torpor.EInternal {
			t.Errorf("%s: %v", what, err)
		}
	}
	var wg sync.WaitGroup
	wg.Add(3)
	go func() {
		defer wg.Done()
		for range rounds {
			rc, err := cl.ReadFile(ctx, id, "/root/swp/d/secret")
			if err == nil {
				b, _ := io.ReadAll(rc)
				rc.Close()
				if string(b) != "inside\n" {
					t.Errorf("a read through the swapped directory returned %q", b)
				}
			}
			note("read", err)
		}
	}()
	go func() {
		defer wg.Done()
		for i := range rounds {
			_, err := cl.WriteFile(ctx, id, fmt.Sprintf("/root/swp/d/pwned%d", i%8), strings.NewReader("written"), nil)
			note("write", err)
			_, err = cl.UploadTar(ctx, id, "/root/swp/d", tarOf(t, reg(fmt.Sprintf("pwned%d", i%8), "extracted")))
			note("tar import", err)
		}
	}()
	go func() {
		defer wg.Done()
		for range rounds {
			rc, err := cl.DownloadTar(ctx, id, "/root/swp")
			if err == nil {
				b, _ := io.ReadAll(rc)
				rc.Close()
				if bytes.Contains(b, []byte(host.secret)) {
					t.Errorf("an archive of the swapped tree holds the host's secret")
				}
			}
			note("tar export", err)
		}
	}()
	wg.Wait()
	t.Logf("calls during the swaps: %v", counts)
	if counts["read ok"] == 0 || counts["write ok"] == 0 {
		t.Errorf("no read or write succeeded: the swap was not exercised (%v)", counts)
	}
	host.check(t)
}

// escapeDevices: a sandbox cannot make device nodes (no CAP_MKNOD, and
// its disk is mounted nodev), so none is there for the daemon to open;
// /dev itself is refused by the files API.
func escapeDevices(t *testing.T, d *daemon, cl *client.Client, id string) {
	if out, _, code := d.cli("exec", id, "--", "sh", "-c", "mknod /root/null c 1 3 || mknod /root/disk b 8 0 || echo refused"); code != 0 || out != "refused\n" {
		t.Fatalf("mknod inside the sandbox: %q exit %d", out, code)
	}
	for _, p := range []string{"/dev/null", "/dev/zero", "/dev/../dev/null", "/root/../dev/zero"} {
		if _, err := cl.ReadFile(context.Background(), id, p); torpor.ErrorCodeOf(err) != torpor.EInvalid {
			t.Errorf("read of %s: %v, want invalid_argument", p, err)
		}
	}
}

// escapeExecUser: exec's user is looked up in the sandbox's own
// /etc/passwd (never the host's), malformed names and out-of-range ids
// are refused, an /etc/passwd that is a fifo or endless answers at once,
// and a uid that names no user runs as that uid and no more. Every exec
// already runs as root by default (the sandbox's root: the container's
// few capabilities), so no request can ask for more than that.
func escapeExecUser(t *testing.T, d *daemon, cl *client.Client, id string, host *hostWatch) {
	ctx := context.Background()
	canary := host.canary
	run := func(user string, cmd ...string) (*client.ExecResult, error) {
		cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		defer cancel()
		res, err := cl.Exec(cctx, id, client.ExecRequest{Cmd: cmd, User: user, TimeoutSeconds: 10})
		if cctx.Err() != nil {
			t.Fatalf("exec as %q did not answer", user)
		}
		return res, err
	}
	for _, user := range []string{"../etc/passwd", "root/../x", "/etc/shadow", "nobody:", "a b", "99999999999", "1:99999999999", "-1", "0x0"} {
		if _, err := run(user, "true"); torpor.ErrorCodeOf(err) != torpor.EInvalid {
			t.Errorf("exec as %q: %v, want invalid_argument", user, err)
		}
	}
	if _, err := run("4294967295", "true"); torpor.ErrorCodeOf(err) != torpor.EInvalid {
		t.Errorf("exec as uid 2^32-1: %v, want invalid_argument", err)
	}
	// A uid that names no user: that uid, and none of root's files.
	d.ok("exec", id, "--", "sh", "-c", "echo root only > /root/private && chmod 600 /root/private")
	if res, err := run("4242", "sh", "-c", "id -u; id -g; cat /root/private; touch /etc/pwned0"); err != nil ||
		res.Stdout != "4242\n4242\n" || !strings.Contains(res.Stderr, "Permission denied") || res.ExitCode == 0 {
		t.Errorf("exec as uid 4242: %+v %v", res, err)
	}
	// A user the host has and the sandbox does not.
	hostOnly := ""
	if b, err := os.ReadFile("/etc/passwd"); err == nil {
		inside := d.ok("exec", id, "--", "cut", "-d:", "-f1", "/etc/passwd")
		for _, line := range strings.Split(string(b), "\n") {
			if name, _, ok := strings.Cut(line, ":"); ok && name != "" && !slices.Contains(strings.Fields(inside), name) {
				hostOnly = name
				break
			}
		}
	}
	if hostOnly != "" {
		if _, err := run(hostOnly, "true"); torpor.ErrorCodeOf(err) != torpor.EInvalid {
			t.Errorf("exec as %q, a user of the host only: %v, want invalid_argument", hostOnly, err)
		}
	}
	// /etc/passwd made a link out, a fifo, an endless device, and a user
	// whose home climbs out.
	d.ok("exec", id, "--", "sh", "-c", "cp /etc/passwd /root/passwd.orig")
	for _, trick := range []string{
		"ln -s " + climb + "etc/passwd /etc/passwd",
		"ln -s /proc/1/root/" + climb + "etc/passwd /etc/passwd",
		"ln -s " + climb + canary[1:] + "/secret /etc/passwd",
		"mkfifo /etc/passwd",
		"ln -s /dev/zero /etc/passwd",
		"ln -s /dev/urandom /etc/passwd",
	} {
		d.ok("exec", id, "--", "sh", "-c", "rm -f /etc/passwd && "+trick)
		start := time.Now()
		if res, err := run("nobody", "id", "-u"); torpor.ErrorCodeOf(err) != torpor.EInvalid {
			t.Errorf("with %s, exec as nobody: %+v %v, want invalid_argument", trick, res, err)
		}
		if took := time.Since(start); took > 10*time.Second {
			t.Errorf("with %s, the exec took %s", trick, took)
		}
		if hostOnly != "" {
			if _, err := run(hostOnly, "true"); torpor.ErrorCodeOf(err) != torpor.EInvalid {
				t.Errorf("with %s, exec as %q: %v, want invalid_argument", trick, hostOnly, err)
			}
		}
	}
	d.ok("exec", id, "--", "sh", "-c", "rm -f /etc/passwd && cp /root/passwd.orig /etc/passwd && mkdir -p "+canary+" && "+
		"echo 'evil:x:4343:4343::/"+climb+canary[1:]+":/bin/sh' >> /etc/passwd")
	if res, err := run("evil", "sh", "-c", "cd && pwd; cat secret; id -u"); err != nil || !strings.Contains(res.Stderr, "secret") ||
		strings.Contains(res.Stdout, host.secret) || !strings.HasSuffix(res.Stdout, "4343\n") {
		t.Errorf("exec as a user whose home climbs out: %+v %v", res, err)
	}
	host.check(t)
}
