package interp

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

// fakeEngine answers from a canned result and records the requests.
type fakeEngine struct {
	mu    sync.Mutex
	reqs  []torpor.CodeRequest
	res   torpor.CodeResult
	err   error
	delay time.Duration
}

func (f *fakeEngine) RunCode(ctx context.Context, tenant, id string, req torpor.CodeRequest) (torpor.CodeResult, error) {
	f.mu.Lock()
	f.reqs = append(f.reqs, req)
	f.mu.Unlock()
	if f.delay > 0 {
		select {
		case <-time.After(f.delay):
		case <-ctx.Done():
			return torpor.CodeResult{}, ctx.Err()
		}
	}
	return f.res, f.err
}
func (f *fakeEngine) CodeContexts(ctx context.Context, tenant, id string) ([]torpor.CodeContext, error) {
	return nil, f.err
}
func (f *fakeEngine) CreateCodeContext(ctx context.Context, tenant, id, language, cwd string) (torpor.CodeContext, error) {
	return torpor.CodeContext{ID: "ctx_1", Language: language, Cwd: cwd}, f.err
}
func (f *fakeEngine) RestartCodeContext(ctx context.Context, tenant, id, contextID string) error {
	return f.err
}
func (f *fakeEngine) DeleteCodeContext(ctx context.Context, tenant, id, contextID string) error {
	return f.err
}

func fakeServer(t *testing.T, f *fakeEngine, keepAlive time.Duration) *httptest.Server {
	t.Helper()
	s := newServer(f, Config{KeepAlive: keepAlive})
	sb := &torpor.Sandbox{ID: "sb_1", Tenant: "t1"}
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { s.ServeSandbox(w, r, sb) }))
	t.Cleanup(hs.Close)
	return hs
}

// Bad input gets the status and body E2B's server gives it, and reaches
// no interpreter.
func TestBadInput(t *testing.T) {
	f := &fakeEngine{}
	hs := fakeServer(t, f, time.Second)
	for _, tc := range []struct {
		method, path, body string
		status             int
		want               string
	}{
		{"POST", "/execute", `{}`, 422, `"loc":["body","code"]`},
		{"POST", "/execute", `{"code": 5}`, 422, `"string_type"`},
		{"POST", "/execute", `not json`, 422, `json_invalid`},
		{"POST", "/execute", `[1]`, 422, `json_invalid`},
		{"POST", "/execute", `{"code":"1","env_vars":{"A":1}}`, 422, `env_vars`},
		{"POST", "/execute", `{"code":"1","language":"python","context_id":"c"}`, 400, "Only one of context_id or language can be provided"},
		{"POST", "/execute", `{"code":"1","language":"cobol"}`, 400, "Unsupported language"},
		{"POST", "/execute", `{"code":"1","language":"javascript"}`, 400, "Unsupported language"},
		{"POST", "/execute", `{"code":"1","context_id":"../../etc"}`, 404, "Context ../../etc not found"},
		{"POST", "/execute", `{"code":"1","env_vars":{"A=B":"x"}}`, 400, "not valid"},
		{"POST", "/execute", `{"code":"a\u0000b"}`, 400, "NUL"},
		{"POST", "/contexts", `{"language":"r"}`, 400, "Unsupported language"},
		{"POST", "/contexts", `{"cwd":7}`, 422, "string_type"},
		{"DELETE", "/contexts/..%2f", ``, 404, "not found"},
		{"POST", "/contexts/a%20b/restart", ``, 404, "not found"},
		{"GET", "/execute", ``, 405, ""},
	} {
		req, _ := http.NewRequest(tc.method, hs.URL+tc.path, strings.NewReader(tc.body))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		_, _ = bufio.NewReader(resp.Body).WriteTo(&b)
		resp.Body.Close()
		if resp.StatusCode != tc.status || !strings.Contains(b.String(), tc.want) {
			t.Errorf("%s %s %s: %d %s, want %d with %q", tc.method, tc.path, tc.body, resp.StatusCode, b.String(), tc.status, tc.want)
		}
	}
	if len(f.reqs) != 0 {
		t.Errorf("bad input reached the engine: %+v", f.reqs)
	}
}

func post(t *testing.T, url, body string) (*http.Response, []map[string]any) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var out []map[string]any
	if resp.StatusCode != 200 {
		return resp, nil
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for sc.Scan() {
		var m map[string]any
		if err := json.Unmarshal(sc.Bytes(), &m); err != nil {
			t.Fatalf("not a JSON line: %q", sc.Text())
		}
		out = append(out, m)
	}
	return resp, out
}

// The lines of an execution, in E2B's order and shapes; errors from the
// engine after the stream began are an error line; a refusal before it
// is a status.
func TestExecuteLines(t *testing.T) {
	result := "'hi'"
	f := &fakeEngine{res: torpor.CodeResult{Stdout: "out\n", Stderr: "err\n", Result: &result, ExecutionCount: 3,
		Displays: []torpor.CodeDisplay{
			{Data: map[string]string{"text/plain": "<Figure>", "image/png": "iVBO", "application/json": `{"a":1}`, "x/custom": "c"}},
			{Main: true, Data: map[string]string{"text/plain": "'hi'", "text/html": "<b>hi</b>"}},
		},
		Error: &torpor.CodeError{Name: "ValueError", Value: "bad", Traceback: "tb"}}}
	hs := fakeServer(t, f, 50*time.Millisecond)
	resp, lines := post(t, hs.URL+"/execute", `{"code":"x","env_vars":{"A":"1"}}`)
	if resp.StatusCode != 200 || len(lines) != 7 {
		t.Fatalf("%d %v", resp.StatusCode, lines)
	}
	want := []string{"number_of_executions", "stdout", "stderr", "result", "result", "error", "end_of_execution"}
	for i, w := range want {
		if lines[i]["type"] != w {
			t.Errorf("line %d: %v, want %s", i, lines[i], w)
		}
	}
	if lines[0]["execution_count"] != 3.0 || lines[1]["text"] != "out\n" || lines[2]["text"] != "err\n" {
		t.Errorf("head: %v", lines[:3])
	}
	if d := lines[3]; d["png"] != "iVBO" || d["is_main_result"] != false || d["json"].(map[string]any)["a"] != 1.0 || d["extra"].(map[string]any)["x/custom"] != "c" {
		t.Errorf("display: %v", d)
	}
	if m := lines[4]; m["text"] != "hi" || m["html"] != "<b>hi</b>" || m["is_main_result"] != true {
		t.Errorf("main result: %v", m)
	}
	if e := lines[5]; e["name"] != "ValueError" || e["value"] != "bad" || e["traceback"] != "tb" {
		t.Errorf("error: %v", e)
	}
	if r := f.reqs[0]; r.Language != "python" || r.Code != "x" || r.Env["A"] != "1" || r.Cwd != DefaultCwd {
		t.Errorf("request: %+v", r)
	}

	// A refusal that comes at once is a status: an unknown context is
	// E2B's 404.
	f.err = &torpor.Error{Code: torpor.ENotFound, Param: "context", Message: "context c9 not found"}
	resp, _ = post(t, hs.URL+"/execute", `{"code":"x","context_id":"c9"}`)
	if resp.StatusCode != 404 {
		t.Errorf("unknown context: %d", resp.StatusCode)
	}
	// A slow execution gets keep-alives, and a failure after the stream
	// began is an error line before the end.
	f.err, f.delay = torpor.Errorf(torpor.EConflict, "sandbox is paused"), 200*time.Millisecond
	resp, lines = post(t, hs.URL+"/execute", `{"code":"x"}`)
	if resp.StatusCode != 200 || len(lines) < 3 || lines[0]["type"] != "keepalive" ||
		lines[len(lines)-2]["type"] != "error" || lines[len(lines)-2]["value"] != "sandbox is paused" || lines[len(lines)-1]["type"] != "end_of_execution" {
		t.Errorf("late failure: %d %v", resp.StatusCode, lines)
	}
	// An internal error says nothing of itself.
	f.delay = 0
	f.err = &torpor.Error{Code: torpor.EInternal, Message: "secret path /var/lib"}
	resp, _ = post(t, hs.URL+"/execute", `{"code":"x"}`)
	if resp.StatusCode != 500 {
		t.Errorf("internal: %d", resp.StatusCode)
	}
}

func jsonDecode(resp *http.Response, v any) error {
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return json.NewDecoder(resp.Body).Decode(v)
}
