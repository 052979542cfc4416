package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/client"
)

// uiCall is one request to the daemon's API listener as the dashboard's
// page would send it: with the session cookie (when set), the CSRF token
// (when set) and a JSON body (when set).
type uiCall struct {
	method, path, body string
	cookie, csrf       string
	accept             string
}

func (d *daemon) uiDo(t *testing.T, c uiCall) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(c.method, "http://"+d.addr+c.path, strings.NewReader(c.body))
	if err != nil {
		t.Fatal(err)
	}
	if c.body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.cookie != "" {
		req.AddCookie(&http.Cookie{Name: "torpor_session", Value: c.cookie})
	}
	if c.csrf != "" {
		req.Header.Set("X-CSRF-Token", c.csrf)
	}
	// As a browser says of the page's own requests.
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp, string(data)
}

// TestDashboardServer drives the dashboard's server side through the real
// binary: the page and its hashed assets with their policy and caching; a
// tenant key exchanged for a session cookie (HttpOnly, SameSite=Strict);
// the cookie reading the native API and streaming its events; a create
// refused without the CSRF token or with a wrong one and made with it,
// for the key's tenant; sign-out; a restart that ends every session; and
// the dashboard turned off. Neither an answer nor the daemon's log holds
// the key.
func TestDashboardServer(t *testing.T) {
	needs(t)
	bin := torporBin(t)
	dataDir := t.TempDir()
	d := startDaemon(t, bin, dataDir)
	key := strings.TrimSpace(d.ok("keys", "create", "--tenant", "acme"))
	var answers strings.Builder
	do := func(c uiCall) (*http.Response, string) {
		resp, body := d.uiDo(t, c)
		answers.WriteString(body)
		for k, v := range resp.Header {
			answers.WriteString(k + ": " + strings.Join(v, ",") + "\n")
		}
		return resp, body
	}

	// The page, its policy, and an asset under its hashed name.
	resp, page := do(uiCall{method: "GET", path: "/ui/"})
	if resp.StatusCode != 200 || !strings.Contains(resp.Header.Get("Content-Security-Policy"), "script-src 'self'") ||
		resp.Header.Get("Cache-Control") != "no-cache" || resp.Header.Get("X-Content-Type-Options") != "nosniff" {
		t.Fatalf("/ui/: %d %v", resp.StatusCode, resp.Header)
	}
	asset := regexp.MustCompile(`/ui/assets/[A-Za-z0-9_./-]+\.[0-9a-f]{16}\.js`).FindString(page)
	if asset == "" {
		t.Fatalf("the page names no hashed script:\n%s", page)
	}
	if resp, _ := do(uiCall{method: "GET", path: asset}); resp.StatusCode != 200 || resp.Header.Get("Cache-Control") != "public, max-age=31536000, immutable" ||
		!strings.HasPrefix(resp.Header.Get("Content-Type"), "text/javascript") {
		t.Errorf("%s: %d %v", asset, resp.StatusCode, resp.Header)
	}
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	if resp, err := noRedirect.Get("http://" + d.addr + "/ui"); err != nil || resp.StatusCode != 301 || resp.Header.Get("Location") != "/ui/" {
		t.Errorf("/ui: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}

	// Sign in with the tenant's key.
	if resp, _ := do(uiCall{method: "POST", path: "/ui/session", body: `{"key":"tpk_not-a-key"}`}); resp.StatusCode != 401 {
		t.Errorf("an unknown key signed in: %d", resp.StatusCode)
	}
	resp, body := do(uiCall{method: "POST", path: "/ui/session", body: `{"key":"` + key + `"}`})
	if resp.StatusCode != 200 {
		t.Fatalf("sign-in: %d %s", resp.StatusCode, body)
	}
	var sess struct {
		Tenant    string    `json:"tenant"`
		Admin     bool      `json:"admin"`
		CSRFToken string    `json:"csrf_token"`
		ExpiresAt time.Time `json:"expires_at"`
	}
	if err := json.Unmarshal([]byte(body), &sess); err != nil || sess.Tenant != "acme" || sess.Admin || sess.CSRFToken == "" ||
		sess.ExpiresAt.Before(time.Now().Add(11*time.Hour)) {
		t.Fatalf("session %s (%v)", body, err)
	}
	setCookie := resp.Header.Get("Set-Cookie")
	for _, want := range []string{"torpor_session=", "; Path=/", "; Max-Age=43200", "; HttpOnly", "; SameSite=Strict"} {
		if !strings.Contains(setCookie, want) {
			t.Errorf("the cookie lacks %q: %s", want, setCookie)
		}
	}
	var cookie string
	for _, c := range resp.Cookies() {
		if c.Name == "torpor_session" {
			cookie = c.Value
		}
	}

	// The cookie reads the API.
	if resp, body := do(uiCall{method: "GET", path: "/v1/sandboxes", cookie: cookie}); resp.StatusCode != 200 || !strings.Contains(body, `"sandboxes"`) {
		t.Fatalf("list by cookie: %d %s", resp.StatusCode, body)
	}
	if resp, body := do(uiCall{method: "GET", path: "/ui/session", cookie: cookie}); resp.StatusCode != 200 || !strings.Contains(body, sess.CSRFToken) {
		t.Errorf("describe: %d %s", resp.StatusCode, body)
	}
	// A create by cookie needs the token.
	create := uiCall{method: "POST", path: "/v1/sandboxes", body: `{"template":"base"}`, cookie: cookie}
	for _, csrf := range []string{"", "not-the-token"} {
		c := create
		c.csrf = csrf
		resp, body := do(c)
		if resp.StatusCode != 403 || !strings.Contains(body, `"code":"forbidden"`) || !strings.Contains(body, "CSRF token") {
			t.Errorf("a create with CSRF %q: %d %s", csrf, resp.StatusCode, body)
		}
	}
	acme, err := client.New("http://"+d.addr, key)
	if err != nil {
		t.Fatal(err)
	}
	if sbs, err := acme.List(context.Background(), client.ListOptions{All: true}); err != nil || len(sbs) != 0 {
		t.Fatalf("a refused create made a sandbox: %v %v", sbs, err)
	}
	c := create
	c.csrf = sess.CSRFToken
	resp, body = do(c)
	var sb torpor.Sandbox
	if resp.StatusCode != 201 || json.Unmarshal([]byte(body), &sb) != nil || sb.State != torpor.StateRunning {
		t.Fatalf("a create with the token: %d %s\n%s", resp.StatusCode, body, d.logs.String())
	}
	// It is acme's: acme's key sees it, and so do acme's events by cookie.
	if out, _, _ := d.cliEnv([]string{"TORPOR_API_KEY=" + key}, "ls"); !strings.Contains(out, sb.ID) {
		t.Errorf("acme's key does not list %s:\n%s", sb.ID, out)
	}
	func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", "http://"+d.addr+"/v1/events?since=0", nil)
		req.Header.Set("Accept", "text/event-stream")
		req.AddCookie(&http.Cookie{Name: "torpor_session", Value: cookie})
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Fatalf("events by cookie: %d", resp.StatusCode)
		}
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if strings.Contains(sc.Text(), sb.ID) {
				return
			}
		}
		t.Errorf("the event stream by cookie named no event of %s", sb.ID)
	}()
	c = uiCall{method: "DELETE", path: "/v1/sandboxes/" + sb.ID, cookie: cookie, csrf: sess.CSRFToken}
	if resp, body := do(c); resp.StatusCode < 200 || resp.StatusCode > 299 {
		t.Errorf("delete by cookie: %d %s", resp.StatusCode, body)
	}

	// Sign out: the cookie is cleared and refused after.
	if resp, _ := do(uiCall{method: "DELETE", path: "/ui/session", cookie: cookie}); resp.StatusCode != 403 {
		t.Errorf("sign-out without the token: %d", resp.StatusCode)
	}
	resp, _ = do(uiCall{method: "DELETE", path: "/ui/session", cookie: cookie, csrf: sess.CSRFToken})
	if resp.StatusCode != 204 || !strings.Contains(resp.Header.Get("Set-Cookie"), "Max-Age=0") {
		t.Errorf("sign-out: %d %v", resp.StatusCode, resp.Header)
	}
	if resp, _ := do(uiCall{method: "GET", path: "/v1/sandboxes", cookie: cookie}); resp.StatusCode != 401 {
		t.Errorf("the cookie after sign-out: %d", resp.StatusCode)
	}

	// Sessions live in the daemon's memory: a restart ends them.
	resp, body = do(uiCall{method: "POST", path: "/ui/session", body: `{"key":"` + key + `"}`})
	if resp.StatusCode != 200 {
		t.Fatalf("sign-in again: %d %s", resp.StatusCode, body)
	}
	cookie = resp.Cookies()[0].Value
	d.stop()
	logs := d.logs.String()
	d = startDaemon(t, bin, dataDir)
	if resp, _ := do(uiCall{method: "GET", path: "/v1/sandboxes", cookie: cookie}); resp.StatusCode != 401 {
		t.Errorf("a session after a restart: %d", resp.StatusCode)
	}
	d.stop()
	logs += d.logs.String()

	// Turned off, there is no page, no sign-in and no cookie.
	d = startDaemon(t, bin, dataDir, "TORPOR_UI=false")
	for _, c := range []uiCall{{method: "GET", path: "/ui/"}, {method: "POST", path: "/ui/session", body: `{"key":"` + key + `"}`}} {
		if resp, body := do(c); resp.StatusCode != 404 || resp.Header.Get("Set-Cookie") != "" {
			t.Errorf("%s %s with the dashboard off: %d %s", c.method, c.path, resp.StatusCode, body)
		}
	}
	d.stop()
	logs += d.logs.String()

	secret := strings.TrimPrefix(key, torpor.KeyPrefix)
	if strings.Contains(answers.String(), secret) {
		t.Errorf("an answer holds the key")
	}
	if strings.Contains(logs, secret) {
		t.Errorf("the daemon's log holds the key")
	}
}
