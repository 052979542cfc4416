package e2b_test

import (
	"encoding/base64"
	"net/http"
	"net/url"
	"strings"
	"testing"

	"github.com/torpor-dev/torpor"
)

// TestBadInputOnEveryRoute: extreme and malformed bodies and query
// strings on the verbs, the list and the metrics are a 4xx in E2B's shape
// naming what is wrong, never a 5xx, and change nothing.
func TestBadInputOnEveryRoute(t *testing.T) {
	f := newFixture(t)
	id := f.create(`{"templateID":"base","timeout":60,"metadata":{"k":"v"}}`).SandboxID
	before, _ := f.eng.Get(ctx, "acme", id)
	long := strings.Repeat("a", 10000)
	cases := []struct {
		method, path, body string
		want               int
	}{
		{"POST", "/sandboxes/" + id + "/timeout", `{"timeout":-1}`, 400},
		{"POST", "/sandboxes/" + id + "/timeout", `{"timeout":1e30}`, 400},
		{"POST", "/sandboxes/" + id + "/timeout", `{"timeout":9223372036854775807}`, 400},
		{"POST", "/sandboxes/" + id + "/timeout", `{"timeout":"60"}`, 400},
		{"POST", "/sandboxes/" + id + "/timeout", `{}`, 400},
		{"POST", "/sandboxes/" + id + "/timeout", `{"timeout":60}{"timeout":1}`, 400},
		{"POST", "/sandboxes/" + id + "/timeout", `[60]`, 400},
		{"POST", "/sandboxes/" + id + "/refreshes", `{"duration":-1}`, 400},
		{"POST", "/sandboxes/" + id + "/refreshes", `{"duration":3601}`, 400},
		{"POST", "/sandboxes/" + id + "/refreshes", `{"duration":1.5}`, 400},
		{"POST", "/v2/sandboxes/" + id + "/connect", `{"timeout":0}`, 400},
		{"POST", "/v2/sandboxes/" + id + "/connect", `{"timeout":-5}`, 400},
		{"POST", "/v2/sandboxes/" + id + "/connect", `{"timeout":99999999999}`, 400},
		{"POST", "/v2/sandboxes/" + id + "/connect", `{"timeout":10,"autoPause":"yes"}`, 400},
		{"POST", "/sandboxes/" + id + "/connect", `{}`, 400},
		{"POST", "/sandboxes/" + id + "/resume", `{"timeout":-1}`, 400},
		{"POST", "/sandboxes/" + id + "/pause", `{"memory":"no"}`, 400},
		{"POST", "/sandboxes/" + id + "/pause", `{`, 400},
		{"POST", "/sandboxes/" + id + "/pause", `{"memory":false}` + strings.Repeat(" ", 1<<20), 400},
		{"GET", "/sandboxes/" + id + "/metrics?start=-1", "", 400},
		{"GET", "/sandboxes/" + id + "/metrics?end=abc", "", 400},
		{"GET", "/sandboxes/" + id + "/metrics?start=99999999999999999999", "", 400},
		{"GET", "/sandboxes/" + long, "", 404},
		{"DELETE", "/sandboxes/" + long + "-x", "", 404},
		{"GET", "/v2/sandboxes?limit=99999999999999999999", "", 400},
		{"GET", "/v2/sandboxes?limit=-1", "", 400},
		{"GET", "/v2/sandboxes?limit=1.5", "", 400},
		{"GET", "/v2/sandboxes?nextToken=" + base64.RawURLEncoding.EncodeToString([]byte("99999999999999999999.x")), "", 400},
		{"GET", "/v2/sandboxes?nextToken=" + base64.RawURLEncoding.EncodeToString([]byte("1.../etc")), "", 400},
		{"GET", "/v2/sandboxes?nextToken=" + url.QueryEscape(long), "", 400},
		{"GET", "/v2/sandboxes?metadata=%25", "", 400},
		{"GET", "/v2/sandboxes?metadata=" + url.QueryEscape("k%ZZ=v"), "", 400},
		{"GET", "/v2/sandboxes?metadata=" + url.QueryEscape("=v"), "", 400},
		{"GET", "/v2/sandboxes?metadata=" + url.QueryEscape("k=v=w"), "", 400},
		{"GET", "/v2/sandboxes?metadata=" + url.QueryEscape(url.QueryEscape(long)+"=v"), "", 400},
		{"GET", "/sandboxes?metadata=%25", "", 400},
		{"GET", "/v2/sandboxes?startedAfter=yesterday", "", 400},
		{"GET", "/v2/sandboxes?state=running,sleeping", "", 400},
	}
	for _, c := range cases {
		r := f.do(c.method, c.path, f.acme, c.body)
		if r.status != c.want {
			t.Errorf("%s %.120s %.60s: %d %s, want %d", c.method, c.path, c.body, r.status, r.body, c.want)
			continue
		}
		r.errBody(t)
	}
	after, _ := f.eng.Get(ctx, "acme", id)
	if after.State != torpor.StateRunning || !after.EndAt.Equal(*before.EndAt) || after.OnEnd != before.OnEnd {
		t.Fatalf("refused requests changed the sandbox: %s end %v→%v on_end %s→%s", after.State, before.EndAt, after.EndAt, before.OnEnd, after.OnEnd)
	}
}

// TestPagesOfAnotherTenant: a page token from one tenant's listing, given
// by another tenant, pages through the other tenant's own sandboxes only.
func TestPagesOfAnotherTenant(t *testing.T) {
	f := newFixture(t)
	for range 3 {
		f.create(`{"templateID":"base"}`)
	}
	// The other tenant's sandboxes, between acme's in time.
	r := f.do("POST", "/v2/sandboxes", f.other, `{"templateID":"base"}`)
	if r.status != http.StatusCreated {
		t.Fatalf("create as other: %d %s", r.status, r.body)
	}
	var theirs created
	r.decode(t, &theirs)
	f.clock.Advance(1)
	f.create(`{"templateID":"base"}`)

	page := f.do("GET", "/v2/sandboxes?limit=1", f.acme, "")
	token := page.header.Get("X-Next-Token")
	if token == "" {
		t.Fatal("no X-Next-Token on a first page of one")
	}
	for _, q := range []string{"?limit=100&nextToken=" + url.QueryEscape(token), "?nextToken=" + url.QueryEscape(token) + "&metadata=" + url.QueryEscape("k=v")} {
		r := f.do("GET", "/v2/sandboxes"+q, f.other, "")
		if r.status != 200 {
			t.Fatalf("%s as other: %d %s", q, r.status, r.body)
		}
		var l []detail
		r.decode(t, &l)
		for _, sb := range l {
			if sb.SandboxID != theirs.SandboxID {
				t.Fatalf("another tenant's page token showed acme's sandbox %s", sb.SandboxID)
			}
		}
	}
}
