package e2e

import (
	"context"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/client"
)

func runCode(t *testing.T, cl *client.Client, id, lang, code string, timeout float64) *client.CodeResult {
	t.Helper()
	res, err := cl.RunCode(context.Background(), id, client.CodeRequest{Language: lang, Code: code, TimeoutSeconds: timeout})
	if err != nil {
		t.Fatalf("run_code %q: %v", code, err)
	}
	return res
}

func TestRunCodeShell(t *testing.T) {
	needs(t)
	d := startDaemon(t, torporBin(t), t.TempDir())
	cl := d.client(t)
	ctx := context.Background()
	sb, err := cl.Create(ctx, torpor.CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	if r := runCode(t, cl, sb.ID, "sh", "cd /tmp; X=5", 0); r.Context != torpor.ContextNew || r.ExitCode == nil || *r.ExitCode != 0 {
		t.Fatalf("first: %+v", r)
	}
	if r := runCode(t, cl, sb.ID, "sh", "echo $X $PWD; false", 0); r.Stdout != "5 /tmp\n" || *r.ExitCode != 1 || r.Context != torpor.ContextExisting {
		t.Fatalf("state: %+v", r)
	}
	// Pause keeps the interpreter; the snippet wakes the sandbox.
	if _, err := cl.Pause(ctx, sb.ID, ""); err != nil {
		t.Fatal(err)
	}
	if r := runCode(t, cl, sb.ID, "sh", "echo $X", 0); r.Stdout != "5\n" || r.Context != torpor.ContextExisting {
		t.Fatalf("after pause: %+v", r)
	}
	// A timeout kills the interpreter.
	if r := runCode(t, cl, sb.ID, "sh", "sleep 30", 0.3); !r.TimedOut {
		t.Fatalf("timeout: %+v", r)
	}
	if r := runCode(t, cl, sb.ID, "sh", "echo ${X:-unset}", 0); r.Stdout != "unset\n" || r.Context != torpor.ContextNew {
		t.Fatalf("after timeout: %+v", r)
	}
	runCode(t, cl, sb.ID, "sh", "X=7", 0)
	if _, err := cl.Hibernate(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if r := runCode(t, cl, sb.ID, "sh", "echo ${X:-unset}", 0); r.Stdout != "unset\n" || r.Context != torpor.ContextNew {
		t.Fatalf("after hibernate: %+v", r)
	}
	// The busybox template has no python3: a clear 400.
	_, err = cl.RunCode(ctx, sb.ID, client.CodeRequest{Language: "python", Code: "1+1"})
	if !client.IsInvalid(err) || !strings.Contains(err.Error(), "python3") {
		t.Fatalf("python in busybox: %v", err)
	}
	// The CLI.
	if out := d.ok("run", sb.ID, "--lang", "sh", "-c", "echo hi"); out != "hi\n" {
		t.Errorf("torpor run: %q", out)
	}
}

// checkRunCodePython runs the python run_code checks on a daemon that has
// the python template (TestBuildPythonTemplate builds it once for both).
func checkRunCodePython(t *testing.T, d *daemon) {
	cl := d.client(t)
	ctx := context.Background()
	sb, err := cl.Create(ctx, torpor.CreateRequest{Template: "python"})
	if err != nil {
		t.Fatal(err)
	}
	if r := runCode(t, cl, sb.ID, "python", "x = 41", 0); r.Context != torpor.ContextNew || r.Error != nil {
		t.Fatalf("first: %+v", r)
	}
	if r := runCode(t, cl, sb.ID, "python", "print(x + 1)", 0); r.Stdout != "42\n" || r.Context != torpor.ContextExisting {
		t.Fatalf("state: %+v", r)
	}
	if r := runCode(t, cl, sb.ID, "python", "1/0", 0); r.Error == nil || r.Error.Name != "ZeroDivisionError" || !strings.Contains(r.Error.Traceback, "ZeroDivisionError") {
		t.Fatalf("exception: %+v", r)
	}
	if _, err := cl.Pause(ctx, sb.ID, ""); err != nil {
		t.Fatal(err)
	}
	if r := runCode(t, cl, sb.ID, "python", "x", 0); r.Result == nil || *r.Result != "41" || r.Context != torpor.ContextExisting {
		t.Fatalf("after pause: %+v", r)
	}
	if r := runCode(t, cl, sb.ID, "python", "import time\ntime.sleep(30)", 0.5); !r.TimedOut {
		t.Fatalf("timeout: %+v", r)
	}
	if r := runCode(t, cl, sb.ID, "python", "'x' in globals()", 0); r.Context != torpor.ContextNew || *r.Result != "False" {
		t.Fatalf("after timeout: %+v", r)
	}
	runCode(t, cl, sb.ID, "python", "x = 1", 0)
	if _, err := cl.Hibernate(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if r := runCode(t, cl, sb.ID, "python", "'x' in globals()", 0); r.Context != torpor.ContextNew || *r.Result != "False" {
		t.Fatalf("after hibernate: %+v", r)
	}

	// Figures for BENCHMARKS.md (logged, not asserted): a warm 1+1 through
	// the API against a bare python3 start through exec.
	warm := timeN(200, func() { runCode(t, cl, sb.ID, "python", "1+1", 0) })
	cold := timeN(20, func() {
		if _, err := cl.Exec(ctx, sb.ID, client.ExecRequest{Cmd: []string{"python3", "-c", "1+1"}}); err != nil {
			t.Fatal(err)
		}
	})
	t.Logf("run_code warm 1+1: p50 %v p99 %v; exec python3 -c 1+1: p50 %v p99 %v; ratio p50 %.1fx",
		warm[len(warm)/2], warm[len(warm)*99/100], cold[len(cold)/2], cold[len(cold)*99/100],
		float64(cold[len(cold)/2])/float64(warm[len(warm)/2]))
}

func timeN(n int, f func()) []time.Duration {
	ds := make([]time.Duration, n)
	for i := range ds {
		start := time.Now()
		f()
		ds[i] = time.Since(start)
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	return ds
}
