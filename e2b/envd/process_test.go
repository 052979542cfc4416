package envd_test

import (
	"context"
	"encoding/base64"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/e2b/envd"
	"github.com/torpor-dev/torpor/e2b/envd/proto/process"
	"github.com/torpor-dev/torpor/e2b/envd/proto/process/processconnect"
	"github.com/torpor-dev/torpor/lifecycle"
	"github.com/torpor-dev/torpor/rootfs"
	"github.com/torpor-dev/torpor/runtime/runc"
	"github.com/torpor-dev/torpor/runtime/runtimetest"
	"github.com/torpor-dev/torpor/store/sqlite"
)

const procTenant = "acme"

// procEnv is an engine over a real runc runtime, one busybox sandbox with
// E2B's user, and envd's process service on an httptest server in front
// of it (as the proxy would call ServeSandbox).
type procEnv struct {
	eng *lifecycle.Engine
	sb  *torpor.Sandbox
	cl  processconnect.ProcessClient
	// bin speaks Connect's binary protobuf; cl speaks JSON, as the SDK.
	bin processconnect.ProcessClient
}

func newProcEnv(t testing.TB) *procEnv {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	if _, err := exec.LookPath("runc"); err != nil {
		t.Skip("needs runc (apt-get install runc)")
	}
	if _, err := os.Stat(rootfs.BusyboxPath); err != nil {
		t.Skip("needs busybox-static (apt-get install busybox-static)")
	}
	ctx := context.Background()
	dir := t.TempDir()
	base := filepath.Join(dir, "base")
	if err := rootfs.BuildBase(ctx, base); err != nil {
		t.Fatal(err)
	}
	procAddUser(t, base)
	rt, err := runc.New(runc.Config{Dir: filepath.Join(dir, "state"), InitPath: runtimetest.BuildInit(t),
		CgroupParent: torpor.NewID("torpor_test_", 8)})
	if err != nil {
		t.Skipf("no runc runtime here: %v", err)
	}
	st, err := sqlite.Open(ctx, filepath.Join(dir, "torpor.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.PutTemplate(ctx, torpor.Template{Name: "base", RootFS: base, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	eng, err := lifecycle.New(lifecycle.Config{Store: st, Runtimes: []torpor.Runtime{rt}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(eng.Close)
	sb, err := eng.Create(ctx, procTenant, torpor.CreateRequest{Template: "base", Env: map[string]string{"SANDBOX_VAR": "from-create"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _, _ = eng.Delete(context.Background(), procTenant, sb.ID) })
	if sb.State != torpor.StateRunning {
		t.Fatalf("sandbox %s: %+v", sb.State, sb.Failure)
	}
	srv := envd.New(envd.Config{Engine: eng})
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cur, err := eng.Get(r.Context(), procTenant, sb.ID)
		if err != nil {
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		}
		srv.ServeSandbox(w, r, cur)
	}))
	t.Cleanup(ts.Close)
	return &procEnv{eng: eng, sb: sb,
		cl:  processconnect.NewProcessClient(ts.Client(), ts.URL, connect.WithProtoJSON()),
		bin: processconnect.NewProcessClient(ts.Client(), ts.URL)}
}

// procAddUser gives the template E2B's user, which busybox's base lacks:
// uid 1000 with a home it owns.
func procAddUser(t testing.TB, root string) {
	t.Helper()
	for name, line := range map[string]string{"passwd": "user:x:1000:1000::/home/user:/bin/sh\n", "group": "user:x:1000:\n"} {
		f, err := os.OpenFile(filepath.Join(root, "etc", name), os.O_APPEND|os.O_WRONLY|os.O_CREATE, 0o644)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString(line); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	home := filepath.Join(root, "home", "user")
	if err := os.MkdirAll(home, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(home, 1000, 1000); err != nil {
		t.Fatal(err)
	}
}

// shReq is what the SDK sends for a command, with busybox's /bin/sh for
// bash.
func shReq(cmd string) *process.StartRequest {
	no := false
	return &process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-l", "-c", cmd}}, Stdin: &no}
}

// result is what a stream told.
type result struct {
	pid            uint32
	stdout, stderr string
	keepalives     int
	end            *process.ProcessEvent_EndEvent
	err            error
}

type eventStream interface {
	Receive() bool
	Err() error
}

// collect reads a Start or Connect stream to its end.
func collect[T any](s interface {
	eventStream
	Msg() *T
}, event func(*T) *process.ProcessEvent) result {
	var r result
	for s.Receive() {
		switch e := event(s.Msg()).GetEvent().(type) {
		case *process.ProcessEvent_Start:
			r.pid = e.Start.GetPid()
		case *process.ProcessEvent_Data:
			r.stdout += string(e.Data.GetStdout())
			r.stderr += string(e.Data.GetStderr())
		case *process.ProcessEvent_Keepalive:
			r.keepalives++
		case *process.ProcessEvent_End:
			r.end = e.End
		}
	}
	r.err = s.Err()
	return r
}

func startEvents(m *process.StartResponse) *process.ProcessEvent     { return m.GetEvent() }
func connectEvents(m *process.ConnectResponse) *process.ProcessEvent { return m.GetEvent() }

// run starts a command and reads its stream to the end.
func (e *procEnv) run(t *testing.T, ctx context.Context, req *connect.Request[process.StartRequest]) result {
	t.Helper()
	s, err := e.cl.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	return collect(s, startEvents)
}

// started starts a command and returns its stream once the start event
// came, with the pid.
func (e *procEnv) started(t *testing.T, ctx context.Context, req *connect.Request[process.StartRequest]) (*connect.ServerStreamForClient[process.StartResponse], uint32) {
	t.Helper()
	s, err := e.cl.Start(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if !s.Receive() {
		t.Fatalf("no start event: %v", s.Err())
	}
	pid := s.Msg().GetEvent().GetStart().GetPid()
	if pid == 0 {
		t.Fatalf("first event %v, want start", s.Msg())
	}
	return s, pid
}

func basicUser(name string) string {
	return "Basic " + base64.StdEncoding.EncodeToString([]byte(name+":"))
}

func codeOf(err error) connect.Code {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Code()
	}
	return connect.CodeUnknown
}

func TestProcessService(t *testing.T) {
	e := newProcEnv(t)
	ctx := context.Background()

	t.Run("exit codes and statuses", func(t *testing.T) {
		for _, c := range []struct {
			cmd    string
			code   int32
			status string
		}{
			{"true", 0, "exit status 0"},
			{"exit 3", 3, "exit status 3"},
			{"kill -9 $$", -1, "signal: killed"},
		} {
			r := e.run(t, ctx, connect.NewRequest(shReq(c.cmd)))
			if r.err != nil || r.end == nil || r.pid == 0 {
				t.Fatalf("%s: %+v", c.cmd, r)
			}
			if r.end.GetExitCode() != c.code || r.end.GetStatus() != c.status || r.end.GetExited() != (c.code >= 0) {
				t.Errorf("%s: end %v", c.cmd, r.end)
			}
			if (c.code == 0) != (r.end.Error == nil) || (r.end.Error != nil && r.end.GetError() != c.status) {
				t.Errorf("%s: error %v", c.cmd, r.end.Error)
			}
		}
	})

	t.Run("stdout and stderr apart, envs merged over the sandbox's", func(t *testing.T) {
		req := shReq(`echo out $FOO $SANDBOX_VAR; echo err >&2; echo more`)
		req.Process.Envs = map[string]string{"FOO": "bar"}
		r := e.run(t, ctx, connect.NewRequest(req))
		if r.stdout != "out bar from-create\nmore\n" || r.stderr != "err\n" || r.end.GetExitCode() != 0 {
			t.Fatalf("%+v", r)
		}
		// The binary protocol says the same.
		s, err := e.bin.Start(ctx, connect.NewRequest(shReq(`echo bin; echo e >&2`)))
		if err != nil {
			t.Fatal(err)
		}
		if r := collect(s, startEvents); r.stdout != "bin\n" || r.stderr != "e\n" || r.end == nil {
			t.Fatalf("binary: %+v", r)
		}
	})

	t.Run("user and cwd", func(t *testing.T) {
		cmd := `echo $(id -un) $PWD $HOME $USER`
		r := e.run(t, ctx, connect.NewRequest(shReq(cmd)))
		if r.stdout != "user /home/user /home/user user\n" {
			t.Fatalf("default user: %q %q", r.stdout, r.stderr)
		}
		req := connect.NewRequest(shReq(cmd))
		req.Header().Set("Authorization", basicUser("root"))
		if r := e.run(t, ctx, req); r.stdout != "root /root /root root\n" {
			t.Fatalf("root: %q %q", r.stdout, r.stderr)
		}
		in := shReq(cmd)
		tmp := "/tmp"
		in.Process.Cwd = &tmp
		if r := e.run(t, ctx, connect.NewRequest(in)); r.stdout != "user /tmp /home/user user\n" {
			t.Fatalf("cwd: %q %q", r.stdout, r.stderr)
		}
		// A file the user writes is the user's.
		if r := e.run(t, ctx, connect.NewRequest(shReq(`touch f && stat -c %U f`))); r.stdout != "user\n" {
			t.Fatalf("owner: %q %q", r.stdout, r.stderr)
		}
	})

	t.Run("stdin, then close", func(t *testing.T) {
		in := shReq(`while read l; do echo got $l; done; echo eof`)
		yes := true
		in.Stdin = &yes
		s, pid := e.started(t, ctx, connect.NewRequest(in))
		defer s.Close()
		sel := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}}
		if _, err := e.cl.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: sel,
			Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("one\n")}}})); err != nil {
			t.Fatal(err)
		}
		if _, err := e.cl.CloseStdin(ctx, connect.NewRequest(&process.CloseStdinRequest{Process: sel})); err != nil {
			t.Fatal(err)
		}
		if r := collect(s, startEvents); r.stdout != "got one\neof\n" || r.end.GetExitCode() != 0 {
			t.Fatalf("%+v", r)
		}
		// Without stdin a reader ends at once.
		if r := e.run(t, ctx, connect.NewRequest(shReq(`cat; echo done`))); r.stdout != "done\n" {
			t.Fatalf("no stdin: %+v", r)
		}
	})

	t.Run("background, list, kill by pid and by tag", func(t *testing.T) {
		tagged := shReq(`sleep 60`)
		tag := "server"
		tagged.Tag = &tag
		cwd := "/tmp"
		tagged.Process.Cwd = &cwd
		tagged.Process.Envs = map[string]string{"K": "V"}
		s1, pid1 := e.started(t, ctx, connect.NewRequest(tagged))
		defer s1.Close()
		s2, pid2 := e.started(t, ctx, connect.NewRequest(shReq(`sleep 60`)))
		defer s2.Close()
		list, err := e.cl.List(ctx, connect.NewRequest(&process.ListRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		seen := map[uint32]*process.ProcessInfo{}
		for _, p := range list.Msg.GetProcesses() {
			seen[p.GetPid()] = p
		}
		p1 := seen[pid1]
		if p1 == nil || seen[pid2] == nil || p1.GetTag() != "server" || p1.GetConfig().GetCmd() != "/bin/sh" ||
			strings.Join(p1.GetConfig().GetArgs(), " ") != "-l -c sleep 60" || p1.GetConfig().GetCwd() != "/tmp" || p1.GetConfig().GetEnvs()["K"] != "V" {
			t.Fatalf("list: %v", list.Msg)
		}
		kill := func(sel *process.ProcessSelector) error {
			_, err := e.cl.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: sel, Signal: process.Signal_SIGNAL_SIGKILL}))
			return err
		}
		if err := kill(&process.ProcessSelector{Selector: &process.ProcessSelector_Tag{Tag: "server"}}); err != nil {
			t.Fatal(err)
		}
		if r := collect(s1, startEvents); r.end.GetStatus() != "signal: killed" || r.end.GetExitCode() != -1 || r.end.GetExited() {
			t.Fatalf("killed by tag: %+v", r)
		}
		if _, err := e.cl.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{
			Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid2}}, Signal: process.Signal_SIGNAL_SIGTERM})); err != nil {
			t.Fatal(err)
		}
		if r := collect(s2, startEvents); r.end.GetStatus() != "signal: terminated" {
			t.Fatalf("terminated by pid: %+v", r)
		}
		// Gone: the SDK's kill() answers false on NotFound.
		if err := kill(&process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid2}}); codeOf(err) != connect.CodeNotFound {
			t.Fatalf("kill of an ended process: %v", err)
		}
		list, _ = e.cl.List(ctx, connect.NewRequest(&process.ListRequest{}))
		for _, p := range list.Msg.GetProcesses() {
			if p.GetPid() == pid1 || p.GetPid() == pid2 {
				t.Fatalf("an ended process is listed: %v", p)
			}
		}
	})

	t.Run("connect re-attaches", func(t *testing.T) {
		in := shReq(`echo before; read x; echo got $x; echo oops >&2; exit 7`)
		yes := true
		in.Stdin = &yes
		sctx, cancel := context.WithCancel(ctx)
		s, pid := e.started(t, sctx, connect.NewRequest(in))
		time.Sleep(300 * time.Millisecond) // "before" is written before we attach
		cancel()
		s.Close()
		sel := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}}
		c, err := e.cl.Connect(ctx, connect.NewRequest(&process.ConnectRequest{Process: sel}))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if !c.Receive() || c.Msg().GetEvent().GetStart().GetPid() != pid {
			t.Fatalf("connect start: %v %v", c.Msg(), c.Err())
		}
		if _, err := e.cl.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: sel,
			Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("abc\n")}}})); err != nil {
			t.Fatal(err)
		}
		r := collect(c, connectEvents)
		if r.stdout != "got abc\n" || r.stderr != "oops\n" || r.end.GetExitCode() != 7 || r.err != nil {
			t.Fatalf("%+v", r)
		}
		c2, err := e.cl.Connect(ctx, connect.NewRequest(&process.ConnectRequest{Process: sel}))
		if err == nil {
			c2.Receive()
			err = c2.Err()
		}
		if codeOf(err) != connect.CodeNotFound {
			t.Fatalf("connect to an ended process: %v", err)
		}
	})

	t.Run("the deadline kills the process", func(t *testing.T) {
		dctx, cancel := context.WithTimeout(ctx, 1500*time.Millisecond)
		defer cancel()
		s, pid := e.started(t, dctx, connect.NewRequest(shReq(`sleep 60`)))
		r := collect(s, startEvents)
		if codeOf(r.err) != connect.CodeDeadlineExceeded {
			t.Fatalf("stream end: %+v", r)
		}
		deadline := time.Now().Add(5 * time.Second)
		for {
			list, err := e.cl.List(ctx, connect.NewRequest(&process.ListRequest{}))
			if err != nil {
				t.Fatal(err)
			}
			alive := false
			for _, p := range list.Msg.GetProcesses() {
				alive = alive || p.GetPid() == pid
			}
			if !alive {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("pid %d still runs past its deadline", pid)
			}
			time.Sleep(100 * time.Millisecond)
		}
	})

	t.Run("keepalives on a quiet stream", func(t *testing.T) {
		req := connect.NewRequest(shReq(`sleep 2.5; echo done`))
		req.Header().Set("Keepalive-Ping-Interval", "1")
		r := e.run(t, ctx, req)
		if r.keepalives < 2 || r.stdout != "done\n" || r.end == nil {
			t.Fatalf("%+v", r)
		}
	})

	t.Run("bad input", func(t *testing.T) {
		rel := "tmp"
		missing := "/no/such/dir"
		yes := true
		cases := []struct {
			name string
			req  *process.StartRequest
			user string
			want connect.Code
		}{
			{"no cmd", &process.StartRequest{Process: &process.ProcessConfig{}}, "", connect.CodeInvalidArgument},
			{"no process", &process.StartRequest{}, "", connect.CodeInvalidArgument},
			{"NUL", &process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/sh", Args: []string{"-c", "echo \x00"}}}, "", connect.CodeInvalidArgument},
			{"relative cwd", &process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/sh", Cwd: &rel}}, "", connect.CodeInvalidArgument},
			{"missing cwd", &process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/sh", Cwd: &missing}}, "", connect.CodeInvalidArgument},
			{"unknown user", shReq("true"), "nobody-here", connect.CodeInvalidArgument},
			{"bad user", shReq("true"), "a b", connect.CodeInvalidArgument},
			{"no such program", &process.StartRequest{Process: &process.ProcessConfig{Cmd: "/no/such/program"}}, "", connect.CodeInvalidArgument},
			{"bad env", &process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/sh", Envs: map[string]string{"A=B": "x"}}}, "", connect.CodeInvalidArgument},
			{"pty", &process.StartRequest{Process: &process.ProcessConfig{Cmd: "/bin/sh"}, Stdin: &yes,
				Pty: &process.PTY{Size: &process.PTY_Size{Cols: 80, Rows: 24}}}, "", connect.CodeUnimplemented},
		}
		for _, c := range cases {
			req := connect.NewRequest(c.req)
			if c.user != "" {
				req.Header().Set("Authorization", basicUser(c.user))
			}
			s, err := e.cl.Start(ctx, req)
			if err == nil {
				for s.Receive() {
					if s.Msg().GetEvent().GetStart() != nil {
						t.Errorf("%s: started", c.name)
					}
				}
				err = s.Err()
			}
			if codeOf(err) != c.want {
				t.Errorf("%s: %v, want %v", c.name, err, c.want)
			}
		}
		missingPid := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: 999999}}
		if _, err := e.cl.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: missingPid, Signal: process.Signal_SIGNAL_SIGKILL})); codeOf(err) != connect.CodeNotFound {
			t.Errorf("signal to a missing pid: %v", err)
		}
		if _, err := e.cl.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: missingPid})); codeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("no signal: %v", err)
		}
		if _, err := e.cl.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: missingPid,
			Input: &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("x")}}})); codeOf(err) != connect.CodeNotFound {
			t.Errorf("input to a missing pid: %v", err)
		}
		if _, err := e.cl.CloseStdin(ctx, connect.NewRequest(&process.CloseStdinRequest{Process: &process.ProcessSelector{
			Selector: &process.ProcessSelector_Tag{Tag: "nope"}}})); codeOf(err) != connect.CodeNotFound {
			t.Errorf("close of a missing tag: %v", err)
		}
		if _, err := e.cl.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{})); codeOf(err) != connect.CodeInvalidArgument {
			t.Errorf("no selector: %v", err)
		}
		c, err := e.cl.Connect(ctx, connect.NewRequest(&process.ConnectRequest{Process: missingPid}))
		if err == nil {
			c.Receive()
			err = c.Err()
		}
		if codeOf(err) != connect.CodeNotFound {
			t.Errorf("connect to a missing pid: %v", err)
		}
		if _, err := e.cl.Update(ctx, connect.NewRequest(&process.UpdateRequest{Process: missingPid})); codeOf(err) != connect.CodeNotFound {
			t.Errorf("update of a missing pid: %v", err)
		}
		s, pid := e.started(t, ctx, connect.NewRequest(shReq("sleep 60")))
		defer s.Close()
		sel := &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}}
		if _, err := e.cl.Update(ctx, connect.NewRequest(&process.UpdateRequest{Process: sel,
			Pty: &process.PTY{Size: &process.PTY_Size{Cols: 10, Rows: 10}}})); codeOf(err) != connect.CodeUnimplemented {
			t.Errorf("update of a process: %v", err)
		}
		if _, err := e.cl.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{Process: sel,
			Input: &process.ProcessInput{Input: &process.ProcessInput_Pty{Pty: []byte("x")}}})); codeOf(err) != connect.CodeUnimplemented {
			t.Errorf("pty input: %v", err)
		}
		_, _ = e.cl.SendSignal(ctx, connect.NewRequest(&process.SendSignalRequest{Process: sel, Signal: process.Signal_SIGNAL_SIGKILL}))
	})

	t.Run("a process survives pause and resume, and streams do not wake the sandbox", func(t *testing.T) {
		in := shReq(`read x; echo got $x`)
		yes := true
		in.Stdin = &yes
		req := connect.NewRequest(in)
		req.Header().Set("Keepalive-Ping-Interval", "1")
		s, pid := e.started(t, ctx, req)
		defer s.Close()
		done := make(chan result, 1)
		go func() { done <- collect(s, startEvents) }()
		if _, err := e.eng.Pause(ctx, procTenant, e.sb.ID, torpor.PauseFreeze); err != nil {
			t.Fatal(err)
		}
		time.Sleep(2500 * time.Millisecond) // keep-alives and reads go on meanwhile
		sb, err := e.eng.Get(ctx, procTenant, e.sb.ID)
		if err != nil || sb.State != torpor.StatePaused {
			t.Fatalf("the open stream woke the sandbox: %v %v", sb.State, err)
		}
		select {
		case r := <-done:
			t.Fatalf("the stream ended while paused: %+v", r)
		default:
		}
		if _, err := e.eng.Start(ctx, procTenant, e.sb.ID); err != nil {
			t.Fatal(err)
		}
		list, err := e.cl.List(ctx, connect.NewRequest(&process.ListRequest{}))
		if err != nil {
			t.Fatal(err)
		}
		found := false
		for _, p := range list.Msg.GetProcesses() {
			found = found || p.GetPid() == pid
		}
		if !found {
			t.Fatalf("pid %d not listed after the resume: %v", pid, list.Msg)
		}
		if _, err := e.cl.SendInput(ctx, connect.NewRequest(&process.SendInputRequest{
			Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}},
			Input:   &process.ProcessInput{Input: &process.ProcessInput_Stdin{Stdin: []byte("back\n")}}})); err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-done:
			if r.stdout != "got back\n" || r.end.GetExitCode() != 0 || r.keepalives < 1 {
				t.Fatalf("%+v", r)
			}
		case <-time.After(15 * time.Second):
			t.Fatal("no end after the resume")
		}
	})

	t.Run("a killed sandbox ends the stream", func(t *testing.T) {
		s, _ := e.started(t, ctx, connect.NewRequest(shReq("sleep 60")))
		defer s.Close()
		done := make(chan result, 1)
		go func() { done <- collect(s, startEvents) }()
		time.Sleep(200 * time.Millisecond)
		if _, err := e.eng.Delete(ctx, procTenant, e.sb.ID); err != nil {
			t.Fatal(err)
		}
		select {
		case r := <-done:
			if r.end != nil || r.err == nil {
				t.Fatalf("%+v", r)
			}
		case <-time.After(20 * time.Second):
			t.Fatal("the stream outlived its sandbox")
		}
	})
}

// BenchmarkCommandTrue compares an E2B command (`commands.run('true')`:
// a Start stream read to its end) with the engine's exec of the same.
func BenchmarkCommandTrue(b *testing.B) {
	e := newProcEnv(b)
	ctx := context.Background()
	b.Run("envd-start", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			s, err := e.cl.Start(ctx, connect.NewRequest(shReq("true")))
			if err != nil {
				b.Fatal(err)
			}
			if r := collect(s, startEvents); r.end == nil || r.end.GetExitCode() != 0 {
				b.Fatalf("%+v", r)
			}
			s.Close()
		}
	})
	b.Run("engine-exec", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			res, err := e.eng.Exec(ctx, procTenant, e.sb.ID, torpor.ExecRequest{Cmd: []string{"/bin/sh", "-l", "-c", "true"}, User: "user"})
			if err != nil || res.ExitCode != 0 {
				b.Fatal(res, err)
			}
		}
	})
}
