package envd_test

import (
	"bytes"
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
	pb "github.com/torpor-dev/torpor/e2b/envd/proto/filesystem"
	"github.com/torpor-dev/torpor/e2b/envd/proto/filesystem/filesystemconnect"
	"github.com/torpor-dev/torpor/lifecycle"
	"github.com/torpor-dev/torpor/rootfs"
	"github.com/torpor-dev/torpor/runtime/runc"
	"github.com/torpor-dev/torpor/runtime/runtimetest"
	"github.com/torpor-dev/torpor/store/sqlite"
)

const tenant = "acme"

// addUser gives the busybox base template at base E2B's `user` (uid
// 1000, home /home/user), as an E2B template has it. (busybox-static has
// no adduser, and a setup command may not chown.)
func addUser(t *testing.T, base string) {
	t.Helper()
	for name, line := range map[string]string{"etc/passwd": "user:x:1000:1000::/home/user:/bin/sh\n", "etc/group": "user:x:1000:\n"} {
		f, err := os.OpenFile(filepath.Join(base, name), os.O_APPEND|os.O_WRONLY, 0)
		if err != nil {
			t.Fatal(err)
		}
		f.WriteString(line)
		f.Close()
	}
	home := filepath.Join(base, "home", "user")
	if err := os.MkdirAll(home, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Chown(home, 1000, 1000); err != nil {
		t.Fatal(err)
	}
}

// env is an envd server over a real engine with one real runc sandbox.
type env struct {
	eng   *lifecycle.Engine
	sb    *torpor.Sandbox
	url   string
	fs    filesystemconnect.FilesystemClient
	token string
}

// tokenTransport adds the sandbox's access token to every request.
type tokenTransport struct{ token string }

func (t tokenTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set(envd.HeaderAccessToken, t.token)
	return http.DefaultTransport.RoundTrip(r)
}

func needHost(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (runc containers)")
	}
	if _, err := exec.LookPath("runc"); err != nil {
		t.Skip("needs runc (apt-get install runc)")
	}
	if _, err := os.Stat(rootfs.BusyboxPath); err != nil {
		t.Skip("needs busybox-static (apt-get install busybox-static)")
	}
}

func newEnv(t *testing.T) *env {
	t.Helper()
	needHost(t)
	ctx := context.Background()
	dir := t.TempDir()
	base := filepath.Join(dir, "base")
	if err := rootfs.BuildBase(ctx, base); err != nil {
		t.Fatal(err)
	}
	addUser(t, base)
	st, err := sqlite.Open(ctx, filepath.Join(dir, "torpor.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.PutTemplate(ctx, torpor.Template{Name: "base", RootFS: base, CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	rt, err := runc.New(runc.Config{Dir: filepath.Join(dir, "runc"), InitPath: runtimetest.BuildInit(t), CgroupParent: torpor.NewID("torpor_test_", 8)})
	if err != nil {
		t.Skipf("runc runtime: %v", err)
	}
	eng, err := lifecycle.New(lifecycle.Config{Store: st, Runtimes: []torpor.Runtime{rt}, Capacity: lifecycle.Capacity{VCPUs: 8, MemoryMiB: 8192}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(eng.Close)
	if err := eng.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	sb, err := eng.Create(ctx, tenant, torpor.CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { eng.Delete(context.Background(), tenant, sb.ID) })
	for deadline := time.Now().Add(time.Minute); sb.State != torpor.StateRunning; time.Sleep(50 * time.Millisecond) {
		if sb, err = eng.Get(ctx, tenant, sb.ID); err != nil || sb.State == torpor.StateFailed || time.Now().After(deadline) {
			t.Fatalf("the sandbox did not start: %v %+v", err, sb.Failure)
		}
	}
	srv := envd.New(envd.Config{Engine: eng})
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cur, err := eng.Get(r.Context(), tenant, sb.ID)
		if err == nil {
			err = srv.Authorize(r, cur)
		}
		if err != nil {
			w.WriteHeader(http.StatusUnauthorized)
			return
		}
		srv.ServeSandbox(w, r, cur)
	}))
	t.Cleanup(ts.Close)
	hc := &http.Client{Transport: tokenTransport{sb.TrafficToken}}
	return &env{eng: eng, sb: sb, url: ts.URL, fs: filesystemconnect.NewFilesystemClient(hc, ts.URL), token: sb.TrafficToken}
}

// sh runs a shell command in the sandbox as user and returns its output.
func (e *env) sh(t *testing.T, user, script string) string {
	t.Helper()
	var out bytes.Buffer
	res, err := e.eng.Exec(context.Background(), tenant, e.sb.ID, torpor.ExecRequest{Cmd: []string{"sh", "-c", script}, User: user, Stdout: &out, Stderr: &out})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("%s: %v exit %d: %s", script, err, res.ExitCode, out.String())
	}
	return out.String()
}

func asUser[T any](msg *T, user string) *connect.Request[T] {
	r := connect.NewRequest(msg)
	if user != "" {
		r.Header().Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":")))
	}
	return r
}

func code(err error) connect.Code {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Code()
	}
	return 0
}

func TestFilesystem(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	t.Run("rpc", func(t *testing.T) { testRPC(t, e, ctx) })
	t.Run("watch", func(t *testing.T) { testWatch(t, e, ctx) })
	t.Run("polled watcher", func(t *testing.T) { testPolledWatcher(t, e, ctx) })
	t.Run("files", func(t *testing.T) { testFiles(t, e) })
	t.Run("signed", func(t *testing.T) { testSigned(t, e) })
	t.Run("escapes", func(t *testing.T) { testEscapes(t, e, ctx) })
	t.Run("watch across pause and kill", func(t *testing.T) { testWatchLifecycle(t, e, ctx) })
}

// testWatchLifecycle: an open watch lets the sandbox pause, and ends
// cleanly when the sandbox is killed.
func testWatchLifecycle(t *testing.T, e *env, ctx context.Context) {
	stream, err := e.fs.WatchDir(ctx, asUser(&pb.WatchDirRequest{Path: "/home/user", Recursive: true}, ""))
	if err != nil || !stream.Receive() {
		t.Fatalf("watch: %v %v", err, stream.Err())
	}
	ended := make(chan error, 1)
	go func() {
		for stream.Receive() {
		}
		ended <- stream.Err()
	}()
	if sb, err := e.eng.Pause(ctx, tenant, e.sb.ID, torpor.PauseFreeze); err != nil || sb.State != torpor.StatePaused {
		t.Fatalf("pause with a watch open: %v %v", sb, err)
	}
	if _, err := e.eng.Start(ctx, tenant, e.sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.eng.Delete(ctx, tenant, e.sb.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-ended:
		if err != nil {
			t.Fatalf("the watch ended with %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the watch outlived its sandbox")
	}
}

func testRPC(t *testing.T, e *env, ctx context.Context) {
	// MakeDir, relative to the user's home, owned by the user.
	res, err := e.fs.MakeDir(ctx, asUser(&pb.MakeDirRequest{Path: "proj/src"}, ""))
	if err != nil {
		t.Fatal(err)
	}
	if got := res.Msg.Entry; got.Path != "/home/user/proj/src" || got.Type != pb.FileType_FILE_TYPE_DIRECTORY || got.Owner != "user" || got.Group != "user" || got.Permissions != "drwxr-xr-x" {
		t.Fatalf("made %+v", got)
	}
	if _, err := e.fs.MakeDir(ctx, asUser(&pb.MakeDirRequest{Path: "/home/user/proj/src"}, "")); code(err) != connect.CodeAlreadyExists {
		t.Fatalf("MakeDir of an existing directory: %v", err)
	}
	// A command run as user can write into what was made.
	e.sh(t, "user", "echo hi > /home/user/proj/src/a.txt && ln -s a.txt /home/user/proj/src/link && ls -ld /home/user/proj")
	if _, err := e.fs.MakeDir(ctx, asUser(&pb.MakeDirRequest{Path: "proj/src/a.txt"}, "")); code(err) != connect.CodeInvalidArgument {
		t.Fatalf("MakeDir over a file: %v", err)
	}

	st, err := e.fs.Stat(ctx, asUser(&pb.StatRequest{Path: "~/proj/src/a.txt"}, ""))
	if err != nil {
		t.Fatal(err)
	}
	if got := st.Msg.Entry; got.Name != "a.txt" || got.Type != pb.FileType_FILE_TYPE_FILE || got.Size != 3 || got.Permissions != "-rw-r--r--" ||
		got.Mode != 0o644 || got.Owner != "user" || got.ModifiedTime == nil || time.Since(got.ModifiedTime.AsTime()) > time.Minute {
		t.Fatalf("stat %+v", got)
	}
	if _, err := e.fs.Stat(ctx, asUser(&pb.StatRequest{Path: "/nope"}, "")); code(err) != connect.CodeNotFound {
		t.Fatalf("stat of a missing file: %v", err)
	}
	if _, err := e.fs.Stat(ctx, asUser(&pb.StatRequest{Path: "/etc"}, "nobody-here")); code(err) != connect.CodeUnauthenticated {
		t.Fatalf("an unknown user: %v", err)
	}
	// As root, a relative path is under /root.
	if st, err := e.fs.Stat(ctx, asUser(&pb.StatRequest{Path: ""}, "root")); err != nil || st.Msg.Entry.Path != "/root" {
		t.Fatalf("root's home: %v %v", st, err)
	}

	l, err := e.fs.ListDir(ctx, asUser(&pb.ListDirRequest{Path: "/home/user/proj", Depth: 2}, ""))
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, en := range l.Msg.Entries {
		names = append(names, en.Path)
		if en.Name == "link" && (en.Type != pb.FileType_FILE_TYPE_FILE || en.GetSymlinkTarget() != "/home/user/proj/src/a.txt" || !strings.HasPrefix(en.Permissions, "L")) {
			t.Errorf("symlink entry %+v", en)
		}
	}
	if strings.Join(names, " ") != "/home/user/proj/src /home/user/proj/src/a.txt /home/user/proj/src/link" {
		t.Fatalf("list depth 2: %v", names)
	}
	if l, err := e.fs.ListDir(ctx, asUser(&pb.ListDirRequest{Path: "/home/user/proj"}, "")); err != nil || len(l.Msg.Entries) != 1 {
		t.Fatalf("list depth 1: %v %v", l, err)
	}
	if _, err := e.fs.ListDir(ctx, asUser(&pb.ListDirRequest{Path: "/home/user/proj/src/a.txt"}, "")); code(err) != connect.CodeInvalidArgument {
		t.Fatalf("list of a file: %v", err)
	}
	if _, err := e.fs.ListDir(ctx, asUser(&pb.ListDirRequest{Path: "/nope"}, "")); code(err) != connect.CodeNotFound {
		t.Fatalf("list of a missing directory: %v", err)
	}

	mv, err := e.fs.Move(ctx, asUser(&pb.MoveRequest{Source: "proj/src/a.txt", Destination: "proj/new/dir/b.txt"}, ""))
	if err != nil {
		t.Fatal(err)
	}
	if mv.Msg.Entry.Path != "/home/user/proj/new/dir/b.txt" || mv.Msg.Entry.Size != 3 {
		t.Fatalf("moved %+v", mv.Msg.Entry)
	}
	if out := e.sh(t, "user", "cat /home/user/proj/new/dir/b.txt && stat -c %U /home/user/proj/new"); out != "hi\nuser\n" {
		t.Fatalf("after the move: %q", out)
	}
	if _, err := e.fs.Move(ctx, asUser(&pb.MoveRequest{Source: "proj/none", Destination: "proj/x"}, "")); code(err) != connect.CodeNotFound {
		t.Fatalf("move of a missing file: %v", err)
	}

	if _, err := e.fs.Remove(ctx, asUser(&pb.RemoveRequest{Path: "proj"}, "")); err != nil {
		t.Fatal(err)
	}
	if _, err := e.fs.Stat(ctx, asUser(&pb.StatRequest{Path: "proj"}, "")); code(err) != connect.CodeNotFound {
		t.Fatalf("after remove: %v", err)
	}
	if _, err := e.fs.Remove(ctx, asUser(&pb.RemoveRequest{Path: "proj"}, "")); err != nil {
		t.Fatalf("remove of what is gone: %v", err)
	}
	if _, err := e.fs.Stat(ctx, asUser(&pb.StatRequest{Path: "/proc/self"}, "")); code(err) != connect.CodeInvalidArgument {
		t.Fatalf("a runtime mount: %v", err)
	}
}

// watchEvents reads a watch stream's filesystem events until want are
// all seen (in order, others between them allowed) or the time is up.
func watchEvents(t *testing.T, stream *connect.ServerStreamForClient[pb.WatchDirResponse], want []string) {
	t.Helper()
	got := make(chan string, 100)
	go func() {
		for stream.Receive() {
			if fe := stream.Msg().GetFilesystem(); fe != nil {
				got <- fe.Type.String() + " " + fe.Name
			}
		}
		close(got)
	}()
	var seen []string
	timeout := time.After(10 * time.Second)
	for i := 0; i < len(want); {
		select {
		case ev, ok := <-got:
			if !ok {
				t.Fatalf("the stream ended (%v); saw %v, want %v", stream.Err(), seen, want)
			}
			seen = append(seen, ev)
			if ev == want[i] {
				i++
			}
		case <-timeout:
			t.Fatalf("saw %v, want %v", seen, want)
		}
	}
}

func testWatch(t *testing.T, e *env, ctx context.Context) {
	e.sh(t, "user", "mkdir -p /home/user/w/sub")
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req := asUser(&pb.WatchDirRequest{Path: "w", Recursive: true}, "")
	req.Header().Set("Keepalive-Ping-Interval", "1")
	stream, err := e.fs.WatchDir(wctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if !stream.Receive() || stream.Msg().GetStart() == nil {
		t.Fatalf("no start event first: %v", stream.Err())
	}
	// A keepalive comes within the interval asked for.
	if !stream.Receive() || stream.Msg().GetKeepalive() == nil {
		t.Fatalf("no keepalive: %v %v", stream.Msg(), stream.Err())
	}
	e.sh(t, "user", "cd /home/user/w && echo a > f.txt && echo more >> f.txt && mkdir sub/new && sleep 0.3 && echo b > sub/new/g.txt && rm f.txt")
	watchEvents(t, stream, []string{
		"EVENT_TYPE_CREATE f.txt", "EVENT_TYPE_WRITE f.txt", "EVENT_TYPE_CREATE sub/new",
		"EVENT_TYPE_CREATE sub/new/g.txt", "EVENT_TYPE_WRITE sub/new/g.txt", "EVENT_TYPE_REMOVE f.txt",
	})
	cancel()

	for p, want := range map[string]connect.Code{"/nope": connect.CodeNotFound, "/etc/passwd": connect.CodeInvalidArgument} {
		s, err := e.fs.WatchDir(ctx, asUser(&pb.WatchDirRequest{Path: p}, ""))
		if err == nil {
			if s.Receive() {
				t.Fatalf("watch of %s started", p)
			}
			err = s.Err()
		}
		if code(err) != want {
			t.Fatalf("watch of %s: %v, want %v", p, err, want)
		}
	}
}

func testPolledWatcher(t *testing.T, e *env, ctx context.Context) {
	e.sh(t, "user", "mkdir -p /home/user/pw")
	cw, err := e.fs.CreateWatcher(ctx, asUser(&pb.CreateWatcherRequest{Path: "/home/user/pw"}, ""))
	if err != nil {
		t.Fatal(err)
	}
	id := cw.Msg.WatcherId
	e.sh(t, "user", "echo x > /home/user/pw/a && rm /home/user/pw/a")
	var seen []string
	for deadline := time.Now().Add(5 * time.Second); len(seen) < 3 && time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		res, err := e.fs.GetWatcherEvents(ctx, connect.NewRequest(&pb.GetWatcherEventsRequest{WatcherId: id}))
		if err != nil {
			t.Fatal(err)
		}
		for _, ev := range res.Msg.Events {
			seen = append(seen, ev.Type.String()+" "+ev.Name)
		}
	}
	if strings.Join(seen, ",") != "EVENT_TYPE_CREATE a,EVENT_TYPE_WRITE a,EVENT_TYPE_REMOVE a" {
		t.Fatalf("polled events %v", seen)
	}
	if _, err := e.fs.RemoveWatcher(ctx, connect.NewRequest(&pb.RemoveWatcherRequest{WatcherId: id})); err != nil {
		t.Fatal(err)
	}
	if _, err := e.fs.GetWatcherEvents(ctx, connect.NewRequest(&pb.GetWatcherEventsRequest{WatcherId: id})); code(err) != connect.CodeNotFound {
		t.Fatalf("a removed watcher: %v", err)
	}
}
