package initproc

import (
	"bufio"
	"encoding/json"
	"net"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/torpor-dev/torpor"
)

func startTestCodeServer(t *testing.T) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), CodeSocket)
	l, err := listenCode(sock)
	if err != nil {
		t.Fatal(err)
	}
	s := newCodeServer()
	go s.serve(l)
	t.Cleanup(func() {
		l.Close()
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, in := range s.interp {
			in.kill()
		}
	})
	return sock
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
