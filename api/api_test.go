package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api"
	"github.com/torpor-dev/torpor/api/wire"
	"github.com/torpor-dev/torpor/client"
	"github.com/torpor-dev/torpor/lifecycle"
	"github.com/torpor-dev/torpor/runtime/fake"
	"github.com/torpor-dev/torpor/store/sqlite"
)

type fixture struct {
	url      string
	admin    string // admin key of tenant "default"
	store    *sqlite.Store
	host     *fake.Host
	adminCl  *client.Client
	tenantCl *client.Client // key of tenant "acme"
	acmeKey  string
}

// newFixture starts a server; opts change its config (a rate limit, ...).
func newFixture(t testing.TB, opts ...func(*api.Config)) *fixture {
	t.Helper()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "torpor.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	now := time.Now().UTC()
	if err := st.PutTemplate(ctx, torpor.Template{Name: "base", RootFS: "/x", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	if err := st.CreateTenant(ctx, torpor.Tenant{Name: "default", CreatedAt: now}); err != nil {
		t.Fatal(err)
	}
	secret, k := torpor.NewAPIKey("default", true, now)
	if err := st.CreateAPIKey(ctx, k); err != nil {
		t.Fatal(err)
	}
	host := fake.NewHost()
	host.ExecFunc = func(ctx context.Context, id string, req torpor.ExecRequest) (torpor.ExecResult, error) {
		io.WriteString(req.Stdout, strings.Join(req.Cmd, " ")+"\n")
		io.WriteString(req.Stderr, "err\n")
		return torpor.ExecResult{ExitCode: 3}, nil
	}
	eng, err := lifecycle.New(lifecycle.Config{Store: st, Runtimes: []torpor.Runtime{fake.New(host)}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(eng.Close)
	if err := eng.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	cfg := api.Config{Engine: eng, Auth: st, Templates: st, Webhooks: st, WebhookGuard: webhookGuard}
	for _, o := range opts {
		o(&cfg)
	}
	srv := api.New(cfg)
	srv.SetReady()
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	f := &fixture{url: hs.URL, admin: secret, store: st, host: host}
	f.adminCl, _ = client.New(hs.URL, secret)
	kc, err := f.adminCl.CreateKey(ctx, wire.KeyRequest{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	f.tenantCl, _ = client.New(hs.URL, kc.Key)
	f.acmeKey = kc.Key
	return f
}

// raw sends a request and returns status and decoded error body.
func (f *fixture) raw(t testing.TB, method, path, key, contentType, body string) (int, wire.ErrorBody) {
	t.Helper()
	req, _ := http.NewRequest(method, f.url+path, strings.NewReader(body))
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var eb wire.ErrorBody
	data, _ := io.ReadAll(resp.Body)
	_ = json.Unmarshal(data, &eb)
	return resp.StatusCode, eb
}

var ctx = context.Background()

func TestLifecycleThroughTheClient(t *testing.T) {
	f := newFixture(t)
	cl := f.tenantCl
	sb, err := cl.Create(ctx, torpor.CreateRequest{Template: "base", Metadata: map[string]string{"team": "ml"}, Env: map[string]string{"SECRET": "hunter2"}})
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != torpor.StateRunning || sb.Tenant != "acme" || sb.PauseModes[0] != torpor.PauseFreeze {
		t.Fatalf("created %+v", sb)
	}
	steps := []struct {
		name string
		do   func() (*torpor.Sandbox, error)
		want torpor.State
	}{
		{"pause", func() (*torpor.Sandbox, error) { return cl.Pause(ctx, sb.ID, "") }, torpor.StatePaused},
		{"pause again", func() (*torpor.Sandbox, error) { return cl.Pause(ctx, sb.ID, torpor.PauseFreeze) }, torpor.StatePaused},
		{"connect", func() (*torpor.Sandbox, error) { return cl.Connect(ctx, sb.ID) }, torpor.StateRunning},
		{"hibernate", func() (*torpor.Sandbox, error) { return cl.Hibernate(ctx, sb.ID) }, torpor.StateHibernated},
		{"start", func() (*torpor.Sandbox, error) { return cl.Start(ctx, sb.ID) }, torpor.StateRunning},
		{"restart", func() (*torpor.Sandbox, error) { return cl.Restart(ctx, sb.ID) }, torpor.StateRunning},
		{"touch", func() (*torpor.Sandbox, error) { return cl.Touch(ctx, sb.ID) }, torpor.StateRunning},
		{"delete", func() (*torpor.Sandbox, error) { return cl.Delete(ctx, sb.ID) }, torpor.StateTerminated},
	}
	for _, s := range steps {
		got, err := s.do()
		if err != nil || got.State != s.want {
			t.Fatalf("%s: %v %v", s.name, got, err)
		}
	}
	if list, _ := cl.List(ctx, client.ListOptions{}); len(list) != 0 {
		t.Fatalf("terminated sandbox listed without --all")
	}
	if list, _ := cl.List(ctx, client.ListOptions{All: true, Metadata: map[string]string{"team": "ml"}}); len(list) != 1 {
		t.Fatalf("terminated sandbox missing with all")
	}
	if _, err := cl.Pause(ctx, sb.ID, ""); !client.IsGone(err) {
		t.Fatalf("pause of a terminated sandbox: %v", err)
	}
}

func TestSandboxJSONHidesEnvAndHandle(t *testing.T) {
	f := newFixture(t)
	sb, err := f.tenantCl.Create(ctx, torpor.CreateRequest{Template: "base", Env: map[string]string{"SECRET": "hunter2"}})
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest("GET", f.url+"/v1/sandboxes/"+sb.ID, nil)
	req.Header.Set("Authorization", "Bearer "+f.admin)
	kc, _ := f.adminCl.CreateKey(ctx, wire.KeyRequest{Tenant: "acme"})
	req.Header.Set("Authorization", "Bearer "+kc.Key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if bytes.Contains(body, []byte("hunter2")) || bytes.Contains(body, []byte("fake:")) {
		t.Fatalf("the sandbox object leaks env or handle: %s", body)
	}
	for _, field := range []string{"id", "template", "state", "state_since", "failure", "created_at", "last_activity_at", "resources", "metadata", "pause_modes"} {
		if !bytes.Contains(body, []byte(`"`+field+`"`)) {
			t.Errorf("the sandbox object lacks %q: %s", field, body)
		}
	}
}

func TestExecJSONAndStream(t *testing.T) {
	f := newFixture(t)
	off := false
	sb, _ := f.tenantCl.Create(ctx, torpor.CreateRequest{Template: "base",
		PolicyRequest: torpor.PolicyRequest{Lifecycle: &torpor.Lifecycle{AutoResume: &off}}})
	res, err := f.tenantCl.Exec(ctx, sb.ID, client.ExecRequest{Cmd: []string{"echo", "hi"}})
	if err != nil || res.ExitCode != 3 || res.Stdout != "echo hi\n" || res.Stderr != "err\n" {
		t.Fatalf("exec: %+v %v", res, err)
	}
	var out, errb bytes.Buffer
	sres, err := f.tenantCl.ExecStream(ctx, sb.ID, client.ExecRequest{Cmd: []string{"echo", "hi"}}, &out, &errb)
	if err != nil || sres.ExitCode != 3 || out.String() != "echo hi\n" || errb.String() != "err\n" {
		t.Fatalf("stream: %+v %v %q %q", sres, err, out.String(), errb.String())
	}
	f.tenantCl.Pause(ctx, sb.ID, "")
	if _, err := f.tenantCl.ExecStream(ctx, sb.ID, client.ExecRequest{Cmd: []string{"true"}}, nil, nil); !client.IsConflict(err) {
		t.Fatalf("streamed exec in a paused sandbox: %v", err)
	}
}

func TestAuthAndTenants(t *testing.T) {
	f := newFixture(t)
	sb, err := f.adminCl.Create(ctx, torpor.CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name, method, path, key string
		status                  int
		code                    torpor.ErrorCode
	}{
		{"no key", "GET", "/v1/sandboxes", "", 401, torpor.EUnauthenticated},
		{"wrong key", "GET", "/v1/sandboxes", "tpk_nope", 401, torpor.EUnauthenticated},
		{"other tenant's sandbox", "GET", "/v1/sandboxes/" + sb.ID, "acme", 404, torpor.ENotFound},
		{"other tenant's pause", "POST", "/v1/sandboxes/" + sb.ID + "/pause", "acme", 404, torpor.ENotFound},
		{"other tenant's delete", "DELETE", "/v1/sandboxes/" + sb.ID, "acme", 404, torpor.ENotFound},
		{"tenant creating keys", "POST", "/v1/keys", "acme", 403, torpor.EForbidden},
		{"tenant listing tenants", "GET", "/v1/tenants", "acme", 403, torpor.EForbidden},
		{"unknown endpoint", "GET", "/v1/nothing", "admin", 404, torpor.ENotFound},
	}
	acmeKey, _ := f.adminCl.CreateKey(ctx, wire.KeyRequest{Tenant: "acme"})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			key := map[string]string{"acme": acmeKey.Key, "admin": f.admin}[c.key]
			if key == "" {
				key = c.key
			}
			status, eb := f.raw(t, c.method, c.path, key, "", "")
			if status != c.status || eb.Error.Code != c.code {
				t.Fatalf("got %d %q, want %d %q", status, eb.Error.Code, c.status, c.code)
			}
		})
	}
	if got, _ := f.adminCl.Get(ctx, sb.ID); got.State != torpor.StateRunning {
		t.Fatal("another tenant's request changed the sandbox")
	}
	if list, _ := f.tenantCl.List(ctx, client.ListOptions{All: true}); len(list) != 0 {
		t.Fatalf("tenant acme lists %d sandboxes of another tenant", len(list))
	}
}

func TestBadInputIs4xxAndChangesNothing(t *testing.T) {
	f := newFixture(t)
	sb, _ := f.tenantCl.Create(ctx, torpor.CreateRequest{Template: "base"})
	acme, _ := f.adminCl.CreateKey(ctx, wire.KeyRequest{Tenant: "acme"})
	cases := []struct {
		name, method, path, ctype, body string
		status                          int
		param                           string
	}{
		{"malformed JSON", "POST", "/v1/sandboxes", "application/json", `{"template":`, 400, "body"},
		{"unknown field", "POST", "/v1/sandboxes", "application/json", `{"template":"base","cpu":2}`, 400, "cpu"},
		{"wrong type", "POST", "/v1/sandboxes", "application/json", `{"template":"base","resources":{"vcpus":"two"}}`, 400, "resources.vcpus"},
		{"wrong content type", "POST", "/v1/sandboxes", "text/plain", `{"template":"base"}`, 400, "Content-Type"},
		{"unknown template", "POST", "/v1/sandboxes", "application/json", `{"template":"nope"}`, 400, "template"},
		{"negative memory", "POST", "/v1/sandboxes", "application/json", `{"template":"base","resources":{"memory_mib":-5}}`, 400, "resources.memory_mib"},
		{"huge memory", "POST", "/v1/sandboxes", "application/json", `{"template":"base","resources":{"memory_mib":99999999999}}`, 400, "resources.memory_mib"},
		{"two values", "POST", "/v1/sandboxes", "application/json", `{"template":"base"}{}`, 400, "body"},
		{"duplicate key", "POST", "/v1/sandboxes", "application/json", `{"template":"base","template":"base"}`, 400, "template"},
		{"duplicate key in another case", "POST", "/v1/sandboxes", "application/json", `{"template":"base","Template":"base"}`, 400, "Template"},
		{"duplicate nested key", "POST", "/v1/sandboxes", "application/json", `{"template":"base","resources":{"vcpus":1,"vcpus":2}}`, 400, "resources.vcpus"},
		{"duplicate key in a map", "POST", "/v1/sandboxes", "application/json", `{"template":"base","metadata":{"k":"a","k":"b"}}`, 400, "metadata.k"},
		{"duplicate key in an array", "POST", "/v1/sandboxes", "application/json", `{"template":"base","hooks":[{"type":"script","path":"/bin/true","on":"resume","on":"pause"}]}`, 400, "hooks[0].on"},
		{"duplicate key on exec", "POST", "/v1/sandboxes/" + sb.ID + "/exec", "application/json", `{"cmd":["true"],"cmd":["false"]}`, 400, "cmd"},
		{"no body", "POST", "/v1/sandboxes", "application/json", ``, 400, "body"},
		{"bad pause mode", "POST", "/v1/sandboxes/" + sb.ID + "/pause", "application/json", `{"mode":"deep"}`, 400, "mode"},
		{"unknown pause mode", "POST", "/v1/sandboxes/" + sb.ID + "/pause", "application/json", `{"mode":"teleport"}`, 400, "mode"},
		{"exec without cmd", "POST", "/v1/sandboxes/" + sb.ID + "/exec", "application/json", `{"cmd":[]}`, 400, "cmd"},
		{"exec negative timeout", "POST", "/v1/sandboxes/" + sb.ID + "/exec", "application/json", `{"cmd":["true"],"timeout_seconds":-1}`, 400, "timeout_seconds"},
		{"unknown state filter", "GET", "/v1/sandboxes?state=sleepy", "", "", 400, "state"},
		{"bad all flag", "GET", "/v1/sandboxes?all=maybe", "", "", 400, "all"},
		{"bad cursor", "GET", "/v1/events?since=-4", "", "", 400, "since"},
		{"list limit 0", "GET", "/v1/sandboxes?limit=0", "", "", 400, "limit"},
		{"list limit past the most", "GET", "/v1/sandboxes?limit=1001", "", "", 400, "limit"},
		{"list limit not a number", "GET", "/v1/sandboxes?limit=ten", "", "", 400, "limit"},
		{"list limit empty", "GET", "/v1/sandboxes?limit=", "", "", 400, "limit"},
		{"list cursor not base64", "GET", "/v1/sandboxes?limit=2&after=!!!", "", "", 400, "after"},
		{"list cursor empty", "GET", "/v1/sandboxes?after=", "", "", 400, "after"},
		{"list cursor without an id", "GET", "/v1/sandboxes?after=MTo", "", "", 400, "after"},
		{"list cursor with a negative time", "GET", "/v1/sandboxes?after=LTE6c2Jf", "", "", 400, "after"},
		{"bad latest flag", "GET", "/v1/events?latest=maybe", "", "", 400, "latest"},
		{"bad metadata patch", "PATCH", "/v1/sandboxes/" + sb.ID, "application/json", `{"metadata":{"bad key!":"x"}}`, 400, "metadata"},
		{"body on touch", "POST", "/v1/sandboxes/" + sb.ID + "/touch", "application/json", `{"x":1}`, 400, "x"},
		{"missing id", "GET", "/v1/sandboxes/doesnotexist", "", "", 404, "id"},
		{"id with odd characters", "GET", "/v1/sandboxes/..%2Fetc", "", "", 404, "id"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			status, eb := f.raw(t, c.method, c.path, acme.Key, c.ctype, c.body)
			if status != c.status || eb.Error.Param != c.param || eb.Error.Message == "" {
				t.Fatalf("got %d %+v, want %d naming %q", status, eb.Error, c.status, c.param)
			}
		})
	}
	list, _ := f.tenantCl.List(ctx, client.ListOptions{All: true})
	if len(list) != 1 {
		t.Fatalf("bad requests created sandboxes: %d", len(list))
	}
	if got, _ := f.tenantCl.Get(ctx, sb.ID); got.State != torpor.StateRunning || got.Version != 0 && got.Version != sb.Version {
		t.Fatalf("bad requests changed the sandbox: %+v", got)
	}
}

func TestConflictNamesTheState(t *testing.T) {
	f := newFixture(t)
	sb, _ := f.tenantCl.Create(ctx, torpor.CreateRequest{Template: "base"})
	f.tenantCl.Hibernate(ctx, sb.ID)
	_, err := f.tenantCl.Pause(ctx, sb.ID, "")
	var te *torpor.Error
	if !client.IsConflict(err) || !errorsAs(err, &te) || te.State != torpor.StateHibernated {
		t.Fatalf("pause of a hibernated sandbox: %v", err)
	}
}

func errorsAs(err error, te **torpor.Error) bool {
	e, ok := err.(*torpor.Error)
	*te = e
	return ok
}

func TestHealthzAnswers503UntilReady(t *testing.T) {
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	eng, _ := lifecycle.New(lifecycle.Config{Store: st, Runtimes: []torpor.Runtime{fake.New(fake.NewHost())}})
	srv := api.New(api.Config{Engine: eng, Auth: st, Templates: st})
	rec := httptest.NewRecorder()
	srv.ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
	if rec.Code != 503 || rec.Header().Get("Retry-After") == "" {
		t.Fatalf("before ready: %d", rec.Code)
	}
	srv.SetReady()
	rec = httptest.NewRecorder()
	srv.ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
	if rec.Code != 200 {
		t.Fatalf("after ready: %d", rec.Code)
	}
}

// TestDocsListEveryRoute checks docs/api.md against the routes the server
// registers, both ways.
func TestDocsListEveryRoute(t *testing.T) {
	data, err := os.ReadFile("../docs/api.md")
	if err != nil {
		t.Fatal(err)
	}
	re := regexp.MustCompile("(?m)^\\| `(GET|POST|PUT|PATCH|DELETE) (/[^`]*)` \\|")
	documented := map[string]bool{}
	for _, m := range re.FindAllStringSubmatch(string(data), -1) {
		documented[m[1]+" "+m[2]] = true
	}
	served := map[string]bool{}
	for _, r := range api.Routes() {
		served[r] = true
		if !documented[r] {
			t.Errorf("%s is served but not in docs/api.md", r)
		}
	}
	var extra []string
	for r := range documented {
		if !served[r] {
			extra = append(extra, r)
		}
	}
	sort.Strings(extra)
	for _, r := range extra {
		t.Errorf("%s is in docs/api.md but not served", r)
	}
}

// FuzzCreateBody sends arbitrary bodies to POST /v1/sandboxes: the answer
// is never a 5xx, and a 4xx creates nothing.
func FuzzCreateBody(f *testing.F) {
	for _, s := range []string{
		`{"template":"base"}`,
		`{"template":"base","resources":{"vcpus":2,"memory_mib":256,"pids":100,"disk_mib":512}}`,
		`{"template":"base","env":{"A":"b"},"metadata":{"k":"v"},"runtime":{"setup":["true"],"entrypoint":["sleep","1"]}}`,
		`{"template":"base","resources":{"memory_mib":-1}}`,
		`{"template":"", "x": null}`,
		`[]`, `null`, `{"template":"base","runtime":{"entrypoint":[""]}}`,
		`{"template":"base","template":"base"}`, `{"template":"base","metadata":{"k":"a","k":"b"}}`,
	} {
		f.Add(s)
	}
	fx := newFixture(f)
	f.Fuzz(func(t *testing.T, body string) {
		before, _ := fx.tenantCl.List(ctx, client.ListOptions{All: true})
		status, eb := fx.raw(t, "POST", "/v1/sandboxes", fx.acmeKey, "application/json", body)
		if status >= 500 {
			t.Fatalf("status %d for %q: %+v", status, body, eb)
		}
		if status >= 400 {
			if eb.Error.Code == "" || eb.Error.Message == "" {
				t.Fatalf("error without code or message for %q", body)
			}
			after, _ := fx.tenantCl.List(ctx, client.ListOptions{All: true})
			if len(after) != len(before) {
				t.Fatalf("a refused create (%d) made a sandbox: %q", status, body)
			}
		}
	})
}

func TestPolicyThroughTheAPI(t *testing.T) {
	f := newFixture(t)
	body := `{"template":"base","timeout":600,"lifecycle":{"on_timeout":"pause","auto_resume":false},"lifecycle_policy":{"hibernate_after_paused_seconds":3600}}`
	status, eb := f.raw(t, "POST", "/v1/sandboxes", f.acmeKey, "application/json", body)
	if status != 201 {
		t.Fatalf("create with a policy: %d %+v", status, eb)
	}
	list, _ := f.tenantCl.List(ctx, client.ListOptions{})
	sb := list[0]
	p := sb.Policy()
	if p.IdleAction != torpor.ActionPause || p.IdleAfter != 10*time.Minute || p.HibernateAfterPaused != time.Hour || p.AutoResume {
		t.Fatalf("policy %+v", p)
	}
	if sb.PauseAt == nil || sb.HibernatesAt == nil || len(sb.UpcomingEvents) != 1 {
		t.Fatalf("schedule %+v", sb.Schedule)
	}
	// null turns a rule off; absent fields stay.
	status, eb = f.raw(t, "PATCH", "/v1/sandboxes/"+sb.ID, f.acmeKey, "application/json", `{"timeout":null}`)
	if status != 200 {
		t.Fatalf("patch: %d %+v", status, eb)
	}
	got, _ := f.tenantCl.Get(ctx, sb.ID)
	if got.Timeout.On() || got.PauseAt != nil || got.Policy().HibernateAfterPaused != time.Hour {
		t.Fatalf("after PATCH timeout=null: %+v %+v", got.Timeout, got.Policy())
	}
	for _, c := range []struct{ body, param string }{
		{`{"timeout":-1}`, "timeout"},
		{`{"timeout":"soon"}`, "timeout"},
		{`{"lifecycle_policy":{"pause_after_idle_seconds":99999999999}}`, "lifecycle_policy.pause_after_idle_seconds"},
		{`{"lifecycle":{"on_timeout":"pause"}}`, "lifecycle.on_timeout"},
		{`{"lifecycle_policy":{"nap_seconds":5}}`, "nap_seconds"},
	} {
		status, eb := f.raw(t, "PATCH", "/v1/sandboxes/"+sb.ID, f.acmeKey, "application/json", c.body)
		if status != 400 || eb.Error.Param != c.param {
			t.Errorf("PATCH %s: %d %+v, want 400 on %s", c.body, status, eb.Error, c.param)
		}
	}
	// With auto_resume off, an exec on a paused sandbox is 409 reason paused.
	f.tenantCl.Pause(ctx, sb.ID, "")
	status, eb = f.raw(t, "POST", "/v1/sandboxes/"+sb.ID+"/exec", f.acmeKey, "application/json", `{"cmd":["true"]}`)
	if status != 409 || eb.Error.Reason != "paused" || !strings.Contains(eb.Error.Message, "connect") {
		t.Fatalf("exec on paused with auto_resume off: %d %+v", status, eb.Error)
	}
}

// TestFollowEvents streams events as they happen and resumes from a cursor
// without missing or repeating one.
func TestFollowEvents(t *testing.T) {
	f := newFixture(t)
	got := make(chan torpor.Event, 100)
	fctx, cancel := context.WithCancel(ctx)
	defer cancel()
	go f.tenantCl.FollowEvents(fctx, "", 0, func(ev torpor.Event) error { got <- ev; return nil })
	sb, err := f.tenantCl.Create(ctx, torpor.CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	f.tenantCl.Pause(ctx, sb.ID, "")
	var seen []string
	var last int64
	for len(seen) < 3 {
		select {
		case ev := <-got:
			seen = append(seen, ev.Type)
			last = ev.Seq
		case <-time.After(5 * time.Second):
			t.Fatalf("events so far: %v", seen)
		}
	}
	if strings.Join(seen, ",") != "sandbox.created,sandbox.started,sandbox.paused" {
		t.Fatalf("events %v", seen)
	}
	// Another tenant's events never show; a follower from the cursor sees
	// only what came after.
	f.adminCl.Create(ctx, torpor.CreateRequest{Template: "base"})
	f.tenantCl.Start(ctx, sb.ID)
	got2 := make(chan torpor.Event, 100)
	go f.tenantCl.FollowEvents(fctx, sb.ID, last, func(ev torpor.Event) error { got2 <- ev; return nil })
	select {
	case ev := <-got2:
		if ev.Type != torpor.EventResumed || ev.Seq <= last || ev.SandboxID != sb.ID {
			t.Fatalf("resumed follower got %+v", ev)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the resumed follower got nothing")
	}
	select {
	case ev := <-got:
		if ev.Tenant != "acme" {
			t.Fatalf("another tenant's event leaked: %+v", ev)
		}
	case <-time.After(100 * time.Millisecond):
	}
	status, eb := f.raw(t, "GET", "/v1/sandboxes/nosuch/events", f.acmeKey, "", "")
	if status != 404 {
		t.Fatalf("events of an unknown sandbox: %d %+v", status, eb)
	}
}

func TestWebhooksAPI(t *testing.T) {
	f := newFixture(t)
	created, err := f.tenantCl.CreateWebhook(ctx, "https://hooks.example.com/torpor")
	if err != nil || !strings.HasPrefix(created.Secret, "whsec_") || created.Tenant != "acme" {
		t.Fatalf("create: %+v %v", created, err)
	}
	list, err := f.tenantCl.Webhooks(ctx)
	if err != nil || len(list) != 1 || list[0].ID != created.ID {
		t.Fatalf("list: %+v %v", list, err)
	}
	status, _ := f.raw(t, "GET", "/v1/webhooks", f.acmeKey, "", "")
	if status != 200 {
		t.Fatalf("list status %d", status)
	}
	if other, _ := f.adminCl.Webhooks(ctx); len(other) != 0 {
		t.Fatalf("another tenant sees %d webhooks", len(other))
	}
	if err := f.adminCl.DeleteWebhook(ctx, created.ID); !client.IsNotFound(err) {
		t.Fatalf("another tenant's delete: %v", err)
	}
	for _, bad := range []string{`{"url":"ftp://x"}`, `{"url":"http://169.254.169.254/latest"}`, `{"url":"https://user:pw@x.example"}`, `{"url":""}`} {
		if status, eb := f.raw(t, "POST", "/v1/webhooks", f.acmeKey, "application/json", bad); status != 400 || eb.Error.Param != "url" {
			t.Errorf("%s: %d %+v", bad, status, eb.Error)
		}
	}
	if err := f.tenantCl.DeleteWebhook(ctx, created.ID); err != nil {
		t.Fatal(err)
	}
	if list, _ := f.tenantCl.Webhooks(ctx); len(list) != 0 {
		t.Fatalf("after delete: %+v", list)
	}
}

func TestStartExecCallbacksAndWait(t *testing.T) {
	f := newFixture(t)
	sb, _ := f.tenantCl.Create(ctx, torpor.CreateRequest{Template: "base"})
	var mu sync.Mutex
	var out, errOut strings.Builder
	cmd := f.tenantCl.StartExec(ctx, sb.ID, client.ExecRequest{Cmd: []string{"echo", "hi"}}, client.ExecCallbacks{
		OnStdout: func(b []byte) { mu.Lock(); out.Write(b); mu.Unlock() },
		OnStderr: func(b []byte) { mu.Lock(); errOut.Write(b); mu.Unlock() },
	})
	res, err := cmd.Wait()
	if err != nil || res.ExitCode != 3 || out.String() != "echo hi\n" || errOut.String() != "err\n" {
		t.Fatalf("StartExec: %+v %v %q %q", res, err, out.String(), errOut.String())
	}
}

// GET /v1/pools answers any key; PUT /v1/pools/{template} is the admin's,
// checks its body and the template, and the size shows in the list.
func TestPoolsAPI(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	pools, err := f.tenantCl.Pools(ctx)
	if err != nil || len(pools) != 0 {
		t.Fatalf("pools of a fresh server: %v %v", pools, err)
	}
	var te *torpor.Error
	if _, err := f.tenantCl.SetPool(ctx, "base", 1); !errorsAs(err, &te) || te.Code != torpor.EForbidden {
		t.Fatalf("a tenant key sets a pool: %v", err)
	}
	if _, err := f.adminCl.SetPool(ctx, "nope", 1); !torpor.IsCode(err, torpor.ENotFound) {
		t.Fatalf("a pool of an unknown template: %v", err)
	}
	if _, err := f.adminCl.SetPool(ctx, "base", torpor.MaxPoolSize+1); !torpor.IsCode(err, torpor.EInvalid) {
		t.Fatalf("a pool too big: %v", err)
	}
	for _, body := range []string{`{}`, `{"size":-1}`, `{"size":"2"}`, `{"size":1,"x":1}`} {
		if code, _ := f.raw(t, "PUT", "/v1/pools/base", f.admin, "application/json", body); code != http.StatusBadRequest {
			t.Errorf("PUT %s: %d, want 400", body, code)
		}
	}
	st, err := f.adminCl.SetPool(ctx, "base", 1)
	if err != nil || st.Template != "base" || st.Size != 1 {
		t.Fatalf("SetPool: %+v %v", st, err)
	}
	pools, err = f.tenantCl.Pools(ctx)
	if err != nil || len(pools) != 1 || pools[0].Size != 1 {
		t.Fatalf("pools after a SetPool: %+v %v", pools, err)
	}
	if _, err := f.adminCl.SetPool(ctx, "base", 0); err != nil {
		t.Fatal(err)
	}
}
