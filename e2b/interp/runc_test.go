package interp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	pngpkg "image/png"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/e2b/templates"
	"github.com/torpor-dev/torpor/lifecycle"
	"github.com/torpor-dev/torpor/runtime/runc"
	"github.com/torpor-dev/torpor/runtime/runtimetest"
	"github.com/torpor-dev/torpor/store/sqlite"
	"github.com/torpor-dev/torpor/template"
)

// host is the real engine of this test binary: runc, a SQLite store, and
// the E2B code-interpreter template built once with debootstrap.
var host struct {
	once    sync.Once
	skip    string
	err     error
	eng     *lifecycle.Engine
	dir     string
	closers []func()
}

func TestMain(m *testing.M) {
	code := m.Run()
	for i := len(host.closers) - 1; i >= 0; i-- {
		host.closers[i]()
	}
	if host.dir != "" {
		os.RemoveAll(host.dir)
	}
	os.Exit(code)
}

func hostSkip() string {
	switch {
	case testing.Short():
		return "builds a Debian template with debootstrap (minutes): not in -short mode"
	case os.Geteuid() != 0:
		return "needs root"
	}
	for _, bin := range []string{"runc", "debootstrap"} {
		if _, err := exec.LookPath(bin); err != nil {
			if _, err := os.Stat("/usr/sbin/" + bin); err != nil {
				return "needs " + bin + " (apt-get install " + bin + ")"
			}
		}
	}
	c := &http.Client{Timeout: 15 * time.Second}
	resp, err := c.Get("http://deb.debian.org/debian/dists/bookworm/Release")
	if err != nil {
		return fmt.Sprintf("needs Debian's mirror for debootstrap: %v", err)
	}
	resp.Body.Close()
	return ""
}

// realEngine returns the engine, building the template on first use.
func realEngine(t *testing.T) *lifecycle.Engine {
	t.Helper()
	host.once.Do(func() {
		if host.skip = hostSkip(); host.skip != "" {
			return
		}
		host.err = setupHost(t)
	})
	if host.skip != "" {
		t.Skip(host.skip)
	}
	if host.err != nil {
		t.Fatal(host.err)
	}
	return host.eng
}

func setupHost(t *testing.T) error {
	ctx := context.Background()
	dir, err := os.MkdirTemp("", "torpor-interp-test-")
	if err != nil {
		return err
	}
	host.dir = dir
	st, err := sqlite.Open(ctx, filepath.Join(dir, "torpor.db"))
	if err != nil {
		return err
	}
	host.closers = append(host.closers, func() { st.Close() })
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	tm, err := template.New(ctx, template.Config{Store: st, Dir: dir, Logger: log})
	if err != nil {
		return err
	}
	// Through the resolver, as the daemon does on first use.
	start := time.Now()
	res := templates.New(templates.Config{Builder: tm, Store: st, Logger: log})
	name, err := res.Resolve(ctx, "code-interpreter-v1")
	if err != nil {
		return fmt.Errorf("build the code interpreter template: %w", err)
	}
	t.Logf("built %s in %s", name, time.Since(start).Round(time.Second))
	rt, err := runc.New(runc.Config{Dir: filepath.Join(dir, "runc"), InitPath: runtimetest.BuildInit(t),
		CgroupParent: torpor.NewID("torpor_test_", 8), Logger: log})
	if err != nil {
		return err
	}
	eng, err := lifecycle.New(lifecycle.Config{Store: st, Runtimes: []torpor.Runtime{rt}, DefaultRuntime: "runc", Logger: log,
		Limits: torpor.Limits{Default: torpor.Resources{VCPUs: 1, MemoryMiB: 512, Pids: 512},
			Max: torpor.Resources{VCPUs: 4, MemoryMiB: 4096, Pids: 4096, DiskMiB: 1 << 20}}})
	if err != nil {
		return err
	}
	host.closers = append(host.closers, eng.Close)
	if err := eng.Recover(ctx); err != nil {
		return err
	}
	host.eng = eng
	return nil
}

const tenant = "t_interp"

// newSandbox creates a sandbox of the code interpreter template and serves
// the code interpreter for it.
func newSandbox(t *testing.T, eng *lifecycle.Engine) (*torpor.Sandbox, *httptest.Server) {
	t.Helper()
	ctx := context.Background()
	sb, err := eng.Create(ctx, tenant, torpor.CreateRequest{Template: templates.CodeInterpreter, Env: map[string]string{"FROM_CREATE": "yes"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = eng.Delete(context.Background(), tenant, sb.ID) })
	s := New(Config{Engine: eng})
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cur, err := eng.Get(r.Context(), tenant, sb.ID)
		if err != nil {
			http.Error(w, err.Error(), 500)
			return
		}
		s.ServeSandbox(w, r, cur)
	}))
	t.Cleanup(hs.Close)
	return sb, hs
}

func execSh(t *testing.T, eng *lifecycle.Engine, id, user, script string) string {
	t.Helper()
	var out bytes.Buffer
	res, err := eng.Exec(context.Background(), tenant, id, torpor.ExecRequest{Cmd: []string{"/bin/sh", "-c", script}, User: user, Stdout: &out, Stderr: &out})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("%s: %v exit %d: %s", script, err, res.ExitCode, out.String())
	}
	return out.String()
}

// The template has what E2B programs expect.
func TestTemplateHasWhatE2BExpects(t *testing.T) {
	eng := realEngine(t)
	sb, _ := newSandbox(t, eng)
	if got := execSh(t, eng, sb.ID, "", "id -u user; stat -c %U:%a /home/user; ls -a /home/user | grep -c bashrc"); got != "1000\nuser:755\n1\n" {
		t.Errorf("user: %q", got)
	}
	execSh(t, eng, sb.ID, "", "command -v bash curl git python3 ps sudo && test -s /etc/ssl/certs/ca-certificates.crt")
	if got := execSh(t, eng, sb.ID, "", "cat /etc/sudoers.d/user"); got != "user ALL=(ALL:ALL) NOPASSWD: ALL\n" {
		t.Errorf("sudoers: %q", got)
	}
	// (sudo is there with a rule for user, but runc sandboxes run with
	// no_new_privileges, which stops it.)
	if got := execSh(t, eng, sb.ID, "user", "whoami; touch /home/user/mine && stat -c %U /home/user/mine"); got != "user\nuser\n" {
		t.Errorf("as user: %q", got)
	}
}

// execute runs code and returns its lines by type.
func execute(t *testing.T, url, body string) map[string][]map[string]any {
	t.Helper()
	resp, lines := post(t, url+"/execute", body)
	if resp.StatusCode != 200 {
		t.Fatalf("%s: status %d", body, resp.StatusCode)
	}
	out := map[string][]map[string]any{}
	for _, l := range lines {
		out[l["type"].(string)] = append(out[l["type"].(string)], l)
	}
	if len(lines) == 0 || lines[len(lines)-1]["type"] != "end_of_execution" {
		t.Fatalf("%s: no end of execution: %v", body, lines)
	}
	return out
}

func mainText(t *testing.T, got map[string][]map[string]any) string {
	t.Helper()
	for _, r := range got["result"] {
		if r["is_main_result"] == true {
			s, _ := r["text"].(string)
			return s
		}
	}
	t.Fatalf("no main result: %v", got)
	return ""
}

const pngSnippet = `import struct, zlib
def _chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xffffffff)
class Dot:
    def _repr_png_(self):
        ihdr = struct.pack(">IIBBBBB", 2, 1, 8, 2, 0, 0, 0)
        return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00\x00\x00\xff")) + _chunk(b"IEND", b"")
Dot()`

func TestExecuteInSandbox(t *testing.T) {
	eng := realEngine(t)
	sb, hs := newSandbox(t, eng)
	ctx := context.Background()

	got := execute(t, hs.URL, `{"code":"x = 41\nprint('hi')"}`)
	if got["number_of_executions"][0]["execution_count"] != 1.0 || got["stdout"][0]["text"] != "hi\n" || got["error"] != nil {
		t.Fatalf("first: %v", got)
	}
	if got = execute(t, hs.URL, `{"code":"x + 1","language":"python"}`); mainText(t, got) != "42" || got["number_of_executions"][0]["execution_count"] != 2.0 {
		t.Fatalf("state: %v", got)
	}
	if got = execute(t, hs.URL, `{"code":"'quoted'"}`); mainText(t, got) != "quoted" {
		t.Errorf("string result: %v", got)
	}
	got = execute(t, hs.URL, fmt.Sprintf(`{"code":%q}`, pngSnippet))
	png, err := base64.StdEncoding.DecodeString(got["result"][0]["png"].(string))
	if err != nil {
		t.Fatal(err)
	}
	if img, err := pngpkg.Decode(bytes.NewReader(png)); err != nil || img.Bounds().Dx() != 2 {
		t.Errorf("png: %v", err)
	}
	got = execute(t, hs.URL, `{"code":"def f():\n    return 1/0\nf()"}`)
	if e := got["error"]; len(e) != 1 || e[0]["name"] != "ZeroDivisionError" || !strings.Contains(e[0]["traceback"].(string), "line 2, in f") {
		t.Errorf("error: %v", got)
	}
	got = execute(t, hs.URL, `{"code":"import os, sys\nprint('e', file=sys.stderr)\n(os.getcwd(), os.environ.get('V'), os.environ.get('FROM_CREATE'))","env_vars":{"V":"set"}}`)
	if mainText(t, got) != "('/home/user', 'set', 'yes')" || got["stderr"][0]["text"] != "e\n" {
		t.Errorf("cwd, env: %v", got)
	}
	if got = execute(t, hs.URL, `{"code":"import os\nstr(os.environ.get('V'))"}`); mainText(t, got) != "None" {
		t.Errorf("env after: %v", got)
	}
	// Output streams while the cell runs: the first line comes a good
	// while before the end, and nothing comes twice.
	resp, err := http.Post(hs.URL+"/execute", "application/json", strings.NewReader(`{"code":"import time\nprint('early')\ntime.sleep(2)\nprint('late')"}`))
	if err != nil {
		t.Fatal(err)
	}
	var early, end time.Time
	var outs []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		var l map[string]any
		_ = json.Unmarshal(sc.Bytes(), &l)
		switch l["type"] {
		case "stdout":
			outs = append(outs, l["text"].(string))
			if early.IsZero() {
				early = time.Now()
			}
		case "end_of_execution":
			end = time.Now()
		}
	}
	resp.Body.Close()
	if strings.Join(outs, "") != "early\nlate\n" || early.IsZero() || end.Sub(early) < time.Second {
		t.Errorf("streamed output %q: first at %v, end at %v", outs, early, end)
	}
	if got = execute(t, hs.URL, `{"code":"echo $((1+2)); arr=(a b); echo ${arr[1]}","language":"bash"}`); got["stdout"][0]["text"] != "3\nb\n" {
		t.Errorf("bash: %v", got)
	}

	// Contexts: their own state and directory; restart drops the state,
	// delete the context.
	resp, err = http.Post(hs.URL+"/contexts", "application/json", strings.NewReader(`{"language":"python","cwd":"/tmp"}`))
	if err != nil {
		t.Fatal(err)
	}
	var c contextJSON
	if err := jsonDecode(resp, &c); err != nil || c.ID == "" || c.Language != "python" || c.Cwd != "/tmp" {
		t.Fatalf("create context: %v %+v", err, c)
	}
	ctxBody := func(code string) string { return fmt.Sprintf(`{"code":%q,"context_id":%q}`, code, c.ID) }
	if got = execute(t, hs.URL, ctxBody("import os\n('x' in globals(), os.getcwd())")); mainText(t, got) != "(False, '/tmp')" {
		t.Errorf("new context: %v", got)
	}
	execute(t, hs.URL, ctxBody("y = 'in context'"))
	var list []contextJSON
	resp, _ = http.Get(hs.URL + "/contexts")
	if err := jsonDecode(resp, &list); err != nil || len(list) < 2 || list[0].ID != "python" || !containsContext(list, c.ID) {
		t.Errorf("list: %v %+v", err, list)
	}
	if code := do(t, "POST", hs.URL+"/contexts/"+c.ID+"/restart"); code != 200 {
		t.Errorf("restart: %d", code)
	}
	if got = execute(t, hs.URL, ctxBody("'y' in globals()")); mainText(t, got) != "False" {
		t.Errorf("after restart: %v", got)
	}
	if code := do(t, "DELETE", hs.URL+"/contexts/"+c.ID); code != 200 {
		t.Errorf("delete: %d", code)
	}
	if resp, _ := post(t, hs.URL+"/execute", ctxBody("1")); resp.StatusCode != 404 {
		t.Errorf("deleted context: %d", resp.StatusCode)
	}
	if code := do(t, "DELETE", hs.URL+"/contexts/"+c.ID); code != 404 {
		t.Errorf("delete again: %d", code)
	}

	// A caller that gives up interrupts the execution; the state stays.
	cctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
	req, _ := http.NewRequestWithContext(cctx, "POST", hs.URL+"/execute", strings.NewReader(`{"code":"import time\nwhile True: time.sleep(0.1)"}`))
	if resp, err := http.DefaultClient.Do(req); err == nil {
		_, _ = bytes.NewBuffer(nil).ReadFrom(resp.Body)
		resp.Body.Close()
	}
	cancel()
	if got = execute(t, hs.URL, `{"code":"x"}`); mainText(t, got) != "41" {
		t.Errorf("after an interrupt: %v", got)
	}

	// The interpreter's state survives a pause.
	if _, err := eng.Pause(ctx, tenant, sb.ID, torpor.PauseFreeze); err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Start(ctx, tenant, sb.ID); err != nil {
		t.Fatal(err)
	}
	if got = execute(t, hs.URL, `{"code":"x"}`); mainText(t, got) != "41" {
		t.Errorf("after pause and resume: %v", got)
	}
}

func containsContext(list []contextJSON, id string) bool {
	for _, c := range list {
		if c.ID == id {
			return true
		}
	}
	return false
}

func do(t *testing.T, method, url string) int {
	t.Helper()
	req, _ := http.NewRequest(method, url, nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}
