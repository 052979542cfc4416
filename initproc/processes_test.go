package initproc

import (
	"bytes"
	"os"
	"strings"
	"syscall"
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

func TestRingKeepsWhichStreamEachByteCameFrom(t *testing.T) {
	r := newRing(8)
	r.writeStream([]byte("ab"), false)
	r.writeStream([]byte("cd"), true)
	r.writeStream([]byte("e"), true)
	r.writeStream([]byte("f"), false)
	show := func(cs []ProcChunk) string {
		var b strings.Builder
		for _, c := range cs {
			if c.Stderr {
				b.WriteString("E:")
			} else {
				b.WriteString("O:")
			}
			b.Write(c.Data)
			b.WriteString(" ")
		}
		return b.String()
	}
	if cs, from, next, end := r.readChunks(0, 100); show(cs) != "O:ab E:cde O:f " || from != 0 || next != 6 || end != 6 {
		t.Fatalf("%q %d %d %d", show(cs), from, next, end)
	}
	if cs, from, next, _ := r.readChunks(1, 3); show(cs) != "O:b E:cd " || from != 1 || next != 4 {
		t.Fatalf("middle: %q %d %d", show(cs), from, next)
	}
	// The combined view is unchanged.
	if d, _, _, _ := r.read(0, 100); string(d) != "abcdef" {
		t.Fatalf("combined %q", d)
	}
	r.writeStream([]byte("ghij"), true) // drops "ab": the first run goes
	if cs, from, _, _ := r.readChunks(0, 100); show(cs) != "E:cde O:f E:ghij " || from != 2 {
		t.Fatalf("after a drop: %q %d", show(cs), from)
	}
	if len(r.segs) != 3 {
		t.Fatalf("runs kept: %+v", r.segs)
	}
}

func TestRingBoundsItsRuns(t *testing.T) {
	r := newRing(1 << 20)
	for i := 0; i < maxSegments+10; i++ {
		r.writeStream([]byte("x"), i%2 == 1)
	}
	if len(r.segs) > maxSegments {
		t.Fatalf("%d runs kept", len(r.segs))
	}
	cs, from, next, _ := r.readChunks(0, 1<<20)
	if int64(len(cs)) != next-from || from == 0 {
		t.Fatalf("%d chunks for %d..%d", len(cs), from, next)
	}
}

// follow reads a process's output by stream with waiting reads until it
// ends, and counts the reads.
func follow(t *testing.T, tb *procTable, id int) (stdout, stderr string, end ProcResponse, reads int) {
	t.Helper()
	var o, e strings.Builder
	var offset int64
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		res := tb.handle(ProcRequest{Op: ProcOutput, ID: id, Offset: offset, WaitMS: 5000, Split: true})
		reads++
		if res.Output == nil {
			t.Fatalf("output: %+v", res)
		}
		if len(res.Data) != 0 {
			t.Fatalf("a split read carries data outside chunks: %q", res.Data)
		}
		for _, c := range res.Chunks {
			if c.Stderr {
				e.Write(c.Data)
			} else {
				o.Write(c.Data)
			}
		}
		offset = res.Output.Next
		if res.Output.Ended {
			return o.String(), e.String(), res, reads
		}
	}
	t.Fatalf("no end; so far %q %q", o.String(), e.String())
	return
}

func TestProcessTableKeepsStderrApartAndWaits(t *testing.T) {
	tb := newProcTable()
	res := tb.handle(ProcRequest{Op: ProcStart, Stderr: true,
		Cmd: []string{"/bin/sh", "-c", `echo out; echo err >&2; sleep 0.3; echo late; exit 4`}})
	if res.Info == nil {
		t.Fatalf("start: %+v", res)
	}
	start := time.Now()
	out, errs, end, reads := follow(t, tb, res.Info.ID)
	if out != "out\nlate\n" || errs != "err\n" {
		t.Fatalf("stdout %q stderr %q", out, errs)
	}
	if *end.Output.ExitCode != 4 || end.Signal != 0 {
		t.Fatalf("end %+v signal %d", end.Output, end.Signal)
	}
	// Waiting reads, not a poll: a handful for three writes and the end.
	if reads > 6 {
		t.Fatalf("%d reads", reads)
	}
	if time.Since(start) > 5*time.Second {
		t.Fatalf("the reads waited out their bound: %v", time.Since(start))
	}
	// The combined view (the native API's) still has everything.
	if d, _ := waitOutput(t, tb, res.Info.ID, 0, "late\n"); d != "out\nerr\nlate\n" && d != "err\nout\nlate\n" {
		t.Fatalf("combined %q", d)
	}
}

func TestProcessTableWaitIsBounded(t *testing.T) {
	tb := newProcTable()
	res := tb.handle(ProcRequest{Op: ProcStart, Cmd: []string{"sleep", "30"}})
	defer tb.handle(ProcRequest{Op: ProcSignal, ID: res.Info.ID, Signal: "KILL"})
	start := time.Now()
	r := tb.handle(ProcRequest{Op: ProcOutput, ID: res.Info.ID, WaitMS: 200, Split: true})
	if took := time.Since(start); took < 150*time.Millisecond || took > 3*time.Second || r.Output.Ended || len(r.Chunks) != 0 {
		t.Fatalf("took %v: %+v", took, r.Output)
	}
	// No wait asked: at once.
	start = time.Now()
	tb.handle(ProcRequest{Op: ProcOutput, ID: res.Info.ID})
	if took := time.Since(start); took > 100*time.Millisecond {
		t.Fatalf("a plain read took %v", took)
	}
}

func TestProcessTableTimeoutKills(t *testing.T) {
	tb := newProcTable()
	res := tb.handle(ProcRequest{Op: ProcStart, Cmd: []string{"sleep", "30"}, TimeoutMS: 300})
	start := time.Now()
	_, _, end, _ := follow(t, tb, res.Info.ID)
	if end.Signal != int(syscall.SIGKILL) || *end.Output.ExitCode != 128+9 {
		t.Fatalf("end %+v signal %d", end.Output, end.Signal)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("killed after %v", took)
	}
	if r := tb.handle(ProcRequest{Op: ProcStart, Cmd: []string{"true"}, TimeoutMS: -1}); r.Invalid == "" {
		t.Fatalf("negative timeout: %+v", r)
	}
}

func TestProcessTableStdinOffAndTagAndConfig(t *testing.T) {
	tb := newProcTable()
	res := tb.handle(ProcRequest{Op: ProcStart, Cmd: []string{"/bin/sh", "-c", "cat; echo done"}, NoStdin: true,
		Tag: "web", Env: map[string]string{"A": "1"}, Cwd: "/tmp"})
	if res.Info == nil || res.Info.Tag != "web" || res.Info.Cwd != "/tmp" || res.Info.Env["A"] != "1" {
		t.Fatalf("start: %+v", res)
	}
	// cat reads /dev/null: it ends at once.
	if out, _, end, _ := follow(t, tb, res.Info.ID); out != "done\n" || *end.Output.ExitCode != 0 {
		t.Fatalf("%q %+v", out, end.Output)
	}
	if r := tb.handle(ProcRequest{Op: ProcStdin, ID: res.Info.ID, Data: []byte("x")}); r.Conflict == "" {
		t.Fatalf("stdin of a process started without: %+v", r)
	}
	if l := tb.list(); len(l) != 1 || l[0].Tag != "web" {
		t.Fatalf("list %+v", l)
	}
}

func TestProcessTableRunsAsAUser(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("switching users needs root")
	}
	tb := newProcTable()
	cases := []struct {
		user, cwd, want string
	}{
		{"root", "", "0 0 /root /root root\n"},
		{"nobody", "/tmp", "65534 /tmp"},
		{"12345:54321", "", "12345 54321 / "},
	}
	for _, c := range cases {
		res := tb.handle(ProcRequest{Op: ProcStart, User: c.user, Cwd: c.cwd,
			Cmd: []string{"/bin/sh", "-c", `echo $(id -u) $(id -g) $PWD $HOME $USER`}})
		if res.Info == nil {
			t.Fatalf("%s: %+v", c.user, res)
		}
		out, errs, _, _ := follow(t, tb, res.Info.ID)
		if !strings.HasPrefix(out, c.want) && !strings.Contains(out, c.want) {
			t.Errorf("%s: %q (stderr %q), want %q", c.user, out, errs, c.want)
		}
	}
	for _, bad := range []string{"no-such-user-here", "1:x"} {
		if r := tb.handle(ProcRequest{Op: ProcStart, User: bad, Cmd: []string{"true"}}); r.Invalid == "" || r.Param != "user" {
			t.Errorf("user %q: %+v", bad, r)
		}
	}
}

func TestProcessTableWithoutStderrKeepsOnePipe(t *testing.T) {
	tb := newProcTable()
	res := tb.handle(ProcRequest{Op: ProcStart, Cmd: []string{"/bin/sh", "-c", `echo a; echo b >&2; echo c`}})
	out, errs, _, _ := follow(t, tb, res.Info.ID)
	if out != "a\nb\nc\n" || errs != "" {
		t.Fatalf("stdout %q stderr %q", out, errs)
	}
}
