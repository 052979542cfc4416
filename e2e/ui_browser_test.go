package e2e

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/browser"
	"github.com/chromedp/cdproto/emulation"
	cdplog "github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/page"
	cdpruntime "github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/wire"
	"github.com/torpor-dev/torpor/client"
)

// The dashboard's tests drive headless Chromium (Debian's chromium
// package) against the real daemon and real runc sandboxes, as a user
// would: they sign in, watch sandboxes change live, act on them and read
// what the page shows.

// chromiumPath finds the browser, or skips.
func chromiumPath(t testing.TB) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	t.Skip("needs chromium for the dashboard's browser tests (apt-get install chromium)")
	return ""
}

// uiBrowser is one headless browser with one tab, and what the tab did
// that a test must know: dialogs it opened, script errors, and the
// Content-Security-Policy violations the console reported.
type uiBrowser struct {
	t        testing.TB
	ctx      context.Context
	base     string
	dialogs  atomic.Int32
	mu       sync.Mutex
	problems []string
	downDir  string
}

func newUIBrowser(t testing.TB, base string) *uiBrowser {
	t.Helper()
	path := chromiumPath(t)
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path),
		// Root cannot run Chromium's sandbox; the test's pages are its own.
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.WindowSize(1280, 800),
		chromedp.UserDataDir(t.TempDir()),
	)
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	b := &uiBrowser{t: t, base: base, downDir: t.TempDir()}
	ctx, cancel := chromedp.NewContext(actx, chromedp.WithListener(b.listen))
	t.Cleanup(func() { cancel(); cancelA() })
	b.ctx = ctx
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("starting chromium: %v", err)
	}
	if _, err := chromedp.Call(ctx, cdplog.Enable, struct{}{}); err != nil {
		t.Fatalf("enabling the console log: %v", err)
	}
	if _, err := chromedp.CallBrowser(ctx, browser.SetDownloadBehavior, browser.SetDownloadBehaviorParams{
		Behavior: browser.SetDownloadBehaviorBehaviorAllow, DownloadPath: b.downDir,
	}); err != nil {
		t.Fatalf("allowing downloads: %v", err)
	}
	// A dialog would block the page: count it and dismiss it.
	dialogs := chromedp.Events(ctx, page.JavascriptDialogOpening)
	go func() {
		for _, err := range dialogs {
			if err != nil {
				return
			}
			_, _ = chromedp.Call(ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: false})
		}
	}()
	return b
}

// listen runs in the tab's message loop: it only records.
func (b *uiBrowser) listen(ev any) {
	switch ev := ev.(type) {
	case *page.EventJavascriptDialogOpening:
		b.dialogs.Add(1)
		b.problem("a dialog opened: " + ev.Message)
	case *cdpruntime.EventExceptionThrown:
		d := ev.ExceptionDetails
		msg := d.Text
		if d.Exception != nil && d.Exception.Description != "" {
			msg += " " + d.Exception.Description
		}
		b.problem("script error: " + msg)
	case *cdplog.EventEntryAdded:
		if strings.Contains(ev.Entry.Text, "Content Security Policy") {
			b.problem("CSP violation: " + ev.Entry.Text)
		}
	}
}

func (b *uiBrowser) problem(s string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.problems = append(b.problems, s)
}

// checkClean fails the test on any script error, dialog or CSP violation
// seen so far.
func (b *uiBrowser) checkClean() {
	b.t.Helper()
	b.mu.Lock()
	defer b.mu.Unlock()
	if len(b.problems) > 0 {
		b.t.Fatalf("the page misbehaved:\n%s", strings.Join(b.problems, "\n"))
	}
}

// do runs steps within a deadline.
func (b *uiBrowser) do(what string, steps ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 60*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, steps...); err != nil {
		b.t.Fatalf("%s: %v", what, err)
	}
}

// uiEval evaluates js in the page (awaiting a promise) and decodes its value.
func uiEval[T any](b *uiBrowser, js string) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 60*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](js, chromedp.EvalAwaitPromise))
	if err != nil {
		b.t.Fatalf("evaluating %s: %v", js, err)
	}
	return v
}

// waitJS polls a JavaScript condition until it holds; the page is never
// reloaded, so what it shows came from the live stream.
func (b *uiBrowser) waitJS(what, cond string) {
	b.t.Helper()
	deadline := time.Now().Add(45 * time.Second)
	for {
		ok, err := chromedp.Run(b.ctx, chromedp.Evaluate[bool]("!!("+cond+")"))
		if err == nil && ok {
			return
		}
		if time.Now().After(deadline) {
			body, _ := chromedp.Run(b.ctx, chromedp.Evaluate[string]("document.body.innerText"))
			b.mu.Lock()
			problems := strings.Join(b.problems, "\n")
			b.mu.Unlock()
			b.t.Fatalf("waiting for %s (%s): %v\nthe page shows:\n%s\nscript errors, dialogs, CSP violations:\n%s", what, cond, err, body, problems)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// route moves the page to a hash route (no reload).
func (b *uiBrowser) route(hash string) {
	b.t.Helper()
	uiEval[bool](b, "location.hash = "+strconv.Quote(hash)+", true")
}

func (b *uiBrowser) screenshot(dir, name string) {
	b.t.Helper()
	png, err := chromedp.Run(b.ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.WriteFile(filepath.Join(dir, name), png, 0o644); err != nil {
		b.t.Fatal(err)
	}
}

// signIn signs in through the form.
func (b *uiBrowser) signIn(key string) {
	b.t.Helper()
	b.do("opening the dashboard", chromedp.Navigate(b.base+"/ui/"))
	b.waitJS("the sign-in form", `!document.getElementById("signin").hidden`)
	b.do("typing the key", chromedp.SendKeys(chromedp.ID("key"), key), chromedp.Click(chromedp.ID("signin-submit")))
	b.waitJS("the signed-in page", `!document.getElementById("nav").hidden && document.body.dataset.listReady === "1"`)
}

// uiScreenshotDir is where screenshots go: $TORPOR_UI_SCREENSHOTS, else a
// temporary directory of the test.
func uiScreenshotDir(t testing.TB) string {
	if d := os.Getenv("TORPOR_UI_SCREENSHOTS"); d != "" {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	return t.TempDir()
}

// tenantClient makes a tenant and a key for it, and returns the key and a
// client with it.
func tenantClient(t testing.TB, d *daemon, tenant string) (string, *client.Client) {
	t.Helper()
	k, err := d.client(t).CreateKey(context.Background(), wire.KeyRequest{Tenant: tenant})
	if err != nil {
		t.Fatal(err)
	}
	cl, err := client.New("http://"+d.addr, k.Key)
	if err != nil {
		t.Fatal(err)
	}
	// The daemon's own clean-up deletes the admin's tenant's sandboxes
	// only: delete this tenant's first (clean-ups run last first).
	t.Cleanup(func() {
		sbs, _ := cl.List(context.Background(), client.ListOptions{})
		for _, sb := range sbs {
			_, _ = cl.Delete(context.Background(), sb.ID)
		}
	})
	return k.Key, cl
}

const xssValue = `<img src=x onerror=alert(1)>`

// step names a step of a browser test in its log. The steps share one
// browser and one signed-in page, so they are not subtests: each needs
// the page as the one before left it.
func step(t *testing.T, name string) {
	t.Helper()
	t.Logf("step: %s", name)
}

// TestUIBrowser is the dashboard's tour in a real browser.
func TestUIBrowser(t *testing.T) {
	needs(t)
	chromiumPath(t)
	ctx := context.Background()
	// The webhooks view shows a failing endpoint: a loopback receiver
	// answering 500, which webhooks reach only when allowed.
	dataDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dataDir, "torpor.toml"), []byte("webhook_allow_cidrs = [\"127.0.0.0/8\"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	failingHook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusInternalServerError) }))
	defer failingHook.Close()
	d := startDaemon(t, torporBin(t), dataDir)
	shots := uiScreenshotDir(t)
	key, cl := tenantClient(t, d, "acme")
	_, other := tenantClient(t, d, "globex")
	hook, err := cl.CreateWebhook(ctx, failingHook.URL+"/hook")
	if err != nil {
		t.Fatal(err)
	}

	theirs, err := other.Create(ctx, torpor.CreateRequest{Template: "base", Metadata: map[string]string{"owner": "globex"}})
	if err != nil {
		t.Fatal(err)
	}
	first, err := cl.Create(ctx, torpor.CreateRequest{Template: "base", Metadata: map[string]string{"team": "ui"}})
	if err != nil {
		t.Fatal(err)
	}

	// cliAs runs the CLI with the tenant's key and returns its output.
	cliAs := func(args ...string) string {
		t.Helper()
		out, errs, code := d.cliEnv([]string{"TORPOR_API_KEY=" + key}, args...)
		if code != 0 {
			t.Fatalf("torpor %s: exit %d\n%s%s", strings.Join(args, " "), code, out, errs)
		}
		return out
	}

	b := newUIBrowser(t, "http://"+d.addr)
	b.signIn(key)

	step(t, "the key is kept nowhere in the page")
	{
		kept := uiEval[bool](b, `(() => {
			const k = `+strconv.Quote(key)+`;
			return document.documentElement.outerHTML.includes(k) || location.href.includes(k) ||
				localStorage.length > 0 || sessionStorage.length > 0 || document.getElementById("key").value !== "" ||
				document.cookie.includes("torpor_session");
		})()`)
		if kept {
			t.Fatal("the API key (or the session cookie) is readable in the page")
		}
	}

	step(t, "a sandbox created through the API appears live")
	{
		b.waitJS("the first sandbox", `document.querySelector('tr[data-id="`+first.ID+`"]')`)
		sb, err := cl.Create(ctx, torpor.CreateRequest{Template: "base", Metadata: map[string]string{"note": xssValue}})
		if err != nil {
			t.Fatal(err)
		}
		b.waitJS("the new sandbox's row", `document.querySelector('tr[data-id="`+sb.ID+`"] .badge.running')`)
		// The metadata value is shown as text, and made no element.
		text := uiEval[string](b, `document.querySelector('tr[data-id="`+sb.ID+`"] td.meta').textContent`)
		if !strings.Contains(text, xssValue) {
			t.Fatalf("the metadata cell shows %q, want the value %q as text", text, xssValue)
		}
		if n := uiEval[int](b, `document.querySelectorAll("img").length`); n != 0 {
			t.Fatalf("the page has %d img elements: a metadata value became markup", n)
		}
		if n := b.dialogs.Load(); n != 0 {
			t.Fatalf("%d dialogs opened", n)
		}
		// One from the CLI too.
		fromCLI := strings.TrimSpace(cliAs("create", "--template", "base"))
		b.waitJS("the CLI's sandbox", `document.querySelector('tr[data-id="`+fromCLI+`"] .badge.running')`)
		b.waitJS("the counts", `document.querySelector('#counts button[data-state="running"] .n').textContent === "3"`)
		cliAs("rm", fromCLI)
		b.waitJS("the CLI's sandbox gone", `!document.querySelector('tr[data-id="`+fromCLI+`"]')`)
		b.waitJS("the counts", `document.querySelector('#counts button[data-state="running"] .n').textContent === "2"`)
	}

	step(t, "another tenant's sandboxes are not visible")
	{
		if uiEval[bool](b, `document.body.innerText.includes(`+strconv.Quote(theirs.ID)+`)`) {
			t.Fatal("the page shows another tenant's sandbox")
		}
		status := uiEval[int](b, `fetch("/v1/sandboxes/`+theirs.ID+`", {credentials: "same-origin"}).then(r => r.status)`)
		if status != http.StatusNotFound {
			t.Fatalf("reading another tenant's sandbox with the session: %d, want 404", status)
		}
	}
	b.screenshot(shots, "sandbox-list.png")

	step(t, "pause and start from the page")
	{
		b.route("#/sandbox/" + first.ID)
		b.waitJS("the sandbox's page", `document.body.dataset.detailReady === "`+first.ID+`"`)
		b.do("pausing", chromedp.Click(chromedp.CSS(`#d-actions button[data-act="pause"][data-mode="freeze"]`)))
		b.waitJS("the paused badge", `document.getElementById("d-badge").textContent === "paused"`)
		b.waitJS("the pause on the timeline", `document.querySelector('#d-transitions li[data-to="paused"]') && document.querySelector('#d-timeline rect[data-state="paused"]')`)
		cause := uiEval[string](b, `document.querySelector('#d-transitions li[data-to="paused"] .cause').textContent`)
		if !strings.Contains(cause, "user verb") {
			t.Fatalf("the pause's cause reads %q, want a user verb", cause)
		}
		if got, err := cl.Get(ctx, first.ID); err != nil {
			t.Fatal(err)
		} else if got.State != torpor.StatePaused {
			t.Fatalf("the daemon says %s after the page paused it", got.State)
		}
		b.do("starting", chromedp.Click(chromedp.CSS(`#d-actions button[data-act="start"]`)))
		b.waitJS("the running badge", `document.getElementById("d-badge").textContent === "running"`)
		b.waitJS("the resume on the timeline", `document.querySelectorAll('#d-transitions li[data-to="running"]').length >= 2`)
		// A pause from the CLI reaches the open page through the stream.
		cliAs("pause", first.ID)
		b.waitJS("the CLI's pause on the page", `document.getElementById("d-badge").textContent === "paused" && document.querySelectorAll('#d-transitions li[data-to="paused"]').length >= 2`)
		cliAs("start", first.ID)
		b.waitJS("running again", `document.getElementById("d-badge").textContent === "running"`)
	}

	step(t, "exec output streams into the page")
	{
		b.do("typing a command", chromedp.SetValue(chromedp.ID("exec-cmd"), `echo first; sleep 2; echo second; sleep 0.5; echo oops >&2`),
			chromedp.Click(chromedp.ID("exec-run")))
		// The first line shows while the command still runs.
		b.waitJS("the first line", `document.getElementById("exec-out").textContent.includes("first")`)
		if !uiEval[bool](b, `document.getElementById("exec-status").textContent === "running…" && !document.getElementById("exec-out").textContent.includes("second")`) {
			t.Fatal("the first line came only with the end of the command: the output did not stream")
		}
		b.waitJS("the exit", `document.getElementById("exec-status").dataset.exit === "0"`)
		out := uiEval[string](b, `document.getElementById("exec-out").textContent`)
		errOut := uiEval[string](b, `document.querySelector("#exec-out .stderr").textContent`)
		if out != "first\nsecond\noops\n" || errOut != "oops\n" {
			t.Fatalf("exec output %q (stderr %q)", out, errOut)
		}
	}

	step(t, "a file uploads and downloads intact")
	{
		data := make([]byte, 300<<10)
		_, _ = rand.Read(data)
		local := filepath.Join(t.TempDir(), "blob.bin")
		if err := os.WriteFile(local, data, 0o644); err != nil {
			t.Fatal(err)
		}
		b.do("listing /tmp", chromedp.SetValue(chromedp.ID("fs-path"), "/tmp"), chromedp.Click(chromedp.ID("fs-go")))
		b.waitJS("the listing of /tmp", `document.getElementById("fs-path").value === "/tmp" && document.getElementById("fs-error").textContent === ""`)
		b.do("uploading", chromedp.SetUploadFiles(chromedp.ID("fs-upload"), []string{local}))
		b.waitJS("the uploaded file in the listing", `document.body.dataset.uploaded === "blob.bin" && document.querySelector('#fs-rows tr[data-name="blob.bin"] a.download')`)
		rc, err := cl.ReadFile(ctx, first.ID, "/tmp/blob.bin")
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(rc)
		rc.Close()
		if err != nil || !bytes.Equal(got, data) {
			t.Fatalf("the sandbox holds %d bytes (err %v), want the %d uploaded", len(got), err, len(data))
		}
		b.do("downloading", chromedp.Click(chromedp.CSS(`#fs-rows tr[data-name="blob.bin"] a.download`)))
		waitDownload(t, filepath.Join(b.downDir, "blob.bin"), data)
	}

	b.screenshot(shots, "sandbox-page.png")

	step(t, "an idle policy pauses a sandbox and the page says why")
	{
		sb, err := cl.Create(ctx, torpor.CreateRequest{Template: "base", PolicyRequest: torpor.PolicyRequest{
			Timeout: torpor.OptSeconds{Set: true, Value: 2}, Lifecycle: &torpor.Lifecycle{OnTimeout: "pause"},
		}})
		if err != nil {
			t.Fatal(err)
		}
		b.route("#/sandbox/" + sb.ID)
		b.waitJS("the idle sandbox's page", `document.body.dataset.detailReady === "`+sb.ID+`"`)
		b.waitJS("the idle pause", `document.getElementById("d-badge").textContent === "paused" && document.querySelector('#d-transitions li[data-to="paused"]')`)
		cause := uiEval[string](b, `document.querySelector('#d-transitions li[data-to="paused"] .cause').textContent`)
		if !strings.Contains(cause, "idle policy") {
			t.Fatalf("the idle pause's cause reads %q, want the idle policy", cause)
		}
		b.screenshot(shots, "sandbox-idle.png")
		b.route("#/")
		b.waitJS("the paused row in the list", `document.querySelector('tr[data-id="`+sb.ID+`"] .badge.paused')`)
	}

	step(t, "a state-changing request without the CSRF token is refused")
	{
		without := uiEval[int](b, `fetch("/v1/sandboxes/`+first.ID+`/touch", {method: "POST", credentials: "same-origin",
			headers: {"Content-Type": "application/json"}, body: "{}"}).then(r => r.status)`)
		if without != http.StatusForbidden {
			t.Fatalf("a touch without the CSRF token: %d, want 403", without)
		}
		wrong := uiEval[int](b, `fetch("/v1/sandboxes/`+first.ID+`/touch", {method: "POST", credentials: "same-origin",
			headers: {"Content-Type": "application/json", "X-CSRF-Token": "not-the-token"}, body: "{}"}).then(r => r.status)`)
		if wrong != http.StatusForbidden {
			t.Fatalf("a touch with a wrong CSRF token: %d, want 403", wrong)
		}
		// The page's own requests carry it: the same touch from the page
		// works.
		b.route("#/sandbox/" + first.ID)
		b.waitJS("the sandbox's page", `document.body.dataset.detailReady === "`+first.ID+`" && !document.querySelector('#d-actions button[data-act="touch"]').disabled`)
		b.do("touching", chromedp.Click(chromedp.CSS(`#d-actions button[data-act="touch"]`)))
		b.waitJS("the touch", `document.getElementById("d-progress").textContent === "touched"`)
	}

	step(t, "usage")
	{
		b.route("#/usage")
		b.waitJS("the usage chart", `document.querySelector("#u-chart svg") && document.querySelectorAll("#u-rows tr").length > 0`)
		b.screenshot(shots, "usage.png")
		b.do("downloading the CSV", chromedp.Click(chromedp.ID("u-csv")))
		csv := waitDownloadPrefix(t, b.downDir, "torpor-usage-")
		if !strings.HasPrefix(csv, "day,running_s,frozen_s,snapshot_paused_s,hibernated_s,") || strings.Count(csv, "\n") < 2 {
			t.Fatalf("the usage CSV reads %q", csv)
		}
	}

	step(t, "the other views load")
	{
		for _, v := range []struct{ hash, cond string }{
			{"#/templates", `[...document.querySelectorAll("#t-rows td")].some(td => td.textContent === "base")`},
			{"#/capacity", `document.querySelector("#c-bars .bar") && document.querySelector("#c-runtimes li")`},
		} {
			b.route(v.hash)
			b.waitJS(v.hash, v.cond)
		}
	}

	step(t, "webhooks with their delivery state")
	{
		// The sandboxes made since the webhook was registered are events
		// its receiver refused.
		waitUntil(t, "a failed delivery", func() bool {
			hooks, err := cl.Webhooks(ctx)
			return err == nil && len(hooks) == 1 && hooks[0].Delivery != nil && hooks[0].Delivery.ConsecutiveFailures > 0
		})
		b.route("#/webhooks")
		row := `document.querySelector('#w-rows tr[data-id="` + hook.ID + `"]')`
		b.waitJS("the failing webhook", row+` && `+row+`.classList.contains("failing") && `+row+`.querySelector(".badge.failed").textContent === "failing"`)
		b.waitJS("its delivery columns", row+`.querySelector("td.delivered").textContent === "0" && Number(`+row+`.querySelector("td.behind").textContent) >= 1 && `+
			row+`.querySelector("td.last").textContent.endsWith("· 500") && Number(`+row+`.querySelector("td.failures").textContent) >= 1 && `+
			`/^in |ago$/.test(`+row+`.querySelector("td.retry").textContent)`)
		b.screenshot(shots, "webhooks.png")
	}

	step(t, "the list with sandboxes in several states")
	{
		// One that hibernates when idle shows what is planned for it; one
		// more is hibernated.
		later, err := cl.Create(ctx, torpor.CreateRequest{Template: "base", Metadata: map[string]string{"team": "ml"},
			PolicyRequest: torpor.PolicyRequest{Timeout: torpor.OptSeconds{Set: true, Value: 900}, Lifecycle: &torpor.Lifecycle{OnTimeout: "hibernate"}}})
		if err != nil {
			t.Fatal(err)
		}
		asleep, err := cl.Create(ctx, torpor.CreateRequest{Template: "base", Metadata: map[string]string{"team": "ml", "job": "nightly"}})
		if err != nil {
			t.Fatal(err)
		}
		if _, err := cl.Hibernate(ctx, asleep.ID); err != nil {
			t.Fatal(err)
		}
		b.route("#/")
		b.waitJS("the planned hibernation", `document.querySelector('tr[data-id="`+later.ID+`"] td.next').textContent.startsWith("hibernate in")`)
		b.waitJS("the hibernated badge", `document.querySelector('tr[data-id="`+asleep.ID+`"] .badge.hibernated')`)
		b.screenshot(shots, "sandbox-list-states.png")
	}

	step(t, "in dark mode")
	{
		dark := func(on bool) {
			f := []*emulation.MediaFeature{{Name: "prefers-color-scheme", Value: "light"}}
			if on {
				f[0].Value = "dark"
			}
			if _, err := chromedp.Call(b.ctx, emulation.SetEmulatedMedia, emulation.SetEmulatedMediaParams{Features: f}); err != nil {
				t.Fatal(err)
			}
		}
		dark(true)
		bg := uiEval[string](b, `getComputedStyle(document.body).backgroundColor`)
		if bg != "rgb(22, 24, 28)" {
			t.Fatalf("the page's background in dark mode is %s, want the dark one", bg)
		}
		b.screenshot(shots, "sandbox-list-dark.png")
		dark(false)
	}

	step(t, "at phone width")
	{
		b.route("#/")
		b.do("a phone's viewport", chromedp.EmulateViewport(390, 844))
		b.waitJS("the list", `document.querySelector('tr[data-id="`+first.ID+`"]')`)
		if w := uiEval[int](b, `document.documentElement.scrollWidth`); w > 390 {
			t.Fatalf("the page is %d px wide at a 390 px viewport: it scrolls sideways", w)
		}
		b.screenshot(shots, "sandbox-list-phone.png")
		b.do("back to 1280x800", chromedp.EmulateViewport(1280, 800))
	}

	b.checkClean()

	step(t, "sign-out ends the session")
	{
		b.do("signing out", chromedp.Click(chromedp.ID("signout")))
		b.waitJS("the sign-in form", `!document.getElementById("signin").hidden`)
		for _, path := range []string{"/v1/sandboxes", "/ui/session"} {
			if s := uiEval[int](b, `fetch("`+path+`", {credentials: "same-origin"}).then(r => r.status)`); s != http.StatusUnauthorized {
				t.Fatalf("GET %s after sign-out: %d, want 401", path, s)
			}
		}
		if uiEval[bool](b, `document.getElementById("sb-rows").childElementCount > 0`) {
			t.Fatal("the list still shows sandboxes after sign-out")
		}
	}
	t.Logf("screenshots in %s", shots)
}

// waitDownload waits for the browser to finish writing path and checks
// its bytes.
func waitDownload(t *testing.T, path string, want []byte) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		got, err := os.ReadFile(path)
		if err == nil && bytes.Equal(got, want) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the download %s: %d bytes (err %v), want %d", path, len(got), err, len(want))
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// waitDownloadPrefix waits for a finished download whose name starts with
// prefix and returns its text.
func waitDownloadPrefix(t *testing.T, dir, prefix string) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		ents, _ := os.ReadDir(dir)
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), prefix) && !strings.HasSuffix(e.Name(), ".crdownload") {
				b, err := os.ReadFile(filepath.Join(dir, e.Name()))
				if err == nil && len(b) > 0 {
					return string(b)
				}
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no download named %s* in %s", prefix, dir)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// TestUIListSpeed measures the sandbox list with many sandboxes (1,000;
// TORPOR_UI_BENCH_SANDBOXES changes it) in headless Chromium against the
// same list read by a plain HTTP GET, and a live update of the page
// against the same event read from the stream by a plain HTTP client. It
// runs under TORPOR_UI_BENCH=1 only: it creates that many runc sandboxes.
// The figures go to the log (BENCHMARKS.md, "The dashboard").
func TestUIListSpeed(t *testing.T) {
	if os.Getenv("TORPOR_UI_BENCH") != "1" {
		t.Skip("set TORPOR_UI_BENCH=1 to measure the dashboard's list (it creates 1,000 sandboxes)")
	}
	needs(t)
	chromiumPath(t)
	n := 1000
	if v := os.Getenv("TORPOR_UI_BENCH_SANDBOXES"); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			t.Fatalf("TORPOR_UI_BENCH_SANDBOXES=%q", v)
		}
	}
	const memMiB, diskMiB = 16, 64
	env := append(stormNetwork(t),
		"TORPOR_CAPACITY_VCPUS="+strconv.Itoa(n+16),
		"TORPOR_CAPACITY_MEMORY_MIB="+strconv.Itoa(2*memMiB*(n+16)))
	d := startDaemon(t, torporBin(t), t.TempDir(), env...)
	key, cl := tenantClient(t, d, "bench")
	ctx := context.Background()

	// Create the sandboxes, a few at a time.
	start := time.Now()
	ids := make([]string, n)
	var wg sync.WaitGroup
	var failed atomic.Value
	sem := make(chan struct{}, 4)
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			sb, err := cl.Create(ctx, torpor.CreateRequest{Template: "base",
				Resources: &torpor.Resources{VCPUs: 1, MemoryMiB: memMiB, DiskMiB: diskMiB},
				Metadata:  map[string]string{"n": strconv.Itoa(i), "team": []string{"ml", "web", "data"}[i%3]}})
			if err != nil {
				failed.Store(err)
				return
			}
			ids[i] = sb.ID
		}()
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		t.Fatalf("creating %d sandboxes: %v", n, err)
	}
	t.Logf("created %d sandboxes in %s", n, time.Since(start).Round(time.Second))

	// The baseline: the list by plain HTTP, as curl reads it.
	hc := &http.Client{}
	getList := func(query string) (time.Duration, int) {
		req, _ := http.NewRequest("GET", "http://"+d.addr+"/v1/sandboxes"+query, nil)
		req.Header.Set("Authorization", "Bearer "+key)
		t0 := time.Now()
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("GET /v1/sandboxes: %d %v", resp.StatusCode, err)
		}
		return time.Since(t0), len(body)
	}
	getList("") // warm
	getList("?limit=100")

	b := newUIBrowser(t, "http://"+d.addr)
	b.signIn(key)
	const rounds = 5
	var curl, curlPage, page, pageData, cursorT, listT, renderT, whole, rest []time.Duration
	size := 0
	for range rounds {
		c, sz := getList("")
		curl, size = append(curl, c), sz
		// The first page alone, as the page reads it first.
		c, _ = getList("?limit=100")
		curlPage = append(curlPage, c)
		// A fresh load of the page, signed in by its cookie: from the
		// navigation to the first page of rows on screen.
		b.do("reloading", chromedp.Navigate("about:blank"), chromedp.Navigate(b.base+"/ui/#/"))
		b.waitJS("the list", `document.body.dataset.listReady === "1"`)
		// Then the rest of the list, read behind the first page.
		b.waitJS("the whole list", `document.body.dataset.listComplete === "1"`)
		whole = append(whole, ms2d(uiEval[float64](b, `window.torporTimings.wholeListMs`)))
		rest = append(rest, ms2d(uiEval[float64](b, `window.torporTimings.restMs`)))
		first := uiEval[float64](b, `window.torporTimings.listRenderedMs`)
		parts := uiEval[[]float64](b, `[window.torporTimings.cursorMs, window.torporTimings.listMs, window.torporTimings.renderMs]`)
		cursorT, listT, renderT = append(cursorT, ms2d(parts[0])), append(listT, ms2d(parts[1])), append(renderT, ms2d(parts[2]))
		nav := uiEval[float64](b, `(() => { const n = performance.getEntriesByType("navigation")[0]; return window.torporTimings.firstRenderAt - n.startTime; })()`)
		page = append(page, ms2d(nav))
		pageData = append(pageData, ms2d(first))
	}
	rows := uiEval[int](b, `document.querySelectorAll("#sb-rows tr").length`)
	if rows == 0 {
		t.Fatal("the page shows no rows")
	}

	// A live update: pause the oldest sandbox (on the first page) and
	// time the badge against the event on a plain stream.
	target := ids[0]
	var stream, badge, inPage []time.Duration
	for i := range rounds * 2 {
		want := "paused"
		if i%2 == 1 {
			want = "running"
		}
		evc := make(chan time.Time, 1)
		sctx, cancel := context.WithCancel(ctx)
		ready := make(chan struct{})
		go followOne(sctx, "http://"+d.addr, key, target, want, ready, evc)
		<-ready
		// The page watches the row's badge from now on.
		uiEval[bool](b, `(() => { window.__seen = new Promise(res => {
			const check = () => { const e = document.querySelector('tr[data-id="`+target+`"] .badge'); return e && e.textContent === "`+want+`"; };
			const mo = new MutationObserver(() => { if (check()) { mo.disconnect(); res(true); } });
			mo.observe(document.getElementById("sb-rows"), {subtree: true, childList: true, characterData: true});
		}); return true; })()`)
		seen := make(chan time.Time, 1)
		go func() {
			v, err := chromedp.Run(b.ctx, chromedp.Evaluate[bool](`window.__seen`, chromedp.EvalAwaitPromise))
			if err == nil && v {
				seen <- time.Now()
			}
		}()
		t0 := time.Now()
		var err error
		if want == "paused" {
			_, err = cl.Pause(ctx, target, "")
		} else {
			_, err = cl.Start(ctx, target)
		}
		if err != nil {
			t.Fatal(err)
		}
		select {
		case at := <-evc:
			stream = append(stream, at.Sub(t0))
		case <-time.After(30 * time.Second):
			t.Fatal("the plain stream saw no event")
		}
		select {
		case at := <-seen:
			badge = append(badge, at.Sub(t0))
		case <-time.After(30 * time.Second):
			t.Fatal("the page's badge did not change")
		}
		inPage = append(inPage, ms2d(uiEval[float64](b, `window.torporTimings.lastRowAt - window.torporTimings.lastEventAt`)))
		cancel()
	}
	b.checkClean()
	med := func(ds []time.Duration) time.Duration {
		s := append([]time.Duration(nil), ds...)
		for i := range s {
			for j := i + 1; j < len(s); j++ {
				if s[j] < s[i] {
					s[i], s[j] = s[j], s[i]
				}
			}
		}
		return s[len(s)/2]
	}
	ms := func(x time.Duration) string { return fmt.Sprintf("%.1f ms", float64(x)/float64(time.Millisecond)) }
	t.Logf("%d sandboxes (%d KiB of JSON), medians of %d rounds:", n, size>>10, rounds)
	t.Logf("  list by plain HTTP GET: %s; its first page (?limit=100): %s", ms(med(curl)), ms(med(curlPage)))
	t.Logf("  page, navigation to first rows on screen: %s (%.1fx the GET)", ms(med(page)), float64(med(page))/float64(med(curl)))
	t.Logf("  page, its data requests + render: %s (%.1fx the GET): cursor %s, list %s, render %s", ms(med(pageData)), float64(med(pageData))/float64(med(curl)),
		ms(med(cursorT)), ms(med(listT)), ms(med(renderT)))
	t.Logf("  page, its first page's request alone: %s (%.2fx the first page by GET); the whole list in, from the cursor read: %s (%.2fx the whole GET; the reads after the first page %s)",
		ms(med(listT)), float64(med(listT))/float64(med(curlPage)), ms(med(whole)), float64(med(whole))/float64(med(curl)), ms(med(rest)))
	t.Logf("  live update, verb to event on a plain stream: %s; to the page's badge: %s (%.2fx; event to row in the page %s); %d rounds",
		ms(med(stream)), ms(med(badge)), float64(med(badge))/float64(med(stream)), ms(med(inPage)), len(badge))
}

// ms2d turns the page's milliseconds into a duration.
func ms2d(ms float64) time.Duration { return time.Duration(ms * float64(time.Millisecond)) }

// followOne follows the events stream by plain HTTP and reports when the
// first event that puts sandbox id in state want arrives.
func followOne(ctx context.Context, base, key, id, want string, ready chan<- struct{}, at chan<- time.Time) {
	req, _ := http.NewRequestWithContext(ctx, "GET", base+"/v1/events?since="+latestSeq(ctx, base, key), nil)
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Accept", "text/event-stream")
	resp, err := http.DefaultClient.Do(req)
	close(ready)
	if err != nil {
		return
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		var ev torpor.Event
		if json.Unmarshal([]byte(data), &ev) != nil || ev.SandboxID != id {
			continue
		}
		if (want == "paused" && ev.Type == torpor.EventPaused) || (want == "running" && ev.Type == torpor.EventResumed) {
			at <- time.Now()
			return
		}
	}
}

// latestSeq is the cursor of the newest event, paging to the end.
func latestSeq(ctx context.Context, base, key string) string {
	since := int64(0)
	for {
		req, _ := http.NewRequestWithContext(ctx, "GET", base+"/v1/events?limit=10000&since="+strconv.FormatInt(since, 10), nil)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return strconv.FormatInt(since, 10)
		}
		var l wire.EventList
		err = json.NewDecoder(resp.Body).Decode(&l)
		resp.Body.Close()
		if err != nil {
			return strconv.FormatInt(since, 10)
		}
		since = l.Next
		if len(l.Events) < 10000 {
			return strconv.FormatInt(since, 10)
		}
	}
}

// TestUIBrowserAdmin signs in with the admin key: the list shows every
// tenant's sandboxes with a tenant column and follows them live, the
// tenant filter narrows them, and a tenant's sandbox's page reads and acts
// on it as that tenant (docs/dashboard.md).
func TestUIBrowserAdmin(t *testing.T) {
	needs(t)
	chromiumPath(t)
	ctx := context.Background()
	d := startDaemon(t, torporBin(t), t.TempDir())
	_, acme := tenantClient(t, d, "acme")
	_, globex := tenantClient(t, d, "globex")
	admin := d.client(t)

	ours, err := acme.Create(ctx, torpor.CreateRequest{Template: "base", Metadata: map[string]string{"owner": "acme"}})
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := globex.Create(ctx, torpor.CreateRequest{Template: "base", Metadata: map[string]string{"owner": "globex"}})
	if err != nil {
		t.Fatal(err)
	}
	mine, err := admin.Create(ctx, torpor.CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := acme.Update(ctx, ours.ID, torpor.UpdateRequest{Ports: &[]torpor.PortSpec{{Port: 8080, Public: true}}}); err != nil {
		t.Fatal(err)
	}
	rowSel := func(id string) string { return `document.querySelector('tr[data-id="` + id + `"]')` }
	b := newUIBrowser(t, "http://"+d.addr)
	b.signIn(d.key)

	step(t, "every tenant's sandboxes, with a tenant column")
	{
		for _, id := range []string{ours.ID, theirs.ID, mine.ID} {
			b.waitJS("the row of "+id, rowSel(id))
		}
		if !uiEval[bool](b, `!document.getElementById("th-tenant").hidden`) {
			t.Fatal("the admin's list has no tenant column")
		}
		for id, want := range map[string]string{ours.ID: "acme", theirs.ID: "globex", mine.ID: "default"} {
			if got := uiEval[string](b, rowSel(id)+`.querySelector("td.tenant").textContent`); got != want {
				t.Fatalf("the tenant cell of %s reads %q, want %q", id, got, want)
			}
		}
	}

	step(t, "the list follows every tenant live")
	{
		sb, err := globex.Create(ctx, torpor.CreateRequest{Template: "base"})
		if err != nil {
			t.Fatal(err)
		}
		b.waitJS("globex's new sandbox", rowSel(sb.ID)+` && `+rowSel(sb.ID)+`.querySelector(".badge.running")`)
		if _, err := globex.Delete(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		b.waitJS("globex's new sandbox gone", `!`+rowSel(sb.ID))
		if _, err := acme.Pause(ctx, ours.ID, ""); err != nil {
			t.Fatal(err)
		}
		b.waitJS("acme's pause", rowSel(ours.ID)+`.querySelector(".badge.paused")`)
	}

	step(t, "the tenant filter")
	{
		b.waitJS("acme in the filter", `Array.from(document.getElementById("f-tenant").options).some(o => o.value === "acme")`)
		uiEval[bool](b, `(() => { const s = document.getElementById("f-tenant"); s.value = "acme"; s.dispatchEvent(new Event("change")); return true; })()`)
		b.waitJS("only acme's", rowSel(ours.ID)+` && !`+rowSel(theirs.ID)+` && !`+rowSel(mine.ID))
		uiEval[bool](b, `(() => { const s = document.getElementById("f-tenant"); s.value = "globex"; s.dispatchEvent(new Event("change")); return true; })()`)
		b.waitJS("only globex's", rowSel(theirs.ID)+` && !`+rowSel(ours.ID)+` && !`+rowSel(mine.ID))
		uiEval[bool](b, `(() => { const s = document.getElementById("f-tenant"); s.value = ""; s.dispatchEvent(new Event("change")); return true; })()`)
		b.waitJS("every tenant's again", rowSel(theirs.ID)+` && `+rowSel(ours.ID)+` && `+rowSel(mine.ID))
	}

	step(t, "a tenant's sandbox's page acts as its tenant")
	{
		b.route("#/sandbox/" + ours.ID)
		b.waitJS("acme's sandbox's page", `document.body.dataset.detailReady === "`+ours.ID+`"`)
		b.waitJS("its pause on the timeline", `document.querySelector('#d-transitions li[data-to="paused"]')`)
		b.do("starting", chromedp.Click(chromedp.CSS(`#d-actions button[data-act="start"]`)))
		b.waitJS("the running badge", `document.getElementById("d-badge").textContent === "running"`)
		if got, err := acme.Get(ctx, ours.ID); err != nil || got.State != torpor.StateRunning {
			t.Fatalf("acme sees %+v %v after the admin's page started it", got, err)
		}
		b.do("running a command", chromedp.SetValue(chromedp.ID("exec-cmd"), `hostname`), chromedp.Click(chromedp.ID("exec-run")))
		b.waitJS("the exit", `document.getElementById("exec-status").dataset.exit === "0"`)
		if out := uiEval[string](b, `document.getElementById("exec-out").textContent`); !strings.HasPrefix(out, ours.ID+"\n") {
			t.Fatalf("exec in acme's sandbox printed %q", out)
		}
	}

	step(t, "the port's link names the daemon's proxy")
	{
		_, port, _ := strings.Cut(d.proxy, ":")
		pattern := uiEval[string](b, `fetch("/ui/session", {credentials: "same-origin"}).then(r => r.json()).then(s => s.proxy_url)`)
		if want := "http://{port}-{id}.localhost:" + port + "/"; pattern != want {
			t.Fatalf("GET /ui/session says proxy_url %q, want %q", pattern, want)
		}
		link := uiEval[string](b, `document.querySelector("#d-ports a").href`)
		if want := "http://8080-" + ours.ID + ".localhost:" + port + "/"; link != want {
			t.Fatalf("the page links port 8080 to %q, want %q", link, want)
		}
	}

	step(t, "a tenant's sandbox opened by its link")
	{
		b.do("opening globex's sandbox's link", chromedp.Navigate(b.base+"/ui/#/sandbox/"+theirs.ID))
		b.waitJS("globex's sandbox's page", `document.body.dataset.detailReady === "`+theirs.ID+`"`)
		if got := uiEval[string](b, `document.getElementById("d-error").textContent`); got != "" {
			t.Fatalf("globex's sandbox's page says %q", got)
		}
	}
	b.checkClean()
}
