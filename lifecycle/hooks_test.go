package lifecycle_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

// hookLog records the hooks a fake sandbox ran, with the instance state
// each saw.
type hookLog struct {
	mu  sync.Mutex
	ran []string
}

func (l *hookLog) add(s string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.ran = append(l.ran, s)
}

func (l *hookLog) get() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.ran...)
}

func scriptHook(on, path string) torpor.Hook {
	return torpor.Hook{Type: torpor.HookScript, On: on, Path: path, Wait: true, TimeoutSeconds: 5}
}

func hookEnv(t *testing.T) (*env, *hookLog) {
	e := newEnv(t)
	log := &hookLog{}
	e.host.ExecFunc = func(ctx context.Context, id string, req torpor.ExecRequest) (torpor.ExecResult, error) {
		log.add(strings.Join(req.Cmd, " ") + "@" + string(e.host.State(id)))
		switch req.Cmd[0] {
		case "/bin/fail":
			io.WriteString(req.Stderr, "disk full\n")
			return torpor.ExecResult{ExitCode: 2}, nil
		case "/bin/hang":
			<-ctx.Done()
			return torpor.ExecResult{}, ctx.Err()
		}
		return torpor.ExecResult{}, nil
	}
	return e, log
}

func TestHooksRunOnEachTransitionInOrder(t *testing.T) {
	e, log := hookEnv(t)
	h := scriptHook(torpor.HookOnStart, "/hooks/start")
	h.Arguments = []string{"--from", "/data"}
	sb := e.create(torpor.CreateRequest{Hooks: []torpor.Hook{
		h,
		scriptHook(torpor.HookOnPause, "/hooks/pause"),
		scriptHook(torpor.HookOnResume, "/hooks/resume"),
		scriptHook(torpor.HookOnTerminate, "/hooks/terminate"),
	}})
	must(e.eng.Pause(ctx, "acme", sb.ID, ""))
	must(e.eng.Start(ctx, "acme", sb.ID))
	must(e.eng.Hibernate(ctx, "acme", sb.ID))
	must(e.eng.Start(ctx, "acme", sb.ID)) // a start from hibernation
	must(e.eng.Restart(ctx, "acme", sb.ID))
	must(e.eng.Pause(ctx, "acme", sb.ID, ""))
	must(e.eng.Delete(ctx, "acme", sb.ID)) // thawed for its terminate hook
	want := []string{
		"/hooks/start --from /data@running",
		"/hooks/pause@running", // before the freeze
		"/hooks/resume@running",
		"/hooks/start --from /data@running",
		"/hooks/start --from /data@running",
		"/hooks/pause@running",
		"/hooks/terminate@running",
	}
	if got := log.get(); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("hooks ran:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	evs, _ := e.eng.Events(ctx, "acme", torpor.EventFilter{SandboxID: sb.ID})
	ran := 0
	for _, ev := range evs {
		if ev.Type == "hook.ran" {
			ran++
		}
	}
	if ran != len(want) {
		t.Fatalf("%d hook.ran events, want %d", ran, len(want))
	}
}

func TestFailedHooksDoNotStopTransitions(t *testing.T) {
	e, _ := hookEnv(t)
	sb := e.create(torpor.CreateRequest{Hooks: []torpor.Hook{
		scriptHook(torpor.HookOnStart, "/bin/fail"),
		{Type: torpor.HookScript, On: torpor.HookOnPause, Path: "/bin/hang", Wait: true, TimeoutSeconds: 1},
	}})
	// A start hook that fails: the sandbox runs, and the failure is on it.
	if sb.State != torpor.StateRunning || sb.HookFailure == nil || sb.HookFailure.On != torpor.HookOnStart ||
		!strings.Contains(sb.HookFailure.Message, "status 2: disk full") {
		t.Fatalf("after a failing start hook: %s %+v", sb.State, sb.HookFailure)
	}
	// A pause hook past its timeout: killed, failed, and the pause happens.
	done := make(chan error)
	go func() { _, err := e.eng.Pause(ctx, "acme", sb.ID, ""); done <- err }()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the pause hung on its hook")
	}
	got := e.get(sb.ID)
	if got.State != torpor.StatePaused || got.HookFailure.On != torpor.HookOnPause || !strings.Contains(got.HookFailure.Message, "timed out") {
		t.Fatalf("after a hanging pause hook: %s %+v", got.State, got.HookFailure)
	}
	evs, _ := e.eng.Events(ctx, "acme", torpor.EventFilter{SandboxID: sb.ID})
	var failed []string
	for _, ev := range evs {
		if ev.Type == "hook.failed" {
			failed = append(failed, ev.Attrs["on"])
		}
	}
	if strings.Join(failed, ",") != "start,pause" {
		t.Fatalf("hook.failed events for %v", failed)
	}
}

func TestHooksFireOnIdleTransitionsToo(t *testing.T) {
	e, log := hookEnv(t)
	sb := e.create(torpor.CreateRequest{
		PolicyRequest: torpor.PolicyRequest{LifecyclePolicy: policy(torpor.LifecyclePolicy{PauseAfterIdleSeconds: torpor.Seconds(60)})},
		Hooks:         []torpor.Hook{scriptHook(torpor.HookOnPause, "/hooks/flush")},
	})
	e.clock.Advance(time.Minute)
	settle(e, sb.ID, torpor.StatePaused)
	if got := log.get(); len(got) != 1 || got[0] != "/hooks/flush@running" {
		t.Fatalf("hooks on an idle pause: %v", got)
	}
}

func TestHTTPHookReachesThePortInsideTheSandbox(t *testing.T) {
	e := newEnv(t)
	var mu sync.Mutex
	var got []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var body map[string]string
		json.NewDecoder(r.Body).Decode(&body)
		mu.Lock()
		got = append(got, r.Method+" "+r.URL.Path+" "+body["event"])
		mu.Unlock()
		if r.URL.Path == "/broken" {
			w.WriteHeader(500)
		}
	}))
	defer srv.Close()
	e.host.DialFunc = func(ctx context.Context, id, network, addr string) (net.Conn, error) {
		if addr != "127.0.0.1:3000" {
			return nil, errors.New("wrong port " + addr)
		}
		var d net.Dialer
		return d.DialContext(ctx, network, srv.Listener.Addr().String())
	}
	sb := e.create(torpor.CreateRequest{Hooks: []torpor.Hook{
		{Type: torpor.HookHTTP, On: torpor.HookOnPause, Port: 3000, Path: "/hooks/flush", Wait: true},
		{Type: torpor.HookHTTP, On: torpor.HookOnResume, Port: 3000, Path: "/broken", Wait: true},
	}})
	must(e.eng.Pause(ctx, "acme", sb.ID, ""))
	after := must2(e.eng.Start(ctx, "acme", sb.ID))
	mu.Lock()
	defer mu.Unlock()
	if strings.Join(got, ";") != "POST /hooks/flush pause;POST /broken resume" {
		t.Fatalf("requests: %v", got)
	}
	if after.HookFailure == nil || !strings.Contains(after.HookFailure.Message, "500") {
		t.Fatalf("a 500 from a resume hook: %+v", after.HookFailure)
	}
}

func must2(sb *torpor.Sandbox, err error) *torpor.Sandbox {
	if err != nil {
		panic(err)
	}
	return sb
}

func TestHookValidation(t *testing.T) {
	e := newEnv(t)
	cases := []struct {
		name  string
		hook  torpor.Hook
		param string
	}{
		{"unknown on", torpor.Hook{Type: "script", On: "sleep", Path: "/x"}, "hooks[0].on"},
		{"unknown type", torpor.Hook{Type: "grpc", On: "start", Path: "/x"}, "hooks[0].type"},
		{"relative script", torpor.Hook{Type: "script", On: "start", Path: "x.sh"}, "hooks[0].path"},
		{"http without port", torpor.Hook{Type: "http", On: "start", Path: "/x"}, "hooks[0].port"},
		{"http bad path", torpor.Hook{Type: "http", On: "start", Path: "x", Port: 80}, "hooks[0].path"},
		{"huge timeout", torpor.Hook{Type: "script", On: "start", Path: "/x", TimeoutSeconds: 1 << 30}, "hooks[0].timeout_seconds"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := e.eng.Create(ctx, "acme", torpor.CreateRequest{Template: "base", Hooks: []torpor.Hook{c.hook}})
			te, ok := err.(*torpor.Error)
			if !ok || te.Code != torpor.EInvalid || te.Param != c.param {
				t.Fatalf("got %v, want invalid_argument on %s", err, c.param)
			}
		})
	}
}

func TestTemplateHooksRunUnlessIgnored(t *testing.T) {
	e, log := hookEnv(t)
	if err := e.store.PutTemplate(ctx, torpor.Template{Name: "hooked", RootFS: "/x", CreatedAt: time.Now(),
		Defaults: torpor.TemplateDefaults{Hooks: []torpor.Hook{scriptHook(torpor.HookOnStart, "/image/warm")}}}); err != nil {
		t.Fatal(err)
	}
	e.create(torpor.CreateRequest{Template: "hooked", Hooks: []torpor.Hook{scriptHook(torpor.HookOnStart, "/mine")}})
	e.create(torpor.CreateRequest{Template: "hooked", IgnoreImageHooks: true, Hooks: []torpor.Hook{scriptHook(torpor.HookOnStart, "/mine")}})
	want := "/image/warm@running,/mine@running,/mine@running"
	if got := strings.Join(log.get(), ","); got != want {
		t.Fatalf("hooks ran: %s, want %s", got, want)
	}
}

// TestFailedTerminateHookStillDeletes: the delete goes on; the failure is
// an event on the terminated sandbox.
func TestFailedTerminateHookStillDeletes(t *testing.T) {
	e, log := hookEnv(t)
	sb := e.create(torpor.CreateRequest{Hooks: []torpor.Hook{scriptHook(torpor.HookOnTerminate, "/bin/fail")}})
	got, err := e.eng.Delete(ctx, "acme", sb.ID)
	if err != nil || got.State != torpor.StateTerminated || e.host.HasDisk(sb.ID) {
		t.Fatalf("delete with a failing terminate hook: %v %v", got, err)
	}
	if l := log.get(); len(l) != 1 || l[0] != "/bin/fail@running" {
		t.Fatalf("hooks ran: %v", l)
	}
	evs, _ := e.eng.Events(ctx, "acme", torpor.EventFilter{SandboxID: sb.ID})
	var types []string
	for _, ev := range evs {
		types = append(types, ev.Type)
	}
	if !strings.Contains(strings.Join(types, ","), "hook.failed,sandbox.terminated") {
		t.Fatalf("events %v", types)
	}
}
