package initproc

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

// The test binary doubles as the torpor binary: with this variable set it
// runs Main on its arguments.
const mainEnv = "TORPOR_INITPROC_TEST_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(mainEnv) == "1" {
		os.Exit(Main(os.Args[1:]))
	}
	os.Exit(m.Run())
}

func needShell(t *testing.T) {
	t.Helper()
	if _, err := os.Stat("/bin/sh"); err != nil {
		t.Skip("needs /bin/sh")
	}
}

// initCmd returns the test binary running Main with args.
func initCmd(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	cmd := exec.Command(os.Args[0], args...)
	cmd.Env = append(os.Environ(), mainEnv+"=1")
	return cmd
}

func readResult(t *testing.T, dir string) Result {
	t.Helper()
	var r Result
	ok, err := ReadReport(dir, ResultFile, &r)
	if err != nil || !ok {
		t.Fatalf("result report: ok=%v err=%v", ok, err)
	}
	return r
}

func TestSetupFailureIsReported(t *testing.T) {
	needShell(t)
	run := t.TempDir()
	cmd := initCmd(t, "-run", run, "-setup", "echo one >> "+run+"/setup.out",
		"-setup", "echo two; echo oops >&2; exit 3", "-setup", "echo never >> "+run+"/setup.out",
		"--", "sleep", "100")
	if err := cmd.Run(); err == nil {
		t.Fatal("init exited 0 after a failed setup")
	}
	r := readResult(t, run)
	if r.Kind != torpor.FailureSetup || r.Step != 1 || r.ExitCode != 3 || !strings.Contains(r.Output, "two\noops\n") {
		t.Errorf("result = %+v", r)
	}
	if b, _ := os.ReadFile(filepath.Join(run, "setup.out")); string(b) != "one\n" {
		t.Errorf("setup commands ran: %q; want only the first", b)
	}
	if ok, _ := ReadReport(run, ReadyFile, &Ready{}); ok {
		t.Error("ready reported after a failed setup")
	}
}

func TestEntrypointExitIsReported(t *testing.T) {
	needShell(t)
	run := t.TempDir()
	cmd := initCmd(t, "-run", run, "-setup", "true", "--", "/bin/sh", "-c", "echo hello; echo bye >&2; exit 5")
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 5 {
		t.Fatalf("init: %v, want exit status 5", err)
	}
	if ok, err := ReadReport(run, ReadyFile, &Ready{}); !ok || err != nil {
		t.Errorf("ready: %v %v", ok, err)
	}
	r := readResult(t, run)
	if r.Kind != torpor.FailureEntrypoint || r.ExitCode != 5 || r.Output != "hello\nbye\n" {
		t.Errorf("result = %+v", r)
	}
	if b, _ := os.ReadFile(filepath.Join(run, LogFile)); string(b) != "hello\nbye\n" {
		t.Errorf("log = %q", b)
	}
}

func TestEntrypointNotFound(t *testing.T) {
	run := t.TempDir()
	cmd := initCmd(t, "-run", run, "--", "/no/such/entrypoint")
	if err := cmd.Run(); err == nil {
		t.Fatal("init exited 0")
	}
	r := readResult(t, run)
	if r.Kind != torpor.FailureEntrypoint || r.ExitCode != 127 {
		t.Errorf("result = %+v", r)
	}
}

func TestSignalIsForwardedToEntrypoint(t *testing.T) {
	needShell(t)
	run := t.TempDir()
	cmd := initCmd(t, "-run", run, "--", "/bin/sh", "-c", "trap 'echo got term; exit 9' TERM; echo trapped; while :; do sleep 0.01; done")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitReady(t, run)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		if b, _ := os.ReadFile(filepath.Join(run, LogFile)); strings.Contains(string(b), "trapped") {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the entrypoint never installed its trap")
		}
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	if err := cmd.Wait(); err == nil {
		t.Fatal("init exited 0")
	}
	r := readResult(t, run)
	if r.ExitCode != 9 || !strings.Contains(r.Output, "got term") {
		t.Errorf("result = %+v", r)
	}
}

func TestIdleInitStopsOnTerm(t *testing.T) {
	run := t.TempDir()
	cmd := initCmd(t, "-run", run)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	waitReady(t, run)
	_ = cmd.Process.Signal(syscall.SIGTERM)
	err := cmd.Wait()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 143 {
		t.Fatalf("init: %v, want exit status 143", err)
	}
	if r := readResult(t, run); r.Kind != KindTerminated || r.ExitCode != 143 || r.Signal != "SIGTERM" {
		t.Errorf("result = %+v", r)
	}
}

func waitReady(t *testing.T, run string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if ok, _ := ReadReport(run, ReadyFile, &Ready{}); ok {
			return
		}
	}
	t.Fatal("init never reported ready")
}

// execHelper runs `init exec` with a result pipe on fd 3.
func execHelper(t *testing.T, stdin string, args ...string) (stdout, stderr string, res ExecResult) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	cmd := initCmd(t, append([]string{"exec", "-result-fd", "3"}, args...)...)
	cmd.ExtraFiles = []*os.File{w}
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.WaitDelay = 10 * time.Second
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	_ = cmd.Wait()
	if err := json.NewDecoder(r).Decode(&res); err != nil {
		t.Fatalf("result: %v (stderr %q)", err, errb.String())
	}
	return out.String(), errb.String(), res
}

func TestExecHelper(t *testing.T) {
	needShell(t)
	out, errs, res := execHelper(t, "in put\n", "-env", "FOO=bar", "-cwd", "/tmp", "--",
		"/bin/sh", "-c", `read x; echo "$x $FOO $(pwd)"; echo e >&2; exit 3`)
	if out != "in put bar /tmp\n" || errs != "e\n" || res.ExitCode != 3 || res.TimedOut {
		t.Errorf("got %q %q %+v", out, errs, res)
	}

	_, _, res = execHelper(t, "", "-cwd", "/no/such/dir", "--", "true")
	if res.Param != "cwd" || res.Error == "" {
		t.Errorf("bad cwd: %+v", res)
	}
	_, errs, res = execHelper(t, "", "--", "no-such-command-xyz")
	if res.ExitCode != 127 || !strings.Contains(errs, "no-such-command-xyz") {
		t.Errorf("missing command: %+v %q", res, errs)
	}
}

func TestExecHelperTimeoutKillsTree(t *testing.T) {
	needShell(t)
	pids := filepath.Join(t.TempDir(), "pids")
	// The second sleep leaves the process group and is orphaned: only the
	// subreaper keeps it in reach.
	script := `sleep 100 & echo $! >> ` + pids + `; (setsid sleep 100 & echo $! >> ` + pids + `); sleep 100`
	start := time.Now()
	out, _, res := execHelper(t, "", "-timeout", "200ms", "--", "/bin/sh", "-c", "echo started; "+script)
	if !res.TimedOut || out != "started\n" {
		t.Fatalf("result %+v, out %q", res, out)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("took %v", d)
	}
	b, err := os.ReadFile(pids)
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range strings.Fields(string(b)) {
		pid, _ := strconv.Atoi(f)
		if pid > 0 && syscall.Kill(pid, 0) == nil {
			t.Errorf("process %d survived the timeout", pid)
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

func TestExecHelperLeavesBackgroundWithoutTimeout(t *testing.T) {
	needShell(t)
	start := time.Now()
	out, _, res := execHelper(t, "", "--", "/bin/sh", "-c", "sleep 100 & echo $!")
	if res.ExitCode != 0 || res.TimedOut {
		t.Fatalf("result %+v", res)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("exec waited for its background process: %v", d)
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(out))
	if pid <= 0 {
		t.Fatalf("out %q", out)
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
}

func TestReadReportIsDefensive(t *testing.T) {
	dir := t.TempDir()
	var r Result
	if ok, err := ReadReport(dir, ResultFile, &r); ok || err != nil {
		t.Errorf("missing: %v %v", ok, err)
	}
	secret := filepath.Join(t.TempDir(), "secret")
	os.WriteFile(secret, []byte(`{"kind":"x"}`), 0o600)
	os.Symlink(secret, filepath.Join(dir, ResultFile))
	if ok, err := ReadReport(dir, ResultFile, &r); ok || err == nil {
		t.Errorf("symlink followed: %v %v", ok, err)
	}
	os.Remove(filepath.Join(dir, ResultFile))
	if err := syscall.Mkfifo(filepath.Join(dir, ResultFile), 0o600); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := ReadReport(dir, ResultFile, &r); done <- err }()
	select {
	case err := <-done:
		if err == nil {
			t.Error("fifo read as a report")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("ReadReport blocked on a FIFO")
	}
	os.Remove(filepath.Join(dir, ResultFile))
	os.WriteFile(filepath.Join(dir, ResultFile), bytes.Repeat([]byte(" "), MaxReportSize+1), 0o600)
	if ok, err := ReadReport(dir, ResultFile, &r); ok || err == nil {
		t.Errorf("oversized read: %v %v", ok, err)
	}
	os.WriteFile(filepath.Join(dir, ResultFile), []byte("{junk"), 0o600)
	if ok, err := ReadReport(dir, ResultFile, &r); ok || err == nil {
		t.Errorf("junk read: %v %v", ok, err)
	}
}

func TestTail(t *testing.T) {
	tl := newTail(5)
	tl.Write([]byte("abc"))
	tl.Write([]byte("def"))
	if got := tl.String(); got != "bcdef" {
		t.Errorf("tail = %q", got)
	}
	tl.Write([]byte("0123456789"))
	if got := tl.String(); got != "56789" {
		t.Errorf("tail = %q", got)
	}
}

func TestRotatingLog(t *testing.T) {
	name := filepath.Join(t.TempDir(), "log")
	l, err := openRotatingLog(name, 10)
	if err != nil {
		t.Fatal(err)
	}
	l.Write([]byte("0123456789abc"))
	l.Write([]byte("defghijklmnopq"))
	cur, _ := os.ReadFile(name)
	old, _ := os.ReadFile(name + ".1")
	if string(old) != "abcdefghij" || string(cur) != "klmnopq" {
		t.Errorf("log %q, old %q", cur, old)
	}
}
