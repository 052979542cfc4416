package initproc

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"encoding/json"
	pngpkg "image/png"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

func startTestCodeServer(t *testing.T) string {
	sock, _ := startTestCodeServerWith(t, func(*codeServer) {})
	return sock
}

// startTestCodeServerWith starts a code server that set has set up.
func startTestCodeServerWith(t *testing.T, set func(*codeServer)) (string, *codeServer) {
	t.Helper()
	sock := filepath.Join(t.TempDir(), CodeSocket)
	l, err := listenCode(sock)
	if err != nil {
		t.Fatal(err)
	}
	s := newCodeServer()
	set(s)
	go s.serve(l)
	t.Cleanup(func() {
		l.Close()
		s.killAll()
	})
	return sock, s
}

func runCode(t *testing.T, sock, lang, code string, timeoutMS int64) CodeResponse {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b, _ := json.Marshal(CodeRequest{Language: lang, Code: code, TimeoutMS: timeoutMS})
	if _, err := c.Write(append(b, '\n')); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(c).ReadBytes('\n')
	if err != nil {
		t.Fatal(err)
	}
	var res CodeResponse
	if err := json.Unmarshal(line, &res); err != nil {
		t.Fatal(err)
	}
	return res
}

func TestCodeServerShell(t *testing.T) {
	sock := startTestCodeServer(t)
	r := runCode(t, sock, "sh", "cd /tmp; X=5", 0)
	if r.Context != torpor.ContextNew || r.ExitCode == nil || *r.ExitCode != 0 || r.Fail != "" {
		t.Fatalf("first: %+v", r)
	}
	r = runCode(t, sock, "sh", "echo $X $PWD; echo oops >&2; false", 0)
	if r.Context != torpor.ContextExisting || r.Stdout != "5 /tmp\n" || r.Stderr != "oops\n" || *r.ExitCode != 1 {
		t.Fatalf("second: %+v", r)
	}
	// A syntax error does not end the shell.
	r = runCode(t, sock, "sh", "if then", 0)
	if *r.ExitCode == 0 || r.Stderr == "" {
		t.Fatalf("syntax error: %+v", r)
	}
	r = runCode(t, sock, "sh", "printf 'no newline'; cat", 0)
	if r.Stdout != "no newline" || r.Context != torpor.ContextExisting {
		t.Fatalf("no newline / stdin: %+v", r)
	}
	// exit ends the interpreter; the next snippet gets a new one.
	r = runCode(t, sock, "sh", "exit 3", 0)
	if r.ExitCode == nil || *r.ExitCode != 3 {
		t.Fatalf("exit: %+v", r)
	}
	r = runCode(t, sock, "sh", "echo ${X:-unset}", 0)
	if r.Context != torpor.ContextNew || r.Stdout != "unset\n" {
		t.Fatalf("after exit: %+v", r)
	}
}

func TestCodeServerTimeout(t *testing.T) {
	sock := startTestCodeServer(t)
	runCode(t, sock, "sh", "X=1", 0)
	r := runCode(t, sock, "sh", "echo before; sleep 30", 200)
	if !r.TimedOut || r.Stdout != "before\n" || r.Error == nil {
		t.Fatalf("timeout: %+v", r)
	}
	r = runCode(t, sock, "sh", "echo ${X:-unset}", 0)
	if r.Context != torpor.ContextNew || r.Stdout != "unset\n" {
		t.Fatalf("after timeout: %+v", r)
	}
}

func TestCodeServerPython(t *testing.T) {
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 is not installed")
	}
	sock := startTestCodeServer(t)
	r := runCode(t, sock, "python", "x = 41\nprint('hi')", 0)
	if r.Context != torpor.ContextNew || r.Stdout != "hi\n" || r.Result != nil || r.Error != nil {
		t.Fatalf("first: %+v", r)
	}
	r = runCode(t, sock, "python", "import sys, os\nprint('err', file=sys.stderr)\nos.system('echo from-child')\nx + 1", 0)
	if r.Context != torpor.ContextExisting || r.Result == nil || *r.Result != "42" || r.Stderr != "err\n" || !strings.Contains(r.Stdout, "from-child") {
		t.Fatalf("second: %+v result=%v", r, r.Result)
	}
	r = runCode(t, sock, "python", "def f():\n    raise ValueError('bad')\nprint('x')\nf()", 0)
	if r.Error == nil || r.Error.Name != "ValueError" || r.Error.Value != "bad" || !strings.Contains(r.Error.Traceback, "line 2, in f") || r.Stdout != "x\n" {
		t.Fatalf("exception: %+v %+v", r, r.Error)
	}
	if strings.Contains(r.Error.Traceback, "_run") {
		t.Errorf("the traceback shows the driver: %s", r.Error.Traceback)
	}
	r = runCode(t, sock, "python", "def (", 0)
	if r.Error == nil || r.Error.Name != "SyntaxError" {
		t.Fatalf("syntax error: %+v", r)
	}
	r = runCode(t, sock, "python", "'a' * 3", 0)
	if r.Result == nil || *r.Result != "'aaa'" {
		t.Fatalf("repr: %+v", r)
	}
	r = runCode(t, sock, "python", "import time\ntime.sleep(30)", 200)
	if !r.TimedOut {
		t.Fatalf("timeout: %+v", r)
	}
	r = runCode(t, sock, "python", "'x' in globals()", 0)
	if r.Context != torpor.ContextNew || r.Result == nil || *r.Result != "False" {
		t.Fatalf("after timeout: %+v", r)
	}
}

func TestCodeServerMissingPython(t *testing.T) {
	sock := filepath.Join(t.TempDir(), CodeSocket)
	l, err := listenCode(sock)
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	s := newCodeServer()
	s.python = ""
	t.Setenv("PATH", t.TempDir())
	go s.serve(l)
	r := runCode(t, sock, "python", "1", 0)
	if r.Missing != "python3" {
		t.Fatalf("got %+v", r)
	}
}

func codeReq(t *testing.T, sock string, req CodeRequest) CodeResponse {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	b, _ := json.Marshal(req)
	if _, err := c.Write(append(b, '\n')); err != nil {
		t.Fatal(err)
	}
	line, err := bufio.NewReader(c).ReadBytes('\n')
	if err != nil {
		t.Fatal(err)
	}
	var res CodeResponse
	if err := json.Unmarshal(line, &res); err != nil {
		t.Fatal(err)
	}
	return res
}

func needPython(t *testing.T) {
	t.Helper()
	if _, err := exec.LookPath("python3"); err != nil {
		t.Skip("python3 is not installed")
	}
}

func refusedCode(t *testing.T, what string, r CodeResponse) torpor.ErrorCode {
	t.Helper()
	err := r.RefusedError()
	if err == nil {
		t.Fatalf("%s: not refused: %+v", what, r)
	}
	return torpor.ErrorCodeOf(err)
}

// Contexts are interpreters of their own: state does not leak between
// them or into the default one; restart drops a context's state, delete
// the context itself.
func TestCodeServerContexts(t *testing.T) {
	needPython(t)
	sock := startTestCodeServer(t)
	dir := t.TempDir()
	r := codeReq(t, sock, CodeRequest{Op: torpor.CodeCreate, Context: "c1", Language: "python", Cwd: dir})
	if r.Fail != "" || r.Refused != nil || len(r.Contexts) != 1 || r.Contexts[0].ID != "c1" || r.Contexts[0].Cwd != dir || !r.Contexts[0].Running {
		t.Fatalf("create: %+v", r)
	}
	if code := refusedCode(t, "create again", codeReq(t, sock, CodeRequest{Op: torpor.CodeCreate, Context: "c1", Language: "python"})); code != torpor.EConflict {
		t.Errorf("create again: %s", code)
	}
	if code := refusedCode(t, "bad cwd", codeReq(t, sock, CodeRequest{Op: torpor.CodeCreate, Context: "c2", Language: "python", Cwd: "/no/such/dir"})); code != torpor.EInvalid {
		t.Errorf("bad cwd: %s", code)
	}
	r = codeReq(t, sock, CodeRequest{Context: "c1", Code: "import os\nx = 1\nos.getcwd()"})
	if r.Result == nil || *r.Result != repr(dir) || r.ExecutionCount != 1 || r.Context != torpor.ContextExisting {
		t.Fatalf("run in c1: %+v", r)
	}
	r = codeReq(t, sock, CodeRequest{Language: "python", Code: "'x' in globals()"})
	if r.Result == nil || *r.Result != "False" || r.ExecutionCount != 1 {
		t.Fatalf("default context sees c1's state: %+v", r)
	}
	r = codeReq(t, sock, CodeRequest{Context: "c1", Code: "x + 1"})
	if r.Result == nil || *r.Result != "2" || r.ExecutionCount != 2 {
		t.Fatalf("c1 again: %+v", r)
	}
	// The default context answers to its language's name too.
	r = codeReq(t, sock, CodeRequest{Context: "python", Code: "y = 5"})
	if r.ExecutionCount != 2 {
		t.Fatalf("default by name: %+v", r)
	}
	r = codeReq(t, sock, CodeRequest{Op: torpor.CodeList})
	if len(r.Contexts) != 2 || r.Contexts[0].ID != "python" || !r.Contexts[0].Default || r.Contexts[1].ID != "c1" || r.Contexts[1].Language != "python" {
		t.Fatalf("list: %+v", r.Contexts)
	}
	if code := refusedCode(t, "wrong language", codeReq(t, sock, CodeRequest{Context: "c1", Language: "sh", Code: "true"})); code != torpor.EInvalid {
		t.Errorf("wrong language: %s", code)
	}

	if r = codeReq(t, sock, CodeRequest{Op: torpor.CodeRestart, Context: "c1"}); r.Refused != nil || r.Fail != "" {
		t.Fatalf("restart: %+v", r)
	}
	r = codeReq(t, sock, CodeRequest{Context: "c1", Code: "import os\n('x' in globals(), os.getcwd())"})
	if r.Context != torpor.ContextNew || r.Result == nil || *r.Result != "(False, "+repr(dir)+")" || r.ExecutionCount != 1 {
		t.Fatalf("after restart: %+v", r)
	}
	if r = codeReq(t, sock, CodeRequest{Op: torpor.CodeDelete, Context: "c1"}); r.Refused != nil {
		t.Fatalf("delete: %+v", r)
	}
	for _, req := range []CodeRequest{
		{Context: "c1", Code: "1"},
		{Op: torpor.CodeRestart, Context: "c1"},
		{Op: torpor.CodeDelete, Context: "c1"},
		{Context: "nope", Code: "1"},
	} {
		if code := refusedCode(t, "gone context", codeReq(t, sock, req)); code != torpor.ENotFound {
			t.Errorf("%+v: %s", req, code)
		}
	}
	r = codeReq(t, sock, CodeRequest{Language: "python", Code: "y"})
	if r.Result == nil || *r.Result != "5" {
		t.Fatalf("the default context lost its state: %+v", r)
	}
}

func repr(s string) string { return "'" + s + "'" }

// A snippet's rich outputs: an object's _repr_png_ (real PNG bytes) and
// _repr_html_, display() calls in order, then the main result.
func TestCodeServerDisplays(t *testing.T) {
	needPython(t)
	sock := startTestCodeServer(t)
	code := `import struct, zlib
def _chunk(kind, data):
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xffffffff)
class Dot:
    def _repr_png_(self):
        ihdr = struct.pack(">IIBBBBB", 1, 1, 8, 2, 0, 0, 0)
        return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + _chunk(b"IDAT", zlib.compress(b"\x00\xff\x00\x00")) + _chunk(b"IEND", b"")
    def _repr_html_(self):
        return "<b>dot</b>"
    def __repr__(self):
        return "Dot()"
display("first")
print("out")
Dot()`
	r := codeReq(t, sock, CodeRequest{Language: "python", Code: code})
	if r.Error != nil || len(r.Displays) != 2 || r.Stdout != "out\n" {
		t.Fatalf("displays: %+v %+v", r, r.Error)
	}
	if d := r.Displays[0]; d.Main || d.Data["text/plain"] != "'first'" {
		t.Errorf("display(): %+v", d)
	}
	main := r.Displays[1]
	if !main.Main || main.Data["text/plain"] != "Dot()" || main.Data["text/html"] != "<b>dot</b>" || *r.Result != "Dot()" {
		t.Fatalf("main: %+v", main)
	}
	png, err := base64.StdEncoding.DecodeString(main.Data["image/png"])
	if err != nil {
		t.Fatal(err)
	}
	img, err := pngpkg.Decode(bytes.NewReader(png))
	if err != nil || img.Bounds().Dx() != 1 {
		t.Fatalf("not a PNG: %v", err)
	}
	// A value without rich formats is only text; None is no result.
	r = codeReq(t, sock, CodeRequest{Language: "python", Code: "[1, 2]"})
	if len(r.Displays) != 1 || len(r.Displays[0].Data) != 1 || r.Displays[0].Data["text/plain"] != "[1, 2]" {
		t.Errorf("plain value: %+v", r.Displays)
	}
	if r = codeReq(t, sock, CodeRequest{Language: "python", Code: "None"}); len(r.Displays) != 0 || r.Result != nil {
		t.Errorf("None: %+v", r)
	}
	// A formatter that raises is skipped, not the snippet's error.
	r = codeReq(t, sock, CodeRequest{Language: "python", Code: "class B:\n    def _repr_html_(self): raise ValueError()\nB"})
	if r.Error != nil || len(r.Displays) != 1 {
		t.Errorf("raising formatter: %+v %+v", r, r.Error)
	}
}

// Env vars apply to one snippet: set during it, put back after it.
func TestCodeServerEnv(t *testing.T) {
	t.Setenv("TORPOR_KEPT", "before")
	sock := startTestCodeServer(t)
	env := map[string]string{"TORPOR_KEPT": "during", "TORPOR_NEW": "it's new"}
	for _, lang := range []string{"python", "sh"} {
		if lang == "python" {
			if _, err := exec.LookPath("python3"); err != nil {
				continue
			}
		}
		during, after := "import os\nprint(os.environ['TORPOR_KEPT'], os.environ['TORPOR_NEW'])", "import os\nprint(os.environ['TORPOR_KEPT'], os.environ.get('TORPOR_NEW'))"
		if lang == "sh" {
			during, after = `echo "$TORPOR_KEPT" "$TORPOR_NEW"; sh -c 'echo "$TORPOR_NEW"'`, `echo "$TORPOR_KEPT" "${TORPOR_NEW-None}"`
		}
		r := codeReq(t, sock, CodeRequest{Language: lang, Code: during, Env: env})
		if !strings.HasPrefix(r.Stdout, "during it's new\n") || (lang == "sh" && r.Stdout != "during it's new\nit's new\n") {
			t.Errorf("%s during: %+v", lang, r)
		}
		if r = codeReq(t, sock, CodeRequest{Language: lang, Code: after}); r.Stdout != "before None\n" {
			t.Errorf("%s after: %q", lang, r.Stdout)
		}
	}
}

// A caller that leaves interrupts the snippet (KeyboardInterrupt) and the
// interpreter keeps its state, as a notebook's interrupt does.
func TestCodeServerInterrupt(t *testing.T) {
	needPython(t)
	sock := startTestCodeServer(t)
	codeReq(t, sock, CodeRequest{Language: "python", Code: "kept = 7"})
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(CodeRequest{Language: "python", Code: "import time\nwhile True: time.sleep(0.05)"})
	if _, err := c.Write(append(b, '\n')); err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond)
	c.Close()
	r := codeReq(t, sock, CodeRequest{Language: "python", Code: "kept"})
	if r.Context != torpor.ContextExisting || r.Result == nil || *r.Result != "7" || r.ExecutionCount != 3 {
		t.Fatalf("after the interrupt: %+v", r)
	}
}

func TestCodeServerBash(t *testing.T) {
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("bash is not installed")
	}
	sock := startTestCodeServer(t)
	dir := t.TempDir()
	r := codeReq(t, sock, CodeRequest{Language: "bash", Code: "arr=(a b c); cd " + dir, Cwd: "/"})
	if r.ExitCode == nil || *r.ExitCode != 0 || r.Context != torpor.ContextNew {
		t.Fatalf("first: %+v", r)
	}
	r = codeReq(t, sock, CodeRequest{Language: "bash", Code: `echo "${arr[1]}" "$PWD" "$BASH_VERSION" | cut -c1-200`})
	if !strings.HasPrefix(r.Stdout, "b "+dir+" ") || r.ExecutionCount != 2 {
		t.Fatalf("bash state: %+v", r)
	}
}

// A python snippet's output can be read while it runs, from offsets,
// and nothing is read between snippets.
func TestCodeServerOutputWhileRunning(t *testing.T) {
	needPython(t)
	sock := startTestCodeServer(t)
	runCode(t, sock, "python", "import time, sys", 0) // the interpreter is up
	peek := func(out, errs int64) torpor.CodeOutput {
		r := codeReq(t, sock, CodeRequest{Proc: &ProcRequest{Op: ProcCodeOutput, Context: "python", Offset: out, ErrOffset: errs}})
		if r.Proc == nil || r.Proc.Code == nil {
			t.Fatalf("code output: %+v", r)
		}
		return *r.Proc.Code
	}
	if got := peek(0, 0); got.Running || got.Stdout != "" {
		t.Fatalf("between snippets: %+v", got)
	}
	done := make(chan CodeResponse, 1)
	go func() {
		done <- runCode(t, sock, "python", "print('first'); print('oops', file=sys.stderr); sys.stdout.write('x'); time.sleep(1.5); print('second')", 0)
	}()
	deadline := time.Now().Add(5 * time.Second)
	var got torpor.CodeOutput
	for got = peek(0, 0); got.Stdout != "first\nx" || got.Stderr != "oops\n"; got = peek(0, 0) {
		if time.Now().After(deadline) {
			t.Fatalf("while it runs: %+v", got)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if !got.Running {
		t.Fatalf("not running: %+v", got)
	}
	if rest := peek(6, 5); rest.Stdout != "x" || rest.Stderr != "" {
		t.Fatalf("from offsets: %+v", rest)
	}
	res := <-done
	if res.Stdout != "first\nxsecond\n" || res.Stderr != "oops\n" {
		t.Fatalf("the snippet's output: %q %q", res.Stdout, res.Stderr)
	}
	if got := peek(0, 0); got.Running || got.Stdout != "" {
		t.Fatalf("after it: %+v", got)
	}
}
