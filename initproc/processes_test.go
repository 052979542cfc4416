package initproc

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

func TestRingKeepsTheLastBytesWithTheirOffsets(t *testing.T) {
	r := newRing(8)
	r.write([]byte("abcde"))
	if d, from, next, end := r.read(0, 100); string(d) != "abcde" || from != 0 || next != 5 || end != 5 {
		t.Fatalf("%q %d %d %d", d, from, next, end)
	}
	r.write([]byte("fghij")) // drops "ab"
	if d, from, next, _ := r.read(0, 100); string(d) != "cdefghij" || from != 2 || next != 10 {
		t.Fatalf("%q %d %d", d, from, next)
	}
	if d, from, next, _ := r.read(7, 2); string(d) != "hi" || from != 7 || next != 9 {
		t.Fatalf("%q %d %d", d, from, next)
	}
	if d, from, next, _ := r.read(99, 2); len(d) != 0 || from != 10 || next != 10 {
		t.Fatalf("past the end: %q %d %d", d, from, next)
	}
	r.write([]byte("0123456789xy")) // longer than the ring
	if d, from, _, end := r.read(0, 100); string(d) != "456789xy" || from != 14 || end != 22 {
		t.Fatalf("%q %d %d", d, from, end)
	}
}

// waitOutput reads from offset until the output holds want or ends.
func waitOutput(t *testing.T, tb *procTable, id int, offset int64, want string) (string, ProcResponse) {
	t.Helper()
	var got bytes.Buffer
	deadline := time.Now().Add(5 * time.Second)
	for {
		res := tb.handle(ProcRequest{Op: ProcOutput, ID: id, Offset: offset})
		if res.Output == nil {
			t.Fatalf("output: %+v", res)
		}
		got.Write(res.Data)
		offset = res.Output.Next
		if strings.Contains(got.String(), want) || res.Output.Ended {
			return got.String(), res
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %q, got %q", want, got.String())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestProcessTable(t *testing.T) {
	tb := newProcTable()
	res := tb.handle(ProcRequest{Op: ProcStart, Cmd: []string{"/bin/sh", "-c", `echo start $FOO $PWD; while read l; do echo got $l; done; echo bye >&2; exit 3`},
		Env: map[string]string{"FOO": "bar"}, Cwd: "/tmp", MinID: 5})
	if res.Info == nil || res.Info.ID != 5 || res.Info.Pid == 0 || res.Info.State != torpor.ProcessRunning {
		t.Fatalf("start: %+v", res)
	}
	id := res.Info.ID
	if out, _ := waitOutput(t, tb, id, 0, "start bar /tmp\n"); out != "start bar /tmp\n" {
		t.Fatalf("first output %q", out)
	}
	if r := tb.handle(ProcRequest{Op: ProcStdin, ID: id, Data: []byte("one\n")}); r.Conflict != "" || r.NotFound {
		t.Fatalf("stdin: %+v", r)
	}
	out, r := waitOutput(t, tb, id, 15, "got one\n")
	if out != "got one\n" || r.Output.Ended {
		t.Fatalf("from 15: %q %+v", out, r.Output)
	}
	if r := tb.handle(ProcRequest{Op: ProcStdin, ID: id, Data: []byte("two\n"), Close: true}); r.Conflict != "" {
		t.Fatalf("stdin close: %+v", r)
	}
	out, r = waitOutput(t, tb, id, 0, "\x00never")
	if out != "start bar /tmp\ngot one\ngot two\nbye\n" || !r.Output.Ended || *r.Output.ExitCode != 3 {
		t.Fatalf("end: %q %+v", out, r.Output)
	}
	if r := tb.handle(ProcRequest{Op: ProcStdin, ID: id, Data: []byte("x")}); r.Conflict == "" {
		t.Fatalf("stdin after close: %+v", r)
	}
	if r := tb.handle(ProcRequest{Op: ProcSignal, ID: id, Signal: "TERM"}); r.Conflict == "" {
		t.Fatalf("signal after exit: %+v", r)
	}

	// A signal ends the process group; the next id follows.
	res = tb.handle(ProcRequest{Op: ProcStart, Cmd: []string{"sleep", "60"}})
	if res.Info == nil || res.Info.ID != 6 {
		t.Fatalf("second: %+v", res)
	}
	if r := tb.handle(ProcRequest{Op: ProcSignal, ID: 6, Signal: "BOGUS"}); r.Invalid == "" {
		t.Fatalf("bad signal: %+v", r)
	}
	if r := tb.handle(ProcRequest{Op: ProcSignal, ID: 6, Signal: "TERM"}); r.Invalid != "" || r.Conflict != "" || r.NotFound {
		t.Fatalf("term: %+v", r)
	}
	if _, r := waitOutput(t, tb, 6, 0, "\x00never"); *r.Output.ExitCode != 128+15 {
		t.Fatalf("after TERM: %+v", r.Output)
	}
	list := tb.handle(ProcRequest{Op: ProcList}).List
	if len(list) != 2 || list[0].ID != 5 || list[1].ID != 6 || list[1].State != torpor.ProcessExited || list[1].Cmd[0] != "sleep" {
		t.Fatalf("list: %+v", list)
	}
	if r := tb.handle(ProcRequest{Op: ProcOutput, ID: 99}); !r.NotFound {
		t.Fatalf("unknown id: %+v", r)
	}
	if r := tb.handle(ProcRequest{Op: ProcStart, Cmd: []string{"/nonexistent"}}); r.Invalid == "" {
		t.Fatalf("missing program: %+v", r)
	}
	if r := tb.handle(ProcRequest{Op: ProcStart, Cmd: []string{"true"}, Cwd: "/nonexistent"}); r.Invalid == "" || r.Param != "cwd" {
		t.Fatalf("missing cwd: %+v", r)
	}
}

func TestProcessTableDropsTheOldestExited(t *testing.T) {
	tb := newProcTable()
	for i := 0; i < maxProcesses; i++ {
		if r := tb.handle(ProcRequest{Op: ProcStart, Cmd: []string{"true"}}); r.Info == nil {
			t.Fatalf("start %d: %+v", i, r)
		}
	}
	for _, p := range tb.procs {
		<-p.settled
	}
	r := tb.handle(ProcRequest{Op: ProcStart, Cmd: []string{"true"}})
	if r.Info == nil || r.Info.ID != maxProcesses+1 {
		t.Fatalf("%+v", r)
	}
	if l := tb.list(); len(l) != maxProcesses || l[0].ID != 2 {
		t.Fatalf("%d, first %d", len(l), l[0].ID)
	}
}
