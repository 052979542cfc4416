package e2e

import (
	"context"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/torpor-dev/torpor"
	tt "github.com/torpor-dev/torpor/template/templatetest"
)

// overlayLower returns the lowerdir option of the overlay mounted as a
// sandbox's root, from this process's mount table.
func overlayLower(t *testing.T, dataDir, id string) string {
	t.Helper()
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	target := filepath.Join(dataDir, "runc", "sandboxes", id, "rootfs")
	re := regexp.MustCompile(`lowerdir=([^,]+)`)
	for _, line := range strings.Split(string(data), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && f[4] == target {
			if m := re.FindStringSubmatch(line); m != nil {
				return m[1]
			}
		}
	}
	t.Fatalf("no overlay mounted at %s", target)
	return ""
}

// An image pulled from a registry becomes a template whose layers (with a
// whiteout and an opaque directory) every sandbox of it shares; removing
// it is refused while sandboxes use it.
func TestImportedImageTemplate(t *testing.T) {
	needs(t)
	host := tt.Registry(t)
	base := tt.Layer(t, tt.BusyboxLayer(t))
	files := tt.Layer(t, tt.Tar(t, tt.Dir("etc/"), tt.File("etc/secret", "s3cret\n"), tt.File("etc/keep", "kept\n"),
		tt.Dir("data/"), tt.File("data/old", "o\n")))
	top := tt.Layer(t, tt.Tar(t, tt.Whiteout("etc/secret"), tt.Dir("data/"), tt.Opaque("data"), tt.File("data/new", "n\n")))
	tt.Push(t, host+"/team/bb:1", tt.Image(t, v1.Config{Env: []string{"FOO=from-image", "PATH=/bin"}, Cmd: []string{"sh"}, WorkingDir: "/data"}, base, files, top))

	dataDir := t.TempDir()
	d := startDaemon(t, torporBin(t), dataDir)
	out, errs, code := d.cli("template", "import", "bb", "--image", host+"/team/bb:1", "--insecure")
	if code != 0 || strings.TrimSpace(out) != "bb" || !strings.Contains(errs, "layer 3/3") {
		t.Fatalf("template import: exit %d\n%s%s\n%s", code, out, errs, d.logs.String())
	}
	if ls := d.ok("template", "ls"); !strings.Contains(ls, "bb") || !strings.Contains(ls, "registry") {
		t.Fatalf("template ls:\n%s", ls)
	}

	ids := []string{
		strings.TrimSpace(d.ok("create", "--template", "bb", "-e", "BAR=from-request")),
		strings.TrimSpace(d.ok("create", "--template", "bb")),
	}
	id := ids[0]
	check := func(script, want string) {
		t.Helper()
		if got := d.ok("exec", id, "--", "sh", "-c", script); got != want {
			t.Errorf("%s: %q, want %q", script, got, want)
		}
	}
	check("cat /etc/keep", "kept\n")
	check("test -e /etc/secret && echo present || echo absent", "absent\n")
	check("ls /data", "new\n")
	check("echo $FOO $BAR", "from-image from-request\n")
	check("pwd", "/data\n")
	check("test -d /tmp && test -d /proc/1 && test -x /.torpor/torpor && echo mounts", "mounts\n")
	check("echo changed > /etc/keep; cat /etc/keep", "changed\n")
	if got := d.ok("exec", ids[1], "--", "cat", "/etc/keep"); got != "kept\n" {
		t.Errorf("a write in one sandbox reached another: %q", got)
	}

	// Both sandboxes stack the same layer directories.
	l0, l1 := overlayLower(t, dataDir, ids[0]), overlayLower(t, dataDir, ids[1])
	if l0 != l1 || strings.Count(l0, filepath.Join(dataDir, "layers", "sha256-")) != 4 {
		t.Errorf("lowerdirs differ or are not the shared layers:\n%s\n%s", l0, l1)
	}

	cl := d.client(t)
	if tpl, err := cl.Template(context.Background(), "bb"); err != nil || tpl.InUse != 2 {
		t.Errorf("template in use %+v %v", tpl, err)
	}
	_, errs, code = d.cli("template", "rm", "bb")
	if code == 0 || !strings.Contains(errs, "in use") || !strings.Contains(errs, "conflict") {
		t.Errorf("template rm in use: exit %d %s", code, errs)
	}
	for _, id := range ids {
		d.ok("rm", id)
	}
	d.ok("template", "rm", "bb")
	if ls := d.ok("template", "ls"); strings.Contains(ls, "bb") {
		t.Errorf("template ls after rm:\n%s", ls)
	}
	if entries, _ := os.ReadDir(filepath.Join(dataDir, "layers")); len(entries) != 0 {
		t.Errorf("layers left after the template went: %v", entries)
	}
	if _, _, code := d.cli("create", "--template", "bb"); code == 0 {
		t.Error("create from a removed template worked")
	}
}

// needsDebootstrap skips unless debootstrap is there (installing it when
// it can) and Debian's mirror answers.
func needsDebootstrap(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("builds a Debian root filesystem (minutes): not in -short mode")
	}
	if _, err := exec.LookPath("debootstrap"); err != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		defer cancel()
		if out, err := exec.CommandContext(ctx, "apt-get", "install", "-y", "-qq", "debootstrap").CombinedOutput(); err != nil {
			t.Skipf("needs debootstrap (apt-get install debootstrap), which could not be installed: %v\n%s", err, out)
		}
	}
	mirror := "http://deb.debian.org/debian"
	c := &http.Client{Timeout: 15 * time.Second}
	resp, err := c.Get(mirror + "/dists/bookworm/Release")
	if err != nil {
		t.Skipf("needs Debian's mirror (%s) for debootstrap: %v", mirror, err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Skipf("needs Debian's mirror (%s) for debootstrap: %s", mirror, resp.Status)
	}
}

// The python template is one command; a sandbox of it runs python3.
func TestBuildPythonTemplate(t *testing.T) {
	needs(t)
	needsDebootstrap(t)
	d := startDaemon(t, torporBin(t), t.TempDir())
	start := time.Now()
	out, errs, code := d.cli("template", "build", "python", "--debian", "bookworm", "--packages", "python3")
	took := time.Since(start)
	if code != 0 || strings.TrimSpace(out) != "python" {
		t.Fatalf("template build: exit %d\n%s\n%s", code, out, errs)
	}
	t.Logf("built the python template in %s", took.Round(time.Second))
	if !strings.Contains(errs, "I: Retrieving") || !strings.Contains(errs, "python3") {
		t.Errorf("no download progress shown:\n%s", errs)
	}
	id := strings.TrimSpace(d.ok("create", "--template", "python"))
	if sb := d.get(id); sb.State != torpor.StateRunning {
		t.Fatalf("sandbox %s is %s", id, sb.State)
	}
	if got := d.ok("exec", id, "--", "python3", "-c", "print(1+1)"); got != "2\n" {
		t.Errorf("python3: %q", got)
	}
	t.Run("RunCodePython", func(t *testing.T) { checkRunCodePython(t, d) })
}
