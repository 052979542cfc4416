package proxy_test

import (
	"crypto/subtle"
	"fmt"
	"net/http"
	"strings"
	"testing"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/proxy"
)

// echoService is a service port that answers with the sandbox and path
// it was given, for requests that carry the sandbox's traffic token in
// X-Access-Token.
type echoService struct{}

func (echoService) Authorize(r *http.Request, sb *torpor.Sandbox) error {
	tok := r.Header.Get("X-Access-Token")
	switch {
	case tok == "":
		return torpor.Errorf(torpor.EUnauthenticated, "no token")
	case subtle.ConstantTimeCompare([]byte(tok), []byte(sb.TrafficToken)) != 1:
		return torpor.Errorf(torpor.EForbidden, "wrong token")
	}
	return nil
}

func (echoService) ServeSandbox(w http.ResponseWriter, r *http.Request, sb *torpor.Sandbox) {
	fmt.Fprintf(w, "service %s %s %s", sb.ID, sb.State, r.URL.Path)
}

func TestServicePorts(t *testing.T) {
	f := newFixture(t, func(c *proxy.Config) { c.Services = map[int]proxy.Service{49983: echoService{}} })
	gone := f.create(t, torpor.CreateRequest{})
	if _, err := f.eng.Delete(ctx, "acme", gone.ID); err != nil {
		t.Fatal(err)
	}
	sb := f.create(t, torpor.CreateRequest{})
	noResume := false
	asleep := f.create(t, torpor.CreateRequest{PolicyRequest: torpor.PolicyRequest{Timeout: torpor.Seconds(60), Lifecycle: &torpor.Lifecycle{OnTimeout: "pause", AutoResume: &noResume}}})
	if _, err := f.eng.Pause(ctx, "acme", asleep.ID, ""); err != nil {
		t.Fatal(err)
	}
	e2b := func(id, token string) map[string]string {
		h := map[string]string{proxy.HeaderE2BSandboxID: id, proxy.HeaderE2BSandboxPort: "49983"}
		if token != "" {
			h["X-Access-Token"] = token
		}
		return h
	}
	cases := []struct {
		name, host string
		hdr        map[string]string
		status     int
		body       string
	}{
		{"E2B headers", "127.0.0.1:7071", e2b(sb.ID, sb.TrafficToken), 200, "service " + sb.ID + " running /health"},
		{"host name", "49983-" + sb.ID + ".sb.test", map[string]string{"X-Access-Token": sb.TrafficToken}, 200, "service " + sb.ID},
		{"no token", "x", e2b(sb.ID, ""), 401, `"code":401`},
		{"another sandbox's token", "x", e2b(sb.ID, asleep.TrafficToken), 403, `"code":403`},
		// An unknown id is refused as a sandbox that exists refuses a
		// request without its token, so that ids cannot be probed.
		{"unknown sandbox, a token", "x", e2b("nosuchsandbox", "t"), 403, `"code":403`},
		{"unknown sandbox, no token", "x", e2b("nosuchsandbox", ""), 401, `"code":401`},
		{"terminated", "x", e2b(gone.ID, gone.TrafficToken), 502, "not running"},
		{"paused without auto_resume", "x", e2b(asleep.ID, asleep.TrafficToken), 502, "not running"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			status, body := f.get(t, c.host, "/health", c.hdr)
			if status != c.status || !strings.Contains(body, c.body) {
				t.Fatalf("got %d %q, want %d containing %q", status, body, c.status, c.body)
			}
		})
	}
	if got, _ := f.eng.Lookup(ctx, asleep.ID); got.State != torpor.StatePaused {
		t.Fatalf("a refused request changed the sandbox: %s", got.State)
	}

	// A paused sandbox with auto_resume is woken by the first request.
	if _, err := f.eng.Pause(ctx, "acme", sb.ID, ""); err != nil {
		t.Fatal(err)
	}
	status, body := f.get(t, "x", "/health", e2b(sb.ID, sb.TrafficToken))
	if status != 200 || !strings.Contains(body, "running") {
		t.Fatalf("after pause: %d %q", status, body)
	}
	// The service port is the daemon's: nothing was forwarded inside.
	if f.hits.Load() != 0 {
		t.Fatalf("%d requests reached the sandbox", f.hits.Load())
	}
}
