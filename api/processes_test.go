package api_test

import (
	"bytes"
	"strings"
	"testing"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/client"
)

func TestProcessesThroughTheAPI(t *testing.T) {
	f := newFixture(t)
	cl := f.tenantCl
	sb, err := cl.Create(ctx, torpor.CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	p, err := cl.StartProcess(ctx, sb.ID, client.ProcessRequest{Cmd: []string{"cat"}, Env: map[string]string{"TOKEN": "s3cret"}})
	if err != nil || p.ID != 1 || p.State != torpor.ProcessRunning || p.Boot != 1 || p.Env != nil {
		t.Fatalf("start: %+v %v", p, err)
	}
	if err := cl.WriteProcessStdin(ctx, sb.ID, p.ID, "one\n", false); err != nil {
		t.Fatal(err)
	}
	out, err := cl.ProcessOutput(ctx, sb.ID, p.ID, 0)
	if err != nil || out.Data != "cat\none\n" || out.Next != 8 || out.Ended {
		t.Fatalf("output: %+v %v", out, err)
	}
	out, err = cl.ProcessOutput(ctx, sb.ID, p.ID, 4)
	if err != nil || out.Data != "one\n" || out.Offset != 4 {
		t.Fatalf("from 4: %+v %v", out, err)
	}
	// Pause keeps it (the call wakes the sandbox).
	if _, err := cl.Pause(ctx, sb.ID, ""); err != nil {
		t.Fatal(err)
	}
	list, err := cl.ListProcesses(ctx, sb.ID)
	if err != nil || len(list) != 1 || list[0].State != torpor.ProcessRunning || list[0].Env != nil {
		t.Fatalf("after pause: %+v %v", list, err)
	}
	if err := cl.SignalProcess(ctx, sb.ID, p.ID, "sigterm"); err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	end, err := cl.FollowProcessOutput(ctx, sb.ID, p.ID, 0, &buf)
	if err != nil || buf.String() != "cat\none\n" || !end.Ended || *end.ExitCode != 143 {
		t.Fatalf("follow: %q %+v %v", buf.String(), end, err)
	}
	if err := cl.SignalProcess(ctx, sb.ID, p.ID, "KILL"); !client.IsConflict(err) {
		t.Fatalf("signal an exited process: %v", err)
	}
	p2, err := cl.StartProcess(ctx, sb.ID, client.ProcessRequest{Cmd: []string{"sleep", "9"}})
	if err != nil || p2.ID != 2 {
		t.Fatalf("second: %+v %v", p2, err)
	}
	// Hibernate ends them: listed as gone, addressing them is 410, and
	// new ids follow the old ones.
	if _, err := cl.Hibernate(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	list, err = cl.ListProcesses(ctx, sb.ID)
	if err != nil || len(list) != 2 || list[0].State != torpor.ProcessGone || list[1].State != torpor.ProcessGone {
		t.Fatalf("hibernated: %+v %v", list, err)
	}
	if _, err := cl.Start(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	p3, err := cl.StartProcess(ctx, sb.ID, client.ProcessRequest{Cmd: []string{"top"}})
	if err != nil || p3.ID != 3 || p3.Boot != 2 {
		t.Fatalf("after start: %+v %v", p3, err)
	}
	list, err = cl.ListProcesses(ctx, sb.ID)
	if err != nil || len(list) != 3 || list[1].State != torpor.ProcessGone || list[1].Pid != 0 || list[2].State != torpor.ProcessRunning {
		t.Fatalf("after start: %+v %v", list, err)
	}
	if _, err := cl.ProcessOutput(ctx, sb.ID, 2, 0); !client.IsGone(err) {
		t.Fatalf("output of a gone process: %v", err)
	}
	if err := cl.WriteProcessStdin(ctx, sb.ID, 1, "x", false); !client.IsGone(err) {
		t.Fatalf("stdin of a gone process: %v", err)
	}
	if err := cl.SignalProcess(ctx, sb.ID, 99, "TERM"); !client.IsNotFound(err) {
		t.Fatalf("unknown process: %v", err)
	}
	if err := cl.WriteProcessStdin(ctx, sb.ID, 3, "", true); err != nil {
		t.Fatal(err)
	}
	if err := cl.WriteProcessStdin(ctx, sb.ID, 3, "late", false); !client.IsConflict(err) {
		t.Fatalf("stdin after close: %v", err)
	}
}

func TestProcessesBadInput(t *testing.T) {
	f := newFixture(t)
	sb, err := f.tenantCl.Create(ctx, torpor.CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.tenantCl.StartProcess(ctx, sb.ID, client.ProcessRequest{Cmd: []string{"cat"}}); err != nil {
		t.Fatal(err)
	}
	base := "/v1/sandboxes/" + sb.ID + "/processes"
	for _, tc := range []struct {
		method, path, body string
		status             int
		param              string
	}{
		{"POST", base, `{}`, 400, "cmd"},
		{"POST", base, `{"cmd": [""]}`, 400, "cmd"},
		{"POST", base, `{"cmd": ["a\u0000"]}`, 400, "cmd"},
		{"POST", base, `{"cmd": ["ls"], "cwd": "tmp"}`, 400, "cwd"},
		{"POST", base, `{"cmd": ["ls"], "env": {"1X": "y"}}`, 400, "env"},
		{"POST", base, `{"cmd": ["ls"], "bogus": 1}`, 400, "bogus"},
		{"GET", base + "/1/output?offset=-1", "", 400, "offset"},
		{"GET", base + "/1/output?offset=x", "", 400, "offset"},
		{"GET", base + "/0/output", "", 400, "pid"},
		{"GET", base + "/abc/output", "", 400, "pid"},
		{"GET", base + "/7/output", "", 404, ""},
		{"POST", base + "/1/signal", `{"signal": "STOP"}`, 400, "signal"},
		{"POST", base + "/1/signal", `{"signal": "9"}`, 400, "signal"},
		{"POST", base + "/1/stdin", `{"data": "` + strings.Repeat("x", torpor.MaxProcessStdin+1) + `"}`, 400, "data"},
		{"POST", base + "/1/stdin", `{"data": 5}`, 400, ""},
		{"POST", "/v1/sandboxes/nope/processes", `{"cmd": ["ls"]}`, 404, ""},
		{"GET", "/v1/sandboxes/nope/processes", "", 404, ""},
	} {
		code, eb := f.raw(t, tc.method, tc.path, f.acmeKey, "application/json", tc.body)
		if code != tc.status || (tc.param != "" && !strings.HasPrefix(eb.Error.Param, tc.param)) || eb.Error.Message == "" {
			t.Errorf("%s %s %.60s: %d %+v", tc.method, tc.path, tc.body, code, eb)
		}
	}
}
