package initproc

import (
	"bufio"
	"encoding/json"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// startExecServer is a code server that runs execs (or not: an older one).
func startExecServer(t *testing.T, execs bool) (string, *codeServer) {
	sock, s := startTestCodeServerWith(t, func(s *codeServer) { s.execs = execs })
	t.Cleanup(func() {
		s.spareMu.Lock()
		if s.spare != nil {
			s.spare.end()
		}
		s.spareMu.Unlock()
	})
	return sock, s
}

// askExec sends a ProcExec and returns the connection and a reader of
// its frames.
func askExec(t *testing.T, sock string, req ProcRequest) (net.Conn, func() ExecFrame) {
	t.Helper()
	c, err := net.Dial("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	req.Op = ProcExec
	b, _ := json.Marshal(CodeRequest{Proc: &req})
	if _, err := c.Write(append(b, '\n')); err != nil {
		t.Fatal(err)
	}
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	return c, func() ExecFrame {
		t.Helper()
		line, err := br.ReadBytes('\n')
		if err != nil {
			t.Fatal(err)
		}
		var f ExecFrame
		if err := json.Unmarshal(line, &f); err != nil {
			t.Fatal(err)
		}
		return f
	}
}

func TestExecStreamsOutputThenTheEnd(t *testing.T) {
	sock, _ := startExecServer(t, true)
	_, next := askExec(t, sock, ProcRequest{
		Cmd:  []string{"/bin/sh", "-c", `read l; echo "got $l"; echo oops >&2; printf '{"exit_code":3}' >&3; exit 3`},
		Data: []byte("in\n"),
	})
	out, errs, end := readExec(t, next)
	if out != "got in\n" || errs != "oops\n" {
		t.Errorf("stdout %q, stderr %q", out, errs)
	}
	if end.Status != 3 || string(end.Report) != `{"exit_code":3}` {
		t.Errorf("end: status %d, report %q", end.Status, end.Report)
	}
}

// readExec reads an exec's frames to the end.
func readExec(t *testing.T, next func() ExecFrame) (stdout, stderr string, end ExecFrame) {
	t.Helper()
	var out, errs strings.Builder
	for !end.End {
		f := next()
		if f.Proc != nil {
			t.Fatalf("refused: %+v", f.Proc)
		}
		out.Write(f.Stdout)
		errs.Write(f.Stderr)
		end = f
	}
	return out.String(), errs.String(), end
}

func TestExecRunsTheHelperStartedAhead(t *testing.T) {
	needShell(t)
	t.Setenv(mainEnv, "1") // the helper is this test binary
	sock, s := startExecServer(t, true)
	// The words a helper is run with: "init exec -result-fd 3", then the
	// request; sh drops "init" for this binary.
	helper := []string{"/bin/sh", "-c", `shift; exec "$0" "$@"`, os.Args[0], "init", "exec", "-result-fd", "3"}
	run := func(rest ...string) (string, string, ExecResult) {
		_, next := askExec(t, sock, ProcRequest{Cmd: append(slices.Clip(helper), rest...), NoStdin: true})
		out, errs, end := readExec(t, next)
		var res ExecResult
		if err := json.Unmarshal(end.Report, &res); err != nil {
			t.Fatalf("report %q: %v", end.Report, err)
		}
		if end.Status != res.ExitCode {
			t.Errorf("status %d, report %+v", end.Status, res)
		}
		return out, errs, res
	}
	if out, _, res := run("--", "echo", "one"); out != "one\n" || res.ExitCode != 0 {
		t.Fatalf("first exec: %q %+v", out, res)
	}
	spare := func() *spareHelper {
		s.spareMu.Lock()
		defer s.spareMu.Unlock()
		return s.spare
	}
	deadline := time.Now().Add(5 * time.Second)
	for spare() == nil {
		if time.Now().After(deadline) {
			t.Fatal("no helper was started ahead")
		}
		time.Sleep(5 * time.Millisecond)
	}
	ahead := spare().p.Pid
	out, errs, res := run("-env", "FOO=bar", "-cwd", "/tmp", "-timeout", "10s", "--", "/bin/sh", "-c", `echo "$FOO $(pwd)"; echo e >&2; exit 3`)
	if out != "bar /tmp\n" || errs != "e\n" || res.ExitCode != 3 || res.TimedOut {
		t.Errorf("exec through the helper started ahead: %q %q %+v", out, errs, res)
	}
	// The helper started ahead ran it (the command's parent), and stays
	// for the next exec: the command left nothing behind.
	if out, _, _ := run("--", "/bin/sh", "-c", "echo $PPID"); strings.TrimSpace(out) != strconv.Itoa(ahead) {
		t.Errorf("the command's parent is %q, want the helper started ahead (%d)", out, ahead)
	}
	if sp := spare(); sp == nil || sp.p.Pid != ahead {
		t.Error("the helper started ahead did not stay for the next exec")
	}
	// What the exec before asked for (env, cwd) is gone for this one.
	wd, _ := os.Getwd()
	if out, _, _ := run("--", "/bin/sh", "-c", `echo "${FOO-unset} $(pwd) $PPID"`); out != "unset "+wd+" "+strconv.Itoa(ahead)+"\n" {
		t.Errorf("the next exec in the same helper sees %q, want the server's environment and directory", out)
	}
	// One that leaves a process of its tree behind leaves with it: the
	// next exec gets a helper of its own.
	if _, _, res := run("--", "/bin/sh", "-c", "sleep 1 & echo started"); res.ExitCode != 0 {
		t.Fatalf("background: %+v", res)
	}
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(5 * time.Millisecond) {
		if sp := spare(); sp != nil && sp.p.Pid != ahead {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the helper whose command left a process behind was used again")
		}
	}
	if out, _, _ := run("--", "/bin/sh", "-c", "echo $PPID"); strings.TrimSpace(out) == strconv.Itoa(ahead) {
		t.Error("the helper whose command left a process behind ran the next exec")
	}
	if _, _, res := run("-timeout", "100ms", "--", "sleep", "100"); !res.TimedOut {
		t.Errorf("timeout: %+v", res)
	}
}

func TestExecCallerLeavingStopsTheCommand(t *testing.T) {
	sock, _ := startExecServer(t, true)
	c, next := askExec(t, sock, ProcRequest{Cmd: []string{"/bin/sh", "-c", "echo $$; exec sleep 100"}, NoStdin: true})
	pid, err := strconv.Atoi(strings.TrimSpace(string(next().Stdout)))
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	deadline := time.Now().Add(5 * time.Second)
	for syscall.Kill(pid, 0) == nil {
		if time.Now().After(deadline) {
			t.Fatal("the command outlived its caller")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestExecIsNotFoundWhereTheServerRunsNone(t *testing.T) {
	sock, _ := startExecServer(t, false)
	_, next := askExec(t, sock, ProcRequest{Cmd: []string{"true"}})
	if f := next(); f.Proc == nil || !f.Proc.NotFound {
		t.Errorf("answer %+v, want not found (as a server older than ProcExec)", f)
	}
}

// TestUsersAreNotLookedUpInAFIFO: a FIFO the sandbox puts at /etc/passwd
// would block an exec as a user for ever.
func TestUsersAreNotLookedUpInAFIFO(t *testing.T) {
	p := filepath.Join(t.TempDir(), "passwd")
	if err := syscall.Mkfifo(p, 0o600); err != nil {
		t.Skip(err)
	}
	done := make(chan error, 1)
	go func() { done <- scanColonFile(p, func([]string) bool { return true }) }()
	select {
	case err := <-done:
		if err == nil {
			t.Error("a FIFO was read as a passwd file")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the lookup blocked on a FIFO")
	}
}
