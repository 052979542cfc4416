package e2b_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/clocktest"
	"github.com/torpor-dev/torpor/e2b"
	"github.com/torpor-dev/torpor/e2b/envd"
	"github.com/torpor-dev/torpor/lifecycle"
	"github.com/torpor-dev/torpor/runtime/fake"
	"github.com/torpor-dev/torpor/store/sqlite"
)

var ctx = context.Background()

// names maps E2B template names as package e2b/templates does.
type names struct{ unavailable bool }

var e2bNames = map[string]string{"base": "e2b-base", "code-interpreter-v1": "e2b-code-interpreter"}

func (n names) Resolve(_ context.Context, name string) (string, error) {
	if n.unavailable {
		return "", &torpor.Error{Code: torpor.EUnavailable, Message: "template base is being built", RetryAfter: 5 * time.Second}
	}
	if t, ok := e2bNames[name]; ok {
		return t, nil
	}
	return "", torpor.Invalid("templateID", "no template %q", name)
}

func (names) E2BName(tmpl string) (string, bool) {
	for k, v := range e2bNames {
		if v == tmpl {
			return k, true
		}
	}
	return "", false
}

type fixture struct {
	t       testing.TB
	url     string
	store   *sqlite.Store
	host    *fake.Host
	clock   *clocktest.Clock
	eng     *lifecycle.Engine
	acme    string // key of tenant acme
	other   string // key of tenant other
	tmpls   *names
	created int
}

func newFixture(t testing.TB, opts ...func(*lifecycle.Config)) *fixture {
	t.Helper()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "torpor.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	now := time.Now().UTC()
	for _, name := range []string{"e2b-base", "e2b-code-interpreter", "plain"} {
		if err := st.PutTemplate(ctx, torpor.Template{Name: name, RootFS: "/x", CreatedAt: now}); err != nil {
			t.Fatal(err)
		}
	}
	f := &fixture{t: t, store: st, host: fake.NewHost(), clock: clocktest.New(time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)), tmpls: &names{}}
	for _, tenant := range []string{"acme", "other"} {
		if err := st.CreateTenant(ctx, torpor.Tenant{Name: tenant, CreatedAt: now}); err != nil {
			t.Fatal(err)
		}
		secret, k := torpor.NewAPIKey(tenant, false, now)
		if err := st.CreateAPIKey(ctx, k); err != nil {
			t.Fatal(err)
		}
		if tenant == "acme" {
			f.acme = secret
		} else {
			f.other = secret
		}
	}
	cfg := lifecycle.Config{Store: st, Runtimes: []torpor.Runtime{fake.New(f.host)}, Clock: f.clock}
	for _, o := range opts {
		o(&cfg)
	}
	f.eng, err = lifecycle.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.eng.Close)
	if err := f.eng.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	api := e2b.New(e2b.Config{Engine: f.eng, Auth: st, TemplateStore: st, Templates: f.tmpls, Domain: "sb.example.test"})
	hs := httptest.NewServer(api)
	t.Cleanup(hs.Close)
	f.url = hs.URL
	return f
}

// reply is an answer: status, headers and body.
type reply struct {
	status int
	header http.Header
	body   []byte
}

func (r reply) decode(t testing.TB, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("answer %d %s: %v", r.status, r.body, err)
	}
}

// errBody checks that the answer is E2B's error shape with its status as
// code and returns it.
func (r reply) errBody(t testing.TB) map[string]any {
	t.Helper()
	var m map[string]any
	r.decode(t, &m)
	if code, _ := m["code"].(float64); int(code) != r.status {
		t.Fatalf("error body %s: code is not the status %d", r.body, r.status)
	}
	if msg, _ := m["message"].(string); msg == "" {
		t.Fatalf("error body %s has no message", r.body)
	}
	return m
}

func (f *fixture) do(method, path, key, body string) reply {
	f.t.Helper()
	req, _ := http.NewRequest(method, f.url+path, strings.NewReader(body))
	if key != "" {
		req.Header.Set("X-API-KEY", key)
	}
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: data}
}

type created struct {
	SandboxID          string  `json:"sandboxID"`
	TemplateID         string  `json:"templateID"`
	Alias              string  `json:"alias"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken"`
	TrafficAccessToken string  `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

type detail struct {
	SandboxID           string            `json:"sandboxID"`
	TemplateID          string            `json:"templateID"`
	Alias               string            `json:"alias"`
	StartedAt           time.Time         `json:"startedAt"`
	EndAt               time.Time         `json:"endAt"`
	State               string            `json:"state"`
	CPUCount            int               `json:"cpuCount"`
	MemoryMB            int               `json:"memoryMB"`
	DiskSizeMB          int               `json:"diskSizeMB"`
	EnvdVersion         string            `json:"envdVersion"`
	EnvdAccessToken     string            `json:"envdAccessToken"`
	Metadata            map[string]string `json:"metadata"`
	AllowInternetAccess bool              `json:"allowInternetAccess"`
	Lifecycle           struct {
		AutoResume bool   `json:"autoResume"`
		OnTimeout  string `json:"onTimeout"`
	} `json:"lifecycle"`
}

// create makes a sandbox through POST /v2/sandboxes; the clock moves a
// second after, so sandboxes have distinct starts.
func (f *fixture) create(body string) created {
	f.t.Helper()
	r := f.do("POST", "/v2/sandboxes", f.acme, body)
	if r.status != http.StatusCreated {
		f.t.Fatalf("create %s: %d %s", body, r.status, r.body)
	}
	var c created
	r.decode(f.t, &c)
	f.clock.Advance(time.Second)
	return c
}

func (f *fixture) info(id string) detail {
	f.t.Helper()
	r := f.do("GET", "/sandboxes/"+id, f.acme, "")
	if r.status != http.StatusOK {
		f.t.Fatalf("get %s: %d %s", id, r.status, r.body)
	}
	var d detail
	r.decode(f.t, &d)
	return d
}

// settle waits for the idle engine to bring a sandbox to an E2B state.
func (f *fixture) settle(id, want string) detail {
	f.t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		d := f.info(id)
		sb, _ := f.eng.Get(ctx, "acme", id)
		if d.State == want && !sb.State.Transitional() {
			return d
		}
		if time.Now().After(deadline) {
			f.t.Fatalf("sandbox %s is %s (%s), want %s", id, d.State, sb.State, want)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestCreateAnswersWhatTheSDKReads(t *testing.T) {
	f := newFixture(t)
	start := f.clock.Now()
	c := f.create(`{"templateID":"base","timeout":120,"metadata":{"user":"ada"},"envVars":{"GREETING":"hi"},"secure":true}`)
	sb, err := f.eng.Get(ctx, "acme", c.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	if c.TemplateID != "e2b-base" || c.Alias != "base" || c.EnvdVersion != envd.Version || c.ClientID == "" ||
		c.EnvdAccessToken != sb.TrafficToken || c.TrafficAccessToken != sb.TrafficToken || c.Domain == nil || *c.Domain != "sb.example.test" {
		t.Fatalf("create answer %+v (traffic token %s)", c, sb.TrafficToken)
	}
	if f.host.Spec(c.SandboxID).Env["GREETING"] != "hi" {
		t.Fatalf("envVars did not reach the sandbox: %v", f.host.Spec(c.SandboxID).Env)
	}
	d := f.info(c.SandboxID)
	if d.SandboxID != c.SandboxID || d.TemplateID != "e2b-base" || d.Alias != "base" || d.State != "running" ||
		!d.StartedAt.Equal(start) || !d.EndAt.Equal(start.Add(120*time.Second)) || d.CPUCount != 1 || d.MemoryMB != 512 ||
		d.DiskSizeMB != 2048 || d.EnvdVersion != envd.Version || d.EnvdAccessToken != sb.TrafficToken ||
		d.Metadata["user"] != "ada" || d.Lifecycle.OnTimeout != "kill" || d.Lifecycle.AutoResume {
		t.Fatalf("detail %+v", d)
	}
	// The same sandbox on the native side: an end time, no idle rule.
	if sb.EndAt == nil || sb.OnEnd != torpor.ActionKill || sb.EndAfterSeconds != 120 || sb.Policy().IdleAction != torpor.ActionNone || sb.Policy().AutoResume {
		t.Fatalf("native view: end %v %q %d, policy %+v", sb.EndAt, sb.OnEnd, sb.EndAfterSeconds, sb.Policy())
	}
}

func TestCreateDefaults(t *testing.T) {
	cases := []struct {
		path, body string
		end        time.Duration
		onTimeout  string
		autoResume bool
		onEnd      string
	}{
		{"/v2/sandboxes", `{"templateID":"base"}`, 300 * time.Second, "kill", false, torpor.ActionKill},
		{"/sandboxes", `{"templateID":"base"}`, 15 * time.Second, "kill", false, torpor.ActionKill},
		{"/v2/sandboxes", `{"templateID":"base","autoPause":true,"autoResume":{"enabled":true}}`, 300 * time.Second, "pause", true, torpor.ActionPause},
		{"/v2/sandboxes", `{"templateID":"base","lifecycle":{"onTimeout":"pause","autoResume":true}}`, 300 * time.Second, "pause", true, torpor.ActionPause},
		{"/v2/sandboxes", `{"templateID":"base","timeout":60,"lifecycle":{"on_timeout":"pause","auto_resume":true}}`, time.Minute, "pause", true, torpor.ActionPause},
		{"/v2/sandboxes", `{"templateID":"base","autoPause":true,"autoPauseMemory":false}`, 300 * time.Second, "pause", false, torpor.ActionHibernate},
		{"/v2/sandboxes", `{"templateID":"code-interpreter-v1","timeout":3600,"allow_internet_access":false}`, time.Hour, "kill", false, torpor.ActionKill},
	}
	f := newFixture(t)
	for _, c := range cases {
		now := f.clock.Now()
		r := f.do("POST", c.path, f.acme, c.body)
		if r.status != http.StatusCreated {
			t.Fatalf("%s %s: %d %s", c.path, c.body, r.status, r.body)
		}
		var cr created
		r.decode(t, &cr)
		d := f.info(cr.SandboxID)
		sb, _ := f.eng.Get(ctx, "acme", cr.SandboxID)
		if !d.EndAt.Equal(now.Add(c.end)) || d.Lifecycle.OnTimeout != c.onTimeout || d.Lifecycle.AutoResume != c.autoResume || sb.OnEnd != c.onEnd {
			t.Errorf("%s %s: end %v (want +%v), lifecycle %+v, on_end %q", c.path, c.body, d.EndAt, c.end, d.Lifecycle, sb.OnEnd)
		}
	}
}

func TestCreateValidation(t *testing.T) {
	f := newFixture(t)
	cases := []struct {
		name, body string
		status     int
		mention    string
	}{
		{"no body", ``, 400, "templateID"},
		{"not JSON", `{"templateID":`, 400, "JSON"},
		{"an array", `[]`, 400, "object"},
		{"duplicate templateID", `{"templateID":"base","templateID":"base"}`, 400, "templateID"},
		{"duplicate nested key", `{"templateID":"base","metadata":{"k":"a","k":"b"}}`, 400, "metadata.k"},
		{"duplicate key nobody defines", `{"templateID":"base","x":1,"x":2}`, 400, "x"},
		{"no templateID", `{"timeout":30}`, 400, "templateID"},
		{"empty templateID", `{"templateID":""}`, 400, "templateID"},
		{"templateID a number", `{"templateID":7}`, 400, "templateID"},
		{"unknown template", `{"templateID":"nope"}`, 400, "nope"},
		{"timeout a string", `{"templateID":"base","timeout":"30"}`, 400, "timeout"},
		{"timeout a fraction", `{"templateID":"base","timeout":1.5}`, 400, "timeout"},
		{"negative timeout", `{"templateID":"base","timeout":-1}`, 400, "timeout"},
		{"zero timeout", `{"templateID":"base","timeout":0}`, 400, "timeout"},
		{"timeout past a year", `{"templateID":"base","timeout":40000000}`, 400, "timeout"},
		{"timeout overflows", `{"templateID":"base","timeout":1e40}`, 400, "timeout"},
		{"metadata value a number", `{"templateID":"base","metadata":{"a":1}}`, 400, "metadata"},
		{"metadata bad key", `{"templateID":"base","metadata":{"a b":"c"}}`, 400, "metadata"},
		{"envVars bad name", `{"templateID":"base","envVars":{"1X":"c"}}`, 400, "envVars"},
		{"envVars not an object", `{"templateID":"base","envVars":["A=b"]}`, 400, "envVars"},
		{"autoPause a string", `{"templateID":"base","autoPause":"yes"}`, 400, "autoPause"},
		{"autoResume without enabled", `{"templateID":"base","autoPause":true,"autoResume":{}}`, 400, "autoResume.enabled"},
		{"autoResume with kill", `{"templateID":"base","autoResume":{"enabled":true}}`, 400, "autoResume"},
		{"autoResume without memory", `{"templateID":"base","autoPause":true,"autoPauseMemory":false,"autoResume":{"enabled":true}}`, 400, "autoResume"},
		{"autoPauseMemory with kill", `{"templateID":"base","autoPauseMemory":true}`, 400, "autoPauseMemory"},
		{"unknown onTimeout", `{"templateID":"base","lifecycle":{"onTimeout":"explode"}}`, 400, "onTimeout"},
		{"contradicting forms", `{"templateID":"base","autoPause":false,"lifecycle":{"onTimeout":"pause"}}`, 400, "onTimeout"},
		{"network rules", `{"templateID":"base","network":{"denyOut":["0.0.0.0/0"]}}`, 400, "network"},
		{"mcp", `{"templateID":"base","mcp":{"x":{}}}`, 400, "mcp"},
		{"volume mounts of no volume", `{"templateID":"base","volumeMounts":[{"name":"v","path":"/data"}]}`, 400, `no volume "v"`},
		{"volume mounts under /proc", `{"templateID":"base","volumeMounts":[{"name":"v","path":"/proc/x"}]}`, 400, "/proc"},
		{"volume mounts not a list", `{"templateID":"base","volumeMounts":{"/data":"v"}}`, 400, "volumeMounts"},
		{"volume mounts read-only", `{"templateID":"base","volumeMounts":[{"name":"v","path":"/data","readOnly":true}]}`, 400, "volumeMounts"},
		{"allow_internet on a runtime without a network", `{"templateID":"base","allow_internet_access":true}`, 400, "internet"},
	}
	for _, c := range cases {
		r := f.do("POST", "/v2/sandboxes", f.acme, c.body)
		if r.status != c.status {
			t.Errorf("%s: %d %s, want %d", c.name, r.status, r.body, c.status)
			continue
		}
		if msg, _ := r.errBody(t)["message"].(string); !strings.Contains(msg, c.mention) {
			t.Errorf("%s: message %q does not mention %q", c.name, msg, c.mention)
		}
	}
	// A wrong content type is refused too.
	req, _ := http.NewRequest("POST", f.url+"/v2/sandboxes", strings.NewReader(`{"templateID":"base"}`))
	req.Header.Set("X-API-KEY", f.acme)
	req.Header.Set("Content-Type", "text/plain")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 400 {
		t.Errorf("text/plain body: %d", resp.StatusCode)
	}
	if sbs, _ := f.eng.List(ctx, "acme", torpor.SandboxFilter{IncludeTerminated: true}); len(sbs) != 0 {
		t.Fatalf("refused creates made %d sandboxes", len(sbs))
	}
}

// TestEndTimeThroughTheAPI follows E2B's timeout rules: the end pauses
// (auto-pause) or kills, connect and setTimeout move it, refresh only
// extends it, and a paused sandbox's end does not run.
func TestEndTimeThroughTheAPI(t *testing.T) {
	f := newFixture(t)
	c := f.create(`{"templateID":"base","timeout":60,"autoPause":true,"autoResume":{"enabled":true}}`)
	id := c.SandboxID
	f.clock.Advance(58 * time.Second)
	if d := f.info(id); d.State != "running" {
		t.Fatalf("before its end: %s", d.State)
	}
	// Activity does not move an end.
	if _, err := f.eng.Touch(ctx, "acme", id); err != nil {
		t.Fatal(err)
	}
	f.clock.Advance(time.Second)
	f.settle(id, "paused")
	if r := f.do("POST", "/sandboxes/"+id+"/timeout", f.acme, `{"timeout":30}`); r.status != http.StatusConflict {
		t.Fatalf("setTimeout of a paused sandbox: %d %s", r.status, r.body)
	}
	if r := f.do("POST", "/sandboxes/"+id+"/refreshes", f.acme, ``); r.status != http.StatusConflict {
		t.Fatalf("refresh of a paused sandbox: %d %s", r.status, r.body)
	}
	// Its end does not run while it is paused.
	f.clock.Advance(100 * time.Hour)
	f.settle(id, "paused")

	// connect resumes it from memory, 300 s from now (v2's default).
	r := f.do("POST", "/v2/sandboxes/"+id+"/connect", f.acme, `{}`)
	if r.status != http.StatusCreated {
		t.Fatalf("connect of paused: %d %s", r.status, r.body)
	}
	var cr created
	r.decode(t, &cr)
	if cr.SandboxID != id || cr.EnvdAccessToken != c.EnvdAccessToken {
		t.Fatalf("connect answer %+v", cr)
	}
	sb, _ := f.eng.Get(ctx, "acme", id)
	if d := f.info(id); d.State != "running" || !d.EndAt.Equal(f.clock.Now().Add(300*time.Second)) || sb.Boots != 1 {
		t.Fatalf("after connect: %s end %v boots %d", d.State, d.EndAt, sb.Boots)
	}
	// Connecting to a running sandbox with a shorter timeout keeps the end.
	end := f.info(id).EndAt
	if r := f.do("POST", "/v2/sandboxes/"+id+"/connect", f.acme, `{"timeout":10}`); r.status != http.StatusOK {
		t.Fatalf("connect of running: %d %s", r.status, r.body)
	}
	if d := f.info(id); !d.EndAt.Equal(end) {
		t.Fatalf("connect moved the end earlier: %v, was %v", d.EndAt, end)
	}
	// setTimeout moves it earlier (or later) from now.
	if r := f.do("POST", "/sandboxes/"+id+"/timeout", f.acme, `{"timeout":5}`); r.status != http.StatusNoContent {
		t.Fatalf("setTimeout: %d %s", r.status, r.body)
	}
	if d := f.info(id); !d.EndAt.Equal(f.clock.Now().Add(5 * time.Second)) {
		t.Fatalf("setTimeout 5: end %v", d.EndAt)
	}
	// A refresh extends to at least 15 s, never shortens.
	if r := f.do("POST", "/sandboxes/"+id+"/refreshes", f.acme, `{"duration":1}`); r.status != http.StatusNoContent {
		t.Fatalf("refresh: %d %s", r.status, r.body)
	}
	if d := f.info(id); !d.EndAt.Equal(f.clock.Now().Add(15 * time.Second)) {
		t.Fatalf("refresh: end %v", d.EndAt)
	}
	if r := f.do("POST", "/sandboxes/"+id+"/refreshes", f.acme, `{"duration":3601}`); r.status != 400 {
		t.Fatalf("refresh past an hour: %d", r.status)
	}
	for _, body := range []string{`{}`, `{"timeout":-1}`, `{"timeout":"5"}`} {
		if r := f.do("POST", "/sandboxes/"+id+"/timeout", f.acme, body); r.status != 400 {
			t.Fatalf("setTimeout %s: %d", body, r.status)
		}
	}
	f.clock.Advance(15 * time.Second)
	f.settle(id, "paused")

	// Auto-resume: the next operation wakes it, for the last timeout set
	// (setTimeout's 5 s: the refresh only kept it alive).
	if _, err := f.eng.Exec(ctx, "acme", id, torpor.ExecRequest{Cmd: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
	if d := f.info(id); d.State != "running" || !d.EndAt.Equal(f.clock.Now().Add(5*time.Second)) {
		t.Fatalf("after auto-resume: %s end %v", d.State, d.EndAt)
	}

	// Without auto-pause the end kills: the sandbox is gone for E2B.
	k := f.create(`{"templateID":"base","timeout":30}`)
	f.clock.Advance(30 * time.Second)
	deadline := time.Now().Add(5 * time.Second)
	for f.do("GET", "/sandboxes/"+k.SandboxID, f.acme, "").status != http.StatusNotFound {
		if time.Now().After(deadline) {
			t.Fatal("the end did not kill the sandbox")
		}
		time.Sleep(time.Millisecond)
	}
}

func TestVerbsAnswerAsTheSDKBranches(t *testing.T) {
	f := newFixture(t)
	id := f.create(`{"templateID":"base"}`).SandboxID
	steps := []struct {
		name, method, path, body string
		status                   int
		state                    torpor.State // the native state after, when set
	}{
		{"pause", "POST", "/pause", ``, 204, torpor.StatePaused},
		{"pause again: the SDK's pause returns false", "POST", "/pause", ``, 409, torpor.StatePaused},
		{"resume a paused one", "POST", "/resume", `{"timeout":60}`, 201, torpor.StateRunning},
		{"resume a running one", "POST", "/resume", ``, 409, torpor.StateRunning},
		{"pause without memory hibernates", "POST", "/pause", `{"memory":false}`, 204, torpor.StateHibernated},
		{"pause of a hibernated one", "POST", "/pause", ``, 409, torpor.StateHibernated},
		{"connect boots it on its disk", "POST", "/connect", `{"timeout":60}`, 201, torpor.StateRunning},
		{"v1 connect needs a timeout", "POST", "/connect", `{}`, 400, torpor.StateRunning},
		{"connect with a bad timeout", "POST", "/connect", `{"timeout":0}`, 400, torpor.StateRunning},
		{"pause with a bad body", "POST", "/pause", `{"memory":"no"}`, 400, torpor.StateRunning},
		{"pause then connect without memory boots afresh", "POST", "/pause", ``, 204, torpor.StatePaused},
		{"connect memory false", "POST", "/connect", `{"timeout":60,"memory":false}`, 201, torpor.StateRunning},
		{"kill", "DELETE", "", ``, 204, torpor.StateTerminated},
		{"kill again: the SDK's kill returns false", "DELETE", "", ``, 404, torpor.StateTerminated},
		{"getInfo of a killed one", "GET", "", ``, 404, torpor.StateTerminated},
		{"connect to a killed one", "POST", "/connect", `{"timeout":60}`, 404, torpor.StateTerminated},
		{"timeout of a killed one", "POST", "/timeout", `{"timeout":60}`, 404, torpor.StateTerminated},
		{"metrics of a killed one", "GET", "/metrics", ``, 404, torpor.StateTerminated},
	}
	for _, s := range steps {
		r := f.do(s.method, "/sandboxes/"+id+s.path, f.acme, s.body)
		if r.status != s.status {
			t.Fatalf("%s: %d %s, want %d", s.name, r.status, r.body, s.status)
		}
		if r.status >= 400 {
			r.errBody(t)
		}
		sb, _ := f.eng.Get(ctx, "acme", id)
		if sb.State != s.state {
			t.Fatalf("%s: the sandbox is %s, want %s", s.name, sb.State, s.state)
		}
	}
	sb, _ := f.eng.Get(ctx, "acme", id)
	if sb.Boots != 3 {
		t.Fatalf("boots %d: a hibernated connect and a memory-less connect boot afresh", sb.Boots)
	}
	for _, p := range []string{"/sandboxes/nosuchsandbox0000000", "/sandboxes/..%2Fetc", "/sandboxes/UPPER"} {
		if r := f.do("GET", p, f.acme, ""); r.status != 404 {
			t.Errorf("GET %s: %d", p, r.status)
		}
	}
}

func TestTenantsSeeOnlyTheirOwnSandboxes(t *testing.T) {
	f := newFixture(t)
	id := f.create(`{"templateID":"base","metadata":{"k":"v"}}`).SandboxID
	for _, c := range []struct{ method, path, body string }{
		{"GET", "", ""}, {"DELETE", "", ""}, {"POST", "/pause", ""}, {"POST", "/resume", ""},
		{"POST", "/connect", `{"timeout":10}`}, {"POST", "/timeout", `{"timeout":1}`}, {"POST", "/refreshes", ""},
		{"GET", "/metrics", ""},
	} {
		if r := f.do(c.method, "/sandboxes/"+id+c.path, f.other, c.body); r.status != http.StatusNotFound {
			t.Errorf("%s %s as another tenant: %d %s", c.method, c.path, r.status, r.body)
		}
	}
	if r := f.do("POST", "/v2/sandboxes/"+id+"/connect", f.other, `{}`); r.status != http.StatusNotFound {
		t.Errorf("v2 connect as another tenant: %d", r.status)
	}
	for _, p := range []string{"/v2/sandboxes", "/sandboxes"} {
		var l []detail
		f.do("GET", p, f.other, "").decode(t, &l)
		if len(l) != 0 {
			t.Errorf("%s as another tenant: %d sandboxes", p, len(l))
		}
	}
	sb, _ := f.eng.Get(ctx, "acme", id)
	if sb.State != torpor.StateRunning || !sb.EndAt.Equal(f.clock.Now().Add(299*time.Second)) {
		t.Fatalf("another tenant's calls changed the sandbox: %s end %v", sb.State, sb.EndAt)
	}
}

func TestAuthentication(t *testing.T) {
	f := newFixture(t)
	for _, key := range []string{"", "tpk_wrong"} {
		r := f.do("GET", "/v2/sandboxes", key, "")
		if r.status != http.StatusUnauthorized {
			t.Fatalf("key %q: %d", key, r.status)
		}
		r.errBody(t)
	}
	if r := f.do("GET", "/nowhere", f.acme, ""); r.status != 404 {
		t.Fatalf("unknown path: %d", r.status)
	} else {
		r.errBody(t)
	}
}

// sdkMetadata encodes a metadata filter as the JS SDK does: each key and
// value encoded, joined as a query string, sent as one query parameter.
func sdkMetadata(md map[string]string) string {
	pairs := url.Values{}
	for k, v := range md {
		pairs.Set(url.QueryEscape(k), url.QueryEscape(v))
	}
	return url.Values{"metadata": {pairs.Encode()}}.Encode()
}

func TestListFiltersAndPages(t *testing.T) {
	f := newFixture(t)
	var ids []string
	for i := range 5 {
		md := `{"n":"` + string(rune('0'+i)) + `"}`
		if i%2 == 0 {
			md = `{"n":"` + string(rune('0'+i)) + `","user":"a b&c=d/é"}`
		}
		ids = append(ids, f.create(`{"templateID":"base","metadata":`+md+`}`).SandboxID)
	}
	if r := f.do("POST", "/sandboxes/"+ids[1]+"/pause", f.acme, ""); r.status != 204 {
		t.Fatal(r.status)
	}
	list := func(query string) ([]string, string) {
		t.Helper()
		r := f.do("GET", "/v2/sandboxes?"+query, f.acme, "")
		if r.status != 200 {
			t.Fatalf("list ?%s: %d %s", query, r.status, r.body)
		}
		var l []detail
		r.decode(t, &l)
		var got []string
		for _, d := range l {
			got = append(got, d.SandboxID)
		}
		return got, r.header.Get("X-Next-Token")
	}
	same := func(what string, got []string, want ...string) {
		t.Helper()
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Errorf("%s: %v, want %v", what, got, want)
		}
	}
	all, _ := list("")
	same("all, newest first", all, ids[4], ids[3], ids[2], ids[1], ids[0])
	got, _ := list(sdkMetadata(map[string]string{"user": "a b&c=d/é"}))
	same("metadata filter", got, ids[4], ids[2], ids[0])
	// Exactly as the SDK sends "user" = "a b" on the wire.
	got, _ = list("metadata=user%3Da%252520b")
	same("the SDK's wire form of a metadata filter that matches none", got)
	got, _ = list(sdkMetadata(map[string]string{"user": "a b&c=d/é", "n": "2"}))
	same("two keys", got, ids[2])
	got, _ = list("state=paused")
	same("paused", got, ids[1])
	got, _ = list("state=running")
	same("running", got, ids[4], ids[3], ids[2], ids[0])
	got, _ = list("state=running,paused&order=asc")
	same("both, oldest first", got, ids...)
	got, _ = list("template=base")
	same("by E2B name", got, all...)
	got, _ = list("template=plain")
	same("another template", got)
	// Pages.
	var paged []string
	q := "limit=2"
	for pages := 0; ; pages++ {
		page, next := list(q)
		if len(page) > 2 || pages > 3 {
			t.Fatalf("page %d: %v", pages, page)
		}
		paged = append(paged, page...)
		if next == "" {
			break
		}
		q = "limit=2&nextToken=" + url.QueryEscape(next)
	}
	same("pages", paged, all...)
	var v1 []detail
	f.do("GET", "/sandboxes", f.acme, "").decode(t, &v1)
	if len(v1) != 4 {
		t.Errorf("GET /sandboxes lists the running ones: %d", len(v1))
	}
	for _, bad := range []string{"state=sleeping", "limit=0", "limit=101", "limit=x", "nextToken=garbage", "order=up",
		"startedAfter=yesterday", "metadata=nokey", "metadata=%25zz"} {
		r := f.do("GET", "/v2/sandboxes?"+bad, f.acme, "")
		if r.status != 400 {
			t.Errorf("?%s: %d %s", bad, r.status, r.body)
			continue
		}
		r.errBody(t)
	}
}

func TestMetricsAreTheRuntimes(t *testing.T) {
	f := newFixture(t)
	id := f.create(`{"templateID":"base"}`).SandboxID
	var m []map[string]any
	// Nothing measured but CPU: memory and disk are left out, not zero.
	r := f.do("GET", "/sandboxes/"+id+"/metrics", f.acme, "")
	r.decode(t, &m)
	if len(m) != 1 || m[0]["memUsed"] != nil || m[0]["diskUsed"] != nil || m[0]["cpuUsedPct"] == nil {
		t.Fatalf("metrics without figures: %s", r.body)
	}
	const mib = 1 << 20
	mem, cache, disk := int64(100*mib), int64(10*mib), int64(5*mib)
	f.host.SetResourceUsage(id, torpor.ResourceUsage{MemoryBytes: &mem, MemoryCacheBytes: &cache, DiskBytes: &disk})
	time.Sleep(50 * time.Millisecond)
	f.host.AddCPU(id, 40*time.Millisecond)
	r = f.do("GET", "/sandboxes/"+id+"/metrics", f.acme, "")
	var got []struct {
		Timestamp     time.Time `json:"timestamp"`
		TimestampUnix int64     `json:"timestampUnix"`
		CPUCount      int       `json:"cpuCount"`
		CPUUsedPct    float64   `json:"cpuUsedPct"`
		MemUsed       int64     `json:"memUsed"`
		MemCache      int64     `json:"memCache"`
		MemTotal      int64     `json:"memTotal"`
		DiskUsed      int64     `json:"diskUsed"`
		DiskTotal     int64     `json:"diskTotal"`
	}
	r.decode(t, &got)
	if len(got) != 1 {
		t.Fatalf("metrics: %s", r.body)
	}
	g := got[0]
	if g.CPUCount != 1 || g.CPUUsedPct <= 0 || g.CPUUsedPct > 100 || g.MemUsed != mem || g.MemCache != cache ||
		g.MemTotal != 512*mib || g.DiskUsed != disk || g.DiskTotal != 2048*mib || time.Since(g.Timestamp) > time.Minute ||
		g.TimestampUnix != g.Timestamp.Unix() {
		t.Fatalf("metrics %+v", g)
	}
	if r := f.do("GET", "/sandboxes/"+id+"/metrics?start=-1", f.acme, ""); r.status != 400 {
		t.Fatalf("negative start: %d", r.status)
	}
	// A hibernated sandbox has no instance: no figures.
	if _, err := f.eng.Hibernate(ctx, "acme", id); err != nil {
		t.Fatal(err)
	}
	f.do("GET", "/sandboxes/"+id+"/metrics", f.acme, "").decode(t, &m)
	if len(m) != 0 {
		t.Fatalf("metrics of a hibernated sandbox: %v", m)
	}
}

func TestTemplates(t *testing.T) {
	f := newFixture(t)
	var ts []struct {
		TemplateID  string   `json:"templateID"`
		Aliases     []string `json:"aliases"`
		BuildStatus string   `json:"buildStatus"`
		EnvdVersion string   `json:"envdVersion"`
		CPUCount    int      `json:"cpuCount"`
		MemoryMB    int      `json:"memoryMB"`
	}
	f.do("GET", "/templates", f.acme, "").decode(t, &ts)
	found := false
	for _, tm := range ts {
		if tm.TemplateID == "e2b-base" {
			found = strings.Join(tm.Aliases, ",") == "e2b-base,base" && tm.BuildStatus == "ready" && tm.EnvdVersion == envd.Version && tm.CPUCount == 1 && tm.MemoryMB == 512
		}
	}
	if len(ts) != 3 || !found {
		t.Fatalf("templates %+v", ts)
	}

	// spawnCount is the caller's own sandboxes only.
	f.create(`{"templateID":"base"}`)
	spawns := func(key string) int {
		var ts []struct {
			TemplateID string `json:"templateID"`
			SpawnCount int    `json:"spawnCount"`
		}
		f.do("GET", "/templates", key, "").decode(t, &ts)
		for _, tm := range ts {
			if tm.TemplateID == "e2b-base" {
				return tm.SpawnCount
			}
		}
		t.Fatalf("no e2b-base template in %+v", ts)
		return 0
	}
	if a, o := spawns(f.acme), spawns(f.other); a != 1 || o != 0 {
		t.Fatalf("spawnCount: acme sees %d, other sees %d; want 1 and 0", a, o)
	}
}

func TestRefusalsTheSDKRetries(t *testing.T) {
	f := newFixture(t, func(c *lifecycle.Config) { c.Capacity = lifecycle.Capacity{VCPUs: 1} })
	f.create(`{"templateID":"base"}`)
	// The node is full: 429 with Retry-After, which the SDK retries.
	r := f.do("POST", "/v2/sandboxes", f.acme, `{"templateID":"base"}`)
	if r.status != http.StatusTooManyRequests || r.header.Get("Retry-After") == "" {
		t.Fatalf("create on a full node: %d %v %s", r.status, r.header, r.body)
	}
	if r.errBody(t)["error_code"] != "sandbox_capacity_unavailable" {
		t.Fatalf("capacity error code: %s", r.body)
	}
	// A template still being built: 503 with Retry-After.
	f.tmpls.unavailable = true
	r = f.do("POST", "/v2/sandboxes", f.acme, `{"templateID":"base"}`)
	if r.status != http.StatusServiceUnavailable || r.header.Get("Retry-After") != "5" {
		t.Fatalf("template being built: %d %v %s", r.status, r.header, r.body)
	}
	r.errBody(t)
}

func TestAFailedBootLeavesNothing(t *testing.T) {
	f := newFixture(t)
	f.host.BootHook = func(context.Context, torpor.BootSpec) error {
		return &torpor.Error{Code: torpor.EInvalid, Reason: torpor.FailureSetup, Message: "setup exited with status 1"}
	}
	r := f.do("POST", "/v2/sandboxes", f.acme, `{"templateID":"base"}`)
	if r.status != 500 || !strings.Contains(string(r.body), "setup exited") {
		t.Fatalf("failed boot: %d %s", r.status, r.body)
	}
	r.errBody(t)
	var l []detail
	f.do("GET", "/v2/sandboxes", f.acme, "").decode(t, &l)
	if len(l) != 0 {
		t.Fatalf("a failed create left %d sandboxes", len(l))
	}
}

// FuzzE2BCreateBody sends arbitrary bodies to POST /v2/sandboxes: the
// answer is never a 5xx, always in E2B's error shape when it is an error,
// and a refused create makes nothing.
func FuzzE2BCreateBody(f *testing.F) {
	for _, s := range []string{
		`{"templateID":"base"}`,
		`{"templateID":"base","timeout":60,"metadata":{"k":"v"},"envVars":{"A":"b"},"autoPause":true,"autoResume":{"enabled":true}}`,
		`{"templateID":"base","lifecycle":{"onTimeout":"pause","autoResume":false},"allow_internet_access":false,"secure":true}`,
		`{"templateID":"base","timeout":-5}`, `{"templateID":null}`, `{"templateID":"x","network":{}}`,
		`[]`, `null`, `"x"`, `{"templateID":"base","autoPauseMemory":false,"autoPause":true}`,
		`{"templateID":"base","templateID":"base"}`, `{"templateID":"base","TemplateID":"base"}`,
	} {
		f.Add(s)
	}
	fx := newFixture(f)
	f.Fuzz(func(t *testing.T, body string) {
		fx.t = t
		// Accepted creates are deleted again, so the live ones are the
		// ones before.
		before, _ := fx.eng.List(ctx, "acme", torpor.SandboxFilter{})
		r := fx.do("POST", "/v2/sandboxes", fx.acme, body)
		if r.status >= 500 {
			t.Fatalf("status %d for %q: %s", r.status, body, r.body)
		}
		if r.status >= 400 {
			r.errBody(t)
			after, _ := fx.eng.List(ctx, "acme", torpor.SandboxFilter{})
			if len(after) != len(before) {
				t.Fatalf("a refused create (%d) made a sandbox: %q", r.status, body)
			}
			return
		}
		var c created
		r.decode(t, &c)
		if _, err := fx.eng.Delete(ctx, "acme", c.SandboxID); err != nil && !errors.Is(err, context.Canceled) {
			t.Fatal(err)
		}
	})
}
