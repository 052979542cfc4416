package envd_test

// Adversarial checks of envd and the code interpreter as the proxy serves
// them: tokens and signatures of one sandbox never open another's, and
// refusals wake nothing; extreme headers, oversized and compressed
// uploads; streams whose client leaves. The real engine and proxy over
// the fake runtime, so they run anywhere in a few seconds.

import (
	"bytes"
	"compress/gzip"
	"context"
	"fmt"
	"io"
	"mime/multipart"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/e2b/envd"
	pb "github.com/torpor-dev/torpor/e2b/envd/proto/filesystem"
	"github.com/torpor-dev/torpor/e2b/envd/proto/filesystem/filesystemconnect"
	"github.com/torpor-dev/torpor/e2b/envd/proto/process"
	"github.com/torpor-dev/torpor/e2b/envd/proto/process/processconnect"
	"github.com/torpor-dev/torpor/e2b/interp"
	"github.com/torpor-dev/torpor/lifecycle"
	"github.com/torpor-dev/torpor/proxy"
	"github.com/torpor-dev/torpor/runtime/fake"
	"github.com/torpor-dev/torpor/store/sqlite"
)

// fakeEnv is the daemon's E2B sandbox plane in miniature: an engine over
// the fake runtime (files in a host directory per sandbox, toy
// processes), and the proxy serving envd and the code interpreter.
type fakeEnv struct {
	eng   *lifecycle.Engine
	host  *fake.Host
	proxy string // http://addr
}

func newFakeEnv(t *testing.T, cfg envd.Config) *fakeEnv {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	st, err := sqlite.Open(ctx, filepath.Join(dir, "torpor.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	if err := st.PutTemplate(ctx, torpor.Template{Name: "base", RootFS: "/x", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	host := fake.NewHost()
	host.FilesDir = filepath.Join(dir, "files")
	eng, err := lifecycle.New(lifecycle.Config{Store: st, Runtimes: []torpor.Runtime{fake.New(host)},
		Capacity: lifecycle.Capacity{VCPUs: 8, MemoryMiB: 8192}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(eng.Close)
	if err := eng.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	cfg.Engine = eng
	prox := proxy.New(proxy.Config{Engine: eng, Domain: "sb.test", HoldLimit: 5 * time.Second,
		Services: map[int]proxy.Service{envd.Port: envd.New(cfg), interp.Port: interp.New(interp.Config{Engine: eng})}})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go prox.Serve(ln)
	t.Cleanup(func() { prox.Close() })
	return &fakeEnv{eng: eng, host: host, proxy: "http://" + ln.Addr().String()}
}

// sandbox creates a running sandbox of tenant (auto_resume as given)
// whose root has E2B's user.
func (e *fakeEnv) sandbox(t *testing.T, tenant string, autoResume bool) *torpor.Sandbox {
	t.Helper()
	sb, err := e.eng.Create(context.Background(), tenant, torpor.CreateRequest{Template: "base",
		PolicyRequest: torpor.PolicyRequest{Lifecycle: &torpor.Lifecycle{AutoResume: &autoResume}}})
	if err != nil || sb.State != torpor.StateRunning {
		t.Fatalf("create: %v %+v", err, sb)
	}
	root := filepath.Join(e.host.FilesDir, sb.ID)
	for name, data := range map[string]string{
		"etc/passwd": "root:x:0:0::/root:/bin/sh\nuser:x:1000:1000::/home/user:/bin/sh\n",
		"etc/group":  "root:x:0:\nuser:x:1000:\n",
	} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(root, name)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, name), []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(filepath.Join(root, "home/user"), 0o755); err != nil {
		t.Fatal(err)
	}
	return sb
}

// route sends a request to a port of sandbox id as E2B_SANDBOX_URL does, with an
// access token (none when empty).
type route struct {
	id, token string
	port      int
}

func (rt route) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set(proxy.HeaderE2BSandboxID, rt.id)
	r.Header.Set(proxy.HeaderE2BSandboxPort, fmt.Sprint(rt.port))
	if rt.token != "" {
		r.Header.Set(envd.HeaderAccessToken, rt.token)
	}
	return http.DefaultTransport.RoundTrip(r)
}

func (e *fakeEnv) client(id, token string, port int) *http.Client {
	return &http.Client{Transport: route{id: id, token: token, port: port}}
}

func (e *fakeEnv) state(t *testing.T, tenant, id string) torpor.State {
	t.Helper()
	sb, err := e.eng.Get(context.Background(), tenant, id)
	if err != nil {
		t.Fatal(err)
	}
	return sb.State
}

func status(t *testing.T, c *http.Client, method, url, ctype string, body io.Reader) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, url, body)
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, url, err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(data)
}

// TestOneSandboxsTokenOpensNoOther: sandbox A's access token, and URLs
// signed with it, reach neither envd nor the code interpreter of sandbox
// B (another tenant's, paused with auto_resume); the refusals leave B
// asleep and its files untouched. B's own token wakes it.
func TestOneSandboxsTokenOpensNoOther(t *testing.T) {
	e := newFakeEnv(t, envd.Config{})
	ctx := context.Background()
	a := e.sandbox(t, "acme", true)
	b := e.sandbox(t, "other", true)
	if err := os.WriteFile(filepath.Join(e.host.FilesDir, b.ID, "home/user/secret"), []byte("b's"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := e.eng.Pause(ctx, "other", b.ID, ""); err != nil {
		t.Fatal(err)
	}
	signedByA := func(path, op string) string {
		return "/files?path=" + path + "&signature=" + url.QueryEscape(sign(path, op, "", a.TrafficToken, 0))
	}
	for _, c := range []struct {
		name         string
		token        string
		port         int
		method, path string
		ctype, body  string
		want         int
	}{
		{"envd health, A's token", a.TrafficToken, envd.Port, "GET", "/health", "", "", 403},
		{"envd health, no token", "", envd.Port, "GET", "/health", "", "", 401},
		{"envd read, A's token", a.TrafficToken, envd.Port, "GET", "/files?path=/home/user/secret", "", "", 403},
		{"envd read signed by A", "", envd.Port, "GET", signedByA("/home/user/secret", "read"), "", "", 401},
		{"envd write signed by A", "", envd.Port, "POST", signedByA("/home/user/x", "write"), "application/octet-stream", "pwned", 401},
		{"envd read signed by A for a write", "", envd.Port, "GET", signedByA("/home/user/secret", "write"), "", "", 401},
		{"envd Connect ListDir, A's token", a.TrafficToken, envd.Port, "POST", "/filesystem.Filesystem/ListDir", "application/json", `{"path":"/"}`, 403},
		{"envd Connect Start, A's token", a.TrafficToken, envd.Port, "POST", "/process.Process/List", "application/json", `{}`, 403},
		{"interp contexts, A's token", a.TrafficToken, interp.Port, "GET", "/contexts", "", "", 403},
		{"interp execute, A's token", a.TrafficToken, interp.Port, "POST", "/execute", "application/json", `{"code":"1"}`, 403},
		{"interp execute, no token", "", interp.Port, "POST", "/execute", "application/json", `{"code":"1"}`, 401},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, body := status(t, e.client(b.ID, c.token, c.port), c.method, e.proxy+c.path, c.ctype, strings.NewReader(c.body))
			if got != c.want || !strings.Contains(body, fmt.Sprintf(`"code":%d`, c.want)) {
				t.Fatalf("got %d %s, want %d in E2B's shape", got, body, c.want)
			}
			if s := e.state(t, "other", b.ID); s != torpor.StatePaused {
				t.Fatalf("a refused request changed sandbox B: %s", s)
			}
		})
	}
	if _, err := os.Stat(filepath.Join(e.host.FilesDir, b.ID, "home/user/x")); !os.IsNotExist(err) {
		t.Fatalf("a refused upload wrote into B: %v", err)
	}
	// B's own token: B wakes and serves.
	if got, body := status(t, e.client(b.ID, b.TrafficToken, envd.Port), "GET", e.proxy+"/files?path=/home/user/secret", "", nil); got != 200 || body != "b's" {
		t.Fatalf("B's own token: %d %q", got, body)
	}
	if s := e.state(t, "other", b.ID); s != torpor.StateRunning {
		t.Fatalf("B's own request did not wake it: %s", s)
	}
}

// TestExtremeKeepaliveIntervals: whatever Keepalive-Ping-Interval says
// (zero, negative, not a number, beyond what a duration holds), a watch
// and a process stream start and send their first event; none panics.
func TestExtremeKeepaliveIntervals(t *testing.T) {
	e := newFakeEnv(t, envd.Config{})
	sb := e.sandbox(t, "acme", true)
	hc := e.client(sb.ID, sb.TrafficToken, envd.Port)
	fsc := filesystemconnect.NewFilesystemClient(hc, e.proxy, connect.WithProtoJSON())
	pc := processconnect.NewProcessClient(hc, e.proxy, connect.WithProtoJSON())
	for _, v := range []string{"0", "-5", "abc", "9999999999", "10000000000", "9223372036854775807", "99999999999999999999"} {
		t.Run(v, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			req := connect.NewRequest(&pb.WatchDirRequest{Path: "/home/user"})
			req.Header().Set("Keepalive-Ping-Interval", v)
			w, err := fsc.WatchDir(ctx, req)
			if err != nil || !w.Receive() || w.Msg().GetStart() == nil {
				t.Fatalf("watch with Keepalive-Ping-Interval %s: %v %v", v, err, w.Err())
			}
			name := "f" + fmt.Sprint(time.Now().UnixNano())
			if err := os.WriteFile(filepath.Join(e.host.FilesDir, sb.ID, "home/user", name), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			if !w.Receive() || w.Msg().GetFilesystem().GetName() != name {
				t.Fatalf("watch with Keepalive-Ping-Interval %s: no event for %s: %v %v", v, name, w.Msg(), w.Err())
			}
			w.Close()
			preq := connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "cat"}})
			preq.Header().Set("Keepalive-Ping-Interval", v)
			s, err := pc.Start(ctx, preq)
			if err != nil || !s.Receive() || s.Msg().GetEvent().GetStart() == nil {
				t.Fatalf("start with Keepalive-Ping-Interval %s: %v %v", v, err, s.Err())
			}
			if !s.Receive() || s.Msg().GetEvent().GetData() == nil {
				t.Fatalf("start with Keepalive-Ping-Interval %s: no output: %v %v", v, s.Msg(), s.Err())
			}
			s.Close()
		})
	}
}

// followers counts the goroutines following a process or watching a
// directory for a stream.
func followers() int {
	buf := make([]byte, 1<<20)
	n := runtime.Stack(buf, true)
	st := string(buf[:n])
	return strings.Count(st, "envd.processService.follow(") + strings.Count(st, "envd.(*fsService).WatchDir(")
}

// settledFollowers waits (up to 10 s) for the streams of earlier tests to
// end on the server, and returns how many are left.
func settledFollowers() int {
	for deadline := time.Now().Add(10 * time.Second); followers() != 0 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
	}
	return followers()
}

func awaitFollowers(t *testing.T, want int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for followers() != want {
		if time.Now().After(deadline) {
			buf := make([]byte, 1<<20)
			n := runtime.Stack(buf, true)
			for _, g := range strings.Split(string(buf[:n]), "\n\n") {
				if strings.Contains(g, "envd.processService.follow(") || strings.Contains(g, "envd.(*fsService).WatchDir(") {
					t.Log(g)
					break
				}
			}
			t.Fatalf("%d stream goroutines, want %d", followers(), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestStreamsEndWithTheirClients: a Start stream whose client leaves ends
// on the server, and its process keeps running (a background command);
// many streams on a sandbox that then pauses wait without end, and all
// end when their clients leave, and when the sandbox is killed.
func TestStreamsEndWithTheirClients(t *testing.T) {
	e := newFakeEnv(t, envd.Config{})
	sb := e.sandbox(t, "acme", true)
	hc := e.client(sb.ID, sb.TrafficToken, envd.Port)
	pc := processconnect.NewProcessClient(hc, e.proxy, connect.WithProtoJSON())
	fsc := filesystemconnect.NewFilesystemClient(hc, e.proxy, connect.WithProtoJSON())
	base := settledFollowers()

	ctx, cancel := context.WithCancel(context.Background())
	s, err := pc.Start(ctx, connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "sleep", Args: []string{"1000"}}}))
	if err != nil || !s.Receive() {
		t.Fatalf("start: %v %v", err, s.Err())
	}
	pid := s.Msg().GetEvent().GetStart().GetPid()
	awaitFollowers(t, base+1)
	cancel()
	awaitFollowers(t, base)
	list, err := pc.List(context.Background(), connect.NewRequest(&process.ListRequest{}))
	if err != nil || len(list.Msg.GetProcesses()) != 1 || list.Msg.GetProcesses()[0].GetPid() != pid {
		t.Fatalf("the process did not outlive its stream: %v %v", list, err)
	}

	// Many streams, then a pause: they wait; the clients leave: they end.
	open := func(ctx context.Context, n int, watches bool) {
		t.Helper()
		for i := range n {
			if i%2 == 0 || !watches {
				req := connect.NewRequest(&process.ConnectRequest{Process: &process.ProcessSelector{Selector: &process.ProcessSelector_Pid{Pid: pid}}})
				req.Header().Set("Keepalive-Ping-Interval", "1")
				c, err := pc.Connect(ctx, req)
				if err != nil || !c.Receive() {
					t.Fatalf("connect: %v %v", err, c.Err())
				}
			} else {
				w, err := fsc.WatchDir(ctx, connect.NewRequest(&pb.WatchDirRequest{Path: "/home/user", Recursive: true}))
				if err != nil || !w.Receive() {
					t.Fatalf("watch: %v %v", err, w.Err())
				}
			}
		}
		awaitFollowers(t, base+n)
	}
	const n = 20
	ctx, cancel = context.WithCancel(context.Background())
	open(ctx, n, true)
	if _, err := e.eng.Pause(context.Background(), "acme", sb.ID, ""); err != nil {
		t.Fatal(err)
	}
	time.Sleep(100 * time.Millisecond)
	if got := followers(); got != base+n {
		t.Fatalf("a pause ended streams: %d of %d left", got-base, n)
	}
	if s := e.state(t, "acme", sb.ID); s != torpor.StatePaused {
		t.Fatalf("open streams woke the sandbox: %s", s)
	}
	cancel()
	awaitFollowers(t, base)

	// Process streams on a sandbox that is killed end too (within a
	// keep-alive; a watch ends when the runtime unmounts the sandbox's
	// root, which the fake does not: TestFilesystem checks that on runc).
	if _, err := e.eng.Start(context.Background(), "acme", sb.ID); err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithCancel(context.Background())
	defer cancel()
	open(ctx, n, false)
	if _, err := e.eng.Delete(context.Background(), "acme", sb.ID); err != nil {
		t.Fatal(err)
	}
	awaitFollowers(t, base)
}

// TestUploadLimit: with a limit on uploads (the daemon's max_upload_mib),
// POST /files refuses a body over it, raw, multipart or gzip-compressed
// (a small body that inflates past it), with a 4xx, and leaves no file;
// one within it is written.
func TestUploadLimit(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (uploads are given to the sandbox's user)")
	}
	const limit = 1 << 20
	e := newFakeEnv(t, envd.Config{MaxUploadBytes: limit})
	sb := e.sandbox(t, "acme", true)
	hc := e.client(sb.ID, sb.TrafficToken, envd.Port)
	big := bytes.Repeat([]byte{'z'}, 2*limit)
	gz := func(data []byte) *bytes.Buffer {
		var b bytes.Buffer
		zw := gzip.NewWriter(&b)
		zw.Write(data)
		zw.Close()
		return &b
	}
	multi := func(data []byte) (string, *bytes.Buffer) {
		var b bytes.Buffer
		mw := multipart.NewWriter(&b)
		fw, _ := mw.CreateFormFile("file", "/home/user/multi")
		fw.Write(data)
		mw.Close()
		return mw.FormDataContentType(), &b
	}
	post := func(path, ctype, enc string, body io.Reader, chunked bool) (int, string) {
		t.Helper()
		if chunked {
			body = io.MultiReader(body) // no length: sent chunked
		}
		req, _ := http.NewRequest("POST", e.proxy+"/files?path="+path, body)
		req.Header.Set("Content-Type", ctype)
		if enc != "" {
			req.Header.Set("Content-Encoding", enc)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatalf("post %s: %v", path, err)
		}
		defer resp.Body.Close()
		data, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(data)
	}
	mctype, mbody := multi(big)
	for _, c := range []struct {
		name, path, ctype, enc string
		body                   io.Reader
		chunked                bool
	}{
		{"raw", "/home/user/raw", "application/octet-stream", "", bytes.NewReader(big), false},
		{"raw chunked", "/home/user/raw", "application/octet-stream", "", bytes.NewReader(big), true},
		{"gzip bomb", "/home/user/raw", "application/octet-stream", "gzip", gz(big), false},
		{"multipart", "", mctype, "", mbody, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, body := post(c.path, c.ctype, c.enc, c.body, c.chunked)
			if got != http.StatusRequestEntityTooLarge || !strings.Contains(body, `"code":413`) {
				t.Fatalf("%d %s: want 413 in envd's shape", got, body)
			}
			for _, p := range []string{"raw", "multi"} {
				if _, err := os.Stat(filepath.Join(e.host.FilesDir, sb.ID, "home/user", p)); !os.IsNotExist(err) {
					t.Fatalf("a refused upload left %s: %v", p, err)
				}
			}
		})
	}
	small := bytes.Repeat([]byte{'a'}, limit/2)
	if got, body := post("/home/user/ok", "application/octet-stream", "gzip", gz(small), false); got != 200 {
		t.Fatalf("an upload within the limit: %d %s", got, body)
	}
	if data, _ := os.ReadFile(filepath.Join(e.host.FilesDir, sb.ID, "home/user/ok")); !bytes.Equal(data, small) {
		t.Fatalf("wrote %d bytes, want %d", len(data), len(small))
	}
}

// TestConnectTimeoutZeroIsNoLimit: Connect-Timeout-Ms 0 is no deadline
// (as the process calls read it), not one already past: a unary call
// answers and a process starts and runs.
func TestConnectTimeoutZeroIsNoLimit(t *testing.T) {
	e := newFakeEnv(t, envd.Config{})
	sb := e.sandbox(t, "acme", true)
	c := e.client(sb.ID, sb.TrafficToken, envd.Port)
	req, _ := http.NewRequest("POST", e.proxy+"/filesystem.Filesystem/Stat", strings.NewReader(`{"path":"/"}`))
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Connect-Timeout-Ms", "0")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("Stat with Connect-Timeout-Ms 0: %d %s", resp.StatusCode, body)
	}
	preq := connect.NewRequest(&process.StartRequest{Process: &process.ProcessConfig{Cmd: "cat"}})
	preq.Header().Set("Connect-Timeout-Ms", "0")
	s, err := processconnect.NewProcessClient(c, e.proxy, connect.WithProtoJSON()).Start(context.Background(), preq)
	if err != nil || !s.Receive() || s.Msg().GetEvent().GetStart() == nil || !s.Receive() || s.Msg().GetEvent().GetData() == nil {
		t.Fatalf("Start with Connect-Timeout-Ms 0: %v %v %v", err, s.Msg(), s.Err())
	}
	s.Close()
}
