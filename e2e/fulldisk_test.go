package e2e

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/wire"
	"github.com/torpor-dev/torpor/client"
)

// dataDiskMiB is the size of the file system the full-disk test gives the
// daemon as its data dir.
const dataDiskMiB = 300

// smallDataDisk makes an ext4 file system of dataDiskMiB in a sparse file,
// loop-mounts it and returns the mount point. It is unmounted (and its
// loop device goes with it) when the test ends, after the daemons it holds
// stop: register it before starting one.
func smallDataDisk(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	image, mnt := filepath.Join(dir, "data.img"), filepath.Join(dir, "data")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(image)
	if err != nil {
		t.Fatal(err)
	}
	err = f.Truncate(dataDiskMiB << 20)
	f.Close()
	if err != nil {
		t.Fatal(err)
	}
	// No blocks reserved for root: the daemon runs as root and would
	// write into them.
	if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-m", "0", image).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.ext4: %v: %s", err, out)
	}
	if out, err := exec.Command("mount", "-o", "loop", image, mnt).CombinedOutput(); err != nil {
		t.Skipf("cannot loop-mount a file system: %v: %s", err, out)
	}
	t.Cleanup(func() {
		var err error
		for i := 0; i < 50; i++ {
			if err = unix.Unmount(mnt, 0); err == nil || errors.Is(err, unix.EINVAL) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		if err != nil && !errors.Is(err, unix.EINVAL) {
			// Sandboxes of the daemon are left on it: detaching it would
			// leave them running out of reach.
			t.Errorf("unmounting the data disk %s: %v", mnt, err)
			return
		}
		// mount -o loop sets autoclear: the kernel lets go of the device
		// soon after the unmount. One still bound then is detached.
		for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			out, _ := exec.Command("losetup", "-j", image).Output()
			if len(out) == 0 {
				break
			}
			if time.Now().After(deadline) {
				dev, _, _ := strings.Cut(string(out), ":")
				_ = exec.Command("losetup", "-d", dev).Run()
				t.Errorf("the data disk's loop device %s was left", dev)
				break
			}
		}
	})
	return mnt
}

// fillDisk writes a file at path until the file system has no space left,
// then frees leave bytes of it, and returns its size.
func fillDisk(t *testing.T, path string, leave int64) int64 {
	t.Helper()
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var st unix.Statfs_t
	if err := unix.Statfs(path, &st); err != nil {
		t.Fatal(err)
	}
	if n := int64(st.Bavail) * st.Bsize; n > 0 {
		if err := unix.Fallocate(int(f.Fd()), 0, 0, n); err != nil && !errors.Is(err, unix.ENOSPC) {
			t.Fatal(err)
		}
	}
	buf := make([]byte, 4096)
	off, _ := f.Seek(0, io.SeekEnd)
	for {
		if _, err := f.WriteAt(buf, off); err != nil {
			if !errors.Is(err, syscall.ENOSPC) {
				t.Fatal(err)
			}
			break
		}
		off += int64(len(buf))
	}
	if err := f.Sync(); err != nil && !errors.Is(err, syscall.ENOSPC) {
		t.Fatal(err)
	}
	if leave > 0 {
		if err := f.Truncate(off - leave); err != nil {
			t.Fatal(err)
		}
	}
	fi, _ := f.Stat()
	return fi.Size()
}

// rawCall sends one API request and returns the status, the Retry-After
// header and the body.
func rawCall(t *testing.T, d *daemon, method, path, body string) (int, string, string) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, "http://"+d.addr+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+d.key)
	if strings.HasPrefix(body, "{") {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Retry-After"), strings.TrimSpace(string(b))
}

// TestFullDataDisk: the file system of the daemon's data dir (database,
// sandboxes' disk images, templates, runc's state) fills up, first from
// outside, then by a running sandbox whose sparse disk image grows on it.
// The sandbox's writes get ENOSPC and it keeps running; while the disk is
// full every call that would store something is refused with 503 and the
// reason disk_full, reads work, and nothing changes state. Once space is
// freed everything works again with no restart, and after a restart every
// sandbox, its files and its ledger (no gap) are there.
func TestFullDataDisk(t *testing.T) {
	needs(t)
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skip("needs loop devices (modprobe loop)")
	}
	if _, err := exec.LookPath("mkfs.ext4"); err != nil {
		t.Skip("needs mkfs.ext4 (apt-get install e2fsprogs)")
	}
	mnt := smallDataDisk(t)
	// No sandbox network: the test needs none, and shares no bridge.
	if err := os.WriteFile(filepath.Join(mnt, "torpor.toml"), []byte("network_bridge = \"\"\ndefault_disk_mib = 1024\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	bin := torporBin(t)
	d := startDaemon(t, bin, mnt)
	cl := d.client(t)
	ctx := context.Background()
	create := func() string { return strings.TrimSpace(d.ok("create", "--template", "base")) }

	run := create()
	read := counter(t, d, run)
	before, pid := read()
	// On the host's disk before it fills: a page the sandbox's file system
	// writes back to its image while the host is full is lost.
	d.ok("exec", run, "--", "sh", "-c", "echo before > /before && sync")
	paused := create()
	d.ok("pause", paused)
	asleep := create()
	d.ok("hibernate", asleep)
	hib := create()
	states := map[string]torpor.State{run: torpor.StateRunning, paused: torpor.StatePaused, asleep: torpor.StateHibernated, hib: torpor.StateRunning}
	sameStates := func(when string) {
		t.Helper()
		for id, want := range states {
			if got := d.get(id).State; got != want {
				t.Errorf("%s: %s is %s, want %s", when, id, got, want)
			}
		}
	}

	// Outside, a file takes all but 32 MiB; the running sandbox writes
	// 64 MiB, which its image cannot take from the host.
	filler, topOff := filepath.Join(mnt, "filler"), filepath.Join(mnt, "filler2")
	// Before the daemon's shutdown, which deletes its sandboxes: a test
	// that fails while the disk is full leaves none.
	t.Cleanup(func() { os.Remove(filler); os.Remove(topOff) })
	fillDisk(t, filler, 32<<20)
	res, err := cl.Exec(ctx, run, client.ExecRequest{Cmd: []string{"dd", "if=/dev/zero", "of=/big", "bs=1M", "count=64", "conv=fsync"}})
	if err != nil || res.ExitCode == 0 || !strings.Contains(res.Stderr, "No space left on device") {
		t.Fatalf("dd of 64 MiB with 32 free on the host: %+v %v", res, err)
	}
	// Whatever the failed writeback left, the disk is full now.
	fillDisk(t, topOff, 0)
	full := time.Now()
	var st unix.Statfs_t
	if err := unix.Statfs(mnt, &st); err != nil || st.Bavail != 0 {
		t.Fatalf("the data disk has %d blocks free (%v)", st.Bavail, err)
	}
	t.Logf("the data disk is full; the sandbox's dd: exit %d, %q", res.ExitCode, strings.TrimSpace(res.Stderr))

	// Reads work.
	for _, path := range []string{"/v1/sandboxes/" + run, "/v1/sandboxes", "/v1/sandboxes/" + hib + "/events", "/v1/events", "/v1/usage", "/v1/templates"} {
		if code, _, body := rawCall(t, d, "GET", path, ""); code != http.StatusOK {
			t.Errorf("GET %s with the data disk full: %d %s", path, code, body)
		}
	}
	// Every change is refused, saying why, and changes nothing.
	for _, c := range []struct{ method, path, body string }{
		{"POST", "/v1/sandboxes", `{"template":"base"}`},
		{"POST", "/v1/sandboxes/" + run + "/exec", `{"cmd":["true"]}`},
		{"PUT", "/v1/sandboxes/" + run + "/files?path=/f", "hello"},
		{"POST", "/v1/sandboxes/" + run + "/pause", ""},
		{"POST", "/v1/sandboxes/" + run + "/touch", ""},
		{"POST", "/v1/sandboxes/" + paused + "/start", ""},
		{"POST", "/v1/sandboxes/" + asleep + "/start", ""},
		{"POST", "/v1/sandboxes/" + hib + "/hibernate", ""},
		{"DELETE", "/v1/sandboxes/" + paused, ""},
	} {
		code, retry, body := rawCall(t, d, c.method, c.path, c.body)
		var eb wire.ErrorBody
		_ = json.Unmarshal([]byte(body), &eb)
		if code != http.StatusServiceUnavailable || eb.Error.Code != torpor.EUnavailable || eb.Error.Reason != torpor.ReasonDiskFull ||
			!strings.Contains(eb.Error.Message, "data disk is full") || retry == "" {
			t.Errorf("%s %s with the data disk full: %d (Retry-After %q) %s; want 503 disk_full", c.method, c.path, code, retry, body)
		} else if c.method == "POST" && c.path == "/v1/sandboxes" {
			t.Logf("%s %s with the data disk full: %d (Retry-After %s) %s", c.method, c.path, code, retry, body)
		}
	}
	if _, errs, code := d.cli("pause", run); code == 0 || !strings.Contains(errs, "data disk is full") {
		t.Errorf("torpor pause with the data disk full: exit %d, %q", code, errs)
	}
	sameStates("with the data disk full")
	if sbs, err := cl.List(ctx, client.ListOptions{All: true}); err != nil || len(sbs) != len(states) {
		t.Errorf("list with the data disk full: %d sandboxes, %v; want %d", len(sbs), err, len(states))
	}

	// Space comes back: everything works again, without a restart.
	for _, f := range []string{topOff, filler} {
		if err := os.Remove(f); err != nil {
			t.Fatal(err)
		}
	}
	sameStates("once space was freed")
	after, pid2 := read()
	if pid2 != pid || float64(after-before) < time.Since(full).Seconds()*5 {
		t.Errorf("the running sandbox's counter went from %d to %d (pid %s -> %s) across the full disk", before, after, pid, pid2)
	}
	d.ok("exec", run, "--", "rm", "/big")
	if _, err := cl.WriteFile(ctx, run, "/after", strings.NewReader("after\n"), nil); err != nil {
		t.Fatal(err)
	}
	fresh := create()
	d.ok("pause", run)
	d.ok("resume", run)
	d.ok("start", paused)
	d.ok("start", asleep)
	d.ok("hibernate", hib)
	d.ok("rm", paused)
	d.ok("pause", fresh)
	states = map[string]torpor.State{run: torpor.StateRunning, paused: torpor.StateTerminated, asleep: torpor.StateRunning,
		hib: torpor.StateHibernated, fresh: torpor.StatePaused}
	sameStates("after the verbs")
	if out := d.ok("exec", run, "--", "cat", "/before", "/after"); out != "before\nafter\n" {
		t.Errorf("files of the running sandbox: %q", out)
	}

	// Nearly full: room for a few writes of the database, not for a new
	// disk image. A create and a hibernation that the disk cuts short
	// between their writes end as if it had not: the create's sandbox
	// failed (201) or deleted (503), never running, and the hibernation
	// done (or never begun), once space is back.
	fillDisk(t, filler, 256<<10)
	code, _, body := rawCall(t, d, "POST", "/v1/sandboxes", `{"template":"base","resources":{"disk_mib":512}}`)
	t.Logf("create with 256 KiB free: %d %.300s", code, body)
	if code != http.StatusCreated && code != http.StatusServiceUnavailable {
		t.Errorf("create with 256 KiB free: %d %s", code, body)
	}
	code, _, body = rawCall(t, d, "POST", "/v1/sandboxes/"+fresh+"/hibernate", "")
	t.Logf("hibernate with the disk nearly full: %d %.300s", code, body)
	if code != http.StatusOK && code != http.StatusServiceUnavailable {
		t.Errorf("hibernate with the disk nearly full: %d %s", code, body)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	var sbs []*torpor.Sandbox
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if sbs, err = cl.List(ctx, client.ListOptions{All: true}); err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(sbs, func(sb *torpor.Sandbox) bool { return sb.State.Transitional() }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("sandboxes left in between once space came back: %v", stateList(sbs))
		}
	}
	for _, sb := range sbs {
		if _, known := states[sb.ID]; known || sb.ID == fresh {
			continue
		}
		if sb.State != torpor.StateFailed && sb.State != torpor.StateTerminated {
			t.Errorf("the create the disk cut short: %s, want failed or terminated", sb.State)
		}
		if sb.State == torpor.StateFailed && (sb.Failure == nil || !strings.Contains(sb.Failure.Message, "data disk is full") || strings.Contains(sb.Failure.Message, mnt)) {
			t.Errorf("the create the disk cut short failed with %+v, want the full data disk and no host path", sb.Failure)
		}
		states[sb.ID] = sb.State
	}
	states[fresh] = d.get(fresh).State
	if states[fresh] != torpor.StateHibernated && states[fresh] != torpor.StatePaused {
		t.Errorf("the hibernation the disk cut short: %s", states[fresh])
	}

	// After a restart everything is there, the ledger without a gap.
	noInternalErrors(t, d)
	d.stop()
	d = startDaemon(t, bin, mnt)
	cl = d.client(t)
	sameStates("after a restart")
	if _, pid3 := read2(t, d, run); pid3 != pid {
		t.Errorf("the running sandbox's process changed across the restart: %s -> %s", pid, pid3)
	}
	// From its disk, not the page cache: booted again on it.
	d.ok("hibernate", run)
	d.ok("start", run)
	if out := d.ok("exec", run, "--", "cat", "/before", "/after"); out != "before\nafter\n" {
		t.Errorf("files of the sandbox after a restart and a hibernation: %q", out)
	}
	ledger := &crashRig{tally: map[string]int{}}
	for id := range states {
		ledger.checkLedger(t, d, id)
	}
	noInternalErrors(t, d)
}

// stateList says which sandbox is in which state.
func stateList(sbs []*torpor.Sandbox) []string {
	var out []string
	for _, sb := range sbs {
		out = append(out, sb.ID+" "+string(sb.State))
	}
	return out
}

// noInternalErrors fails the test for every internal error the daemon
// logged: a full disk is none.
func noInternalErrors(t *testing.T, d *daemon) {
	t.Helper()
	for _, l := range strings.Split(d.logs.String(), "\n") {
		if strings.Contains(l, "internal error") {
			t.Errorf("the daemon logged an internal error: %s", l)
		}
	}
}
