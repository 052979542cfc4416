package e2e

import (
	"context"
	"strconv"
	"strings"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/torpor-dev/torpor"
)

// TestUIBrowserSecretsAndWakeups drives the dashboard's Secrets page and a
// sandbox's wake-ups in a real browser against the real daemon: a secret
// set, rotated and deleted from the page is the daemon's, its value never
// comes back into the page, another tenant's secrets are not listed; a
// one-off wake-up added from the page wakes a paused sandbox and runs its
// command, whose result the page shows; a cron wake-up in a zone shows its
// next run; a bad one is refused with the API's message and adds nothing;
// a wake-up removed from the page is gone.
func TestUIBrowserSecretsAndWakeups(t *testing.T) {
	needs(t)
	chromiumPath(t)
	ctx := context.Background()
	d := startDaemon(t, torporBin(t), t.TempDir())
	key, cl := tenantClient(t, d, "acme")
	_, other := tenantClient(t, d, "globex")
	if _, err := other.SetSecret(ctx, "globex-only", "globex-value-0b7f"); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.SetSecret(ctx, "from-cli", "cli-value-3c1d"); err != nil {
		t.Fatal(err)
	}

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
	shots := uiScreenshotDir(t)

	const v1, v2 = "ui-secret-value-one-9e2a", "ui-secret-value-two-41c8"
	noValue := func(when string) {
		t.Helper()
		for _, v := range []string{v1, v2, "cli-value-3c1d", "globex-value-0b7f"} {
			if uiEval[bool](b, `document.documentElement.outerHTML.includes(`+strconv.Quote(v)+`) || document.getElementById("s-value").value !== ""`) {
				t.Fatalf("%s: the page holds a secret's value (%s) or keeps it in the field", when, v)
			}
		}
	}
	setSecret := func(name, value string) {
		t.Helper()
		b.do("setting "+name, chromedp.SetValue(chromedp.ID("s-name"), name), chromedp.SetValue(chromedp.ID("s-value"), value),
			chromedp.Click(chromedp.ID("s-set")))
	}

	step(t, "the Secrets page lists the tenant's secrets only")
	{
		b.route("#/secrets")
		b.waitJS("the secrets list", `document.querySelector('#s-rows tr[data-name="from-cli"] td.version')`)
		if uiEval[bool](b, `document.body.innerText.includes("globex-only")`) {
			t.Fatal("the Secrets page shows another tenant's secret")
		}
		noValue("the list")
	}

	step(t, "a secret set from the page, then rotated")
	{
		setSecret("db-password", v1)
		b.waitJS("the new secret's row", `document.querySelector('#s-rows tr[data-name="db-password"] td.version').textContent === "1"`)
		if sec, err := cl.GetSecret(ctx, "db-password"); err != nil || sec.Version != 1 {
			t.Fatalf("the daemon's secret after the page set it: %+v %v", sec, err)
		}
		noValue("after a set")
		setSecret("db-password", v2)
		b.waitJS("the rotation", `document.querySelector('#s-rows tr[data-name="db-password"] td.version').textContent === "2" && document.getElementById("s-notice").textContent.includes("version 2")`)
		noValue("after a rotation")
		// The value reaches a sandbox that names the secret.
		sb, err := cl.Create(ctx, torpor.CreateRequest{Template: "base", Secrets: []torpor.SecretRef{{Name: "db-password", Env: "DB_PASSWORD"}}})
		if err != nil {
			t.Fatal(err)
		}
		if out := cliAs("exec", sb.ID, "--", "sh", "-c", `printf %s "$DB_PASSWORD"`); out != v2 {
			t.Fatalf("the sandbox sees %q, want the rotated value", out)
		}
		cliAs("rm", sb.ID)
	}

	step(t, "a bad name is refused with the API's message and changes nothing")
	{
		setSecret("no spaces allowed", "x")
		b.waitJS("the error", `document.getElementById("s-error").textContent.includes("not valid")`)
		if secs, err := cl.ListSecrets(ctx); err != nil || len(secs) != 2 {
			t.Fatalf("after a refused set the tenant has %d secrets (%v), want 2", len(secs), err)
		}
		noValue("after a refusal")
	}
	b.screenshot(shots, "secrets.png")

	step(t, "a secret deleted from the page")
	{
		b.do("deleting", chromedp.Click(chromedp.CSS(`#s-rows tr[data-name="db-password"] button.danger`)))
		b.waitJS("the confirmation", `document.getElementById("confirm").open && document.getElementById("confirm-text").textContent.includes("db-password")`)
		b.do("confirming", chromedp.Click(chromedp.ID("confirm-ok")))
		b.waitJS("the row gone", `!document.querySelector('#s-rows tr[data-name="db-password"]') && document.querySelector('#s-rows tr[data-name="from-cli"]')`)
		if _, err := cl.GetSecret(ctx, "db-password"); !torpor.IsCode(err, torpor.ENotFound) {
			t.Fatalf("the secret deleted from the page: %v, want not found", err)
		}
	}

	sb, err := cl.Create(ctx, torpor.CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	wakeRow := func(cond string) string {
		return `[...document.querySelectorAll("#wk-rows tr[data-id]")].some((tr) => ` + cond + `)`
	}

	step(t, "a one-off wake-up added from the page wakes a paused sandbox and shows its result")
	{
		if _, err := cl.Pause(ctx, sb.ID, torpor.PauseFreeze); err != nil {
			t.Fatal(err)
		}
		b.route("#/sandbox/" + sb.ID)
		b.waitJS("the sandbox's page", `document.body.dataset.detailReady === "`+sb.ID+`" && document.getElementById("d-badge").textContent === "paused"`)
		b.waitJS("no wake-ups yet", `document.getElementById("wk-rows").textContent.includes("No wake-ups")`)
		// Eight seconds from now in the browser's own time, as a user
		// would pick it.
		uiEval[bool](b, `(() => {
			const d = new Date(Date.now() + 8000), p = (n) => String(n).padStart(2, "0");
			document.getElementById("wk-kind").value = "at";
			document.getElementById("wk-kind").dispatchEvent(new Event("change"));
			document.getElementById("wk-at").value = d.getFullYear() + "-" + p(d.getMonth() + 1) + "-" + p(d.getDate()) + "T" + p(d.getHours()) + ":" + p(d.getMinutes()) + ":" + p(d.getSeconds());
			return true;
		})()`)
		b.do("adding the wake-up", chromedp.SetValue(chromedp.ID("wk-cmd"), "echo woke-from-the-page"), chromedp.Click(chromedp.ID("wk-add")))
		b.waitJS("the wake-up's row", wakeRow(`tr.querySelector(".when").textContent.startsWith("at ") && tr.querySelector(".cmd").textContent === "echo woke-from-the-page" && tr.querySelector(".result").textContent.includes("not run yet")`))
		if wks, err := cl.Wakeups(ctx, sb.ID); err != nil || len(wks) != 1 || wks[0].WakeAt == nil || wks[0].NextAt == nil {
			t.Fatalf("the daemon's wake-ups after the page added one: %+v %v", wks, err)
		}
		// It runs: the page follows the sandbox's events to the result.
		b.waitJS("the wake-up's result", wakeRow(`tr.querySelector('.result [data-status="done"]') && tr.querySelector(".result").textContent.includes("exit 0") && tr.querySelector(".result pre").textContent.includes("woke-from-the-page") && tr.querySelector(".next").textContent === "—"`))
		wks, err := cl.Wakeups(ctx, sb.ID)
		if err != nil || len(wks) != 1 || wks[0].LastResult == nil || wks[0].LastResult.Status != "done" || wks[0].LastResult.WokeFrom != torpor.StatePaused {
			t.Fatalf("the daemon's wake-up after its run: %+v %v", wks, err)
		}
		b.waitJS("the timeline's wake-up", `[...document.querySelectorAll("#d-transitions li .cause")].some((c) => c.textContent.includes("scheduled wake-up"))`)
	}

	step(t, "a cron wake-up in a zone shows its next run; a bad one is refused")
	{
		b.do("choosing cron", chromedp.SetValue(chromedp.ID("wk-kind"), "cron"))
		uiEval[bool](b, `document.getElementById("wk-kind").dispatchEvent(new Event("change")), true`)
		b.waitJS("the cron fields", `!document.getElementById("wk-cron").hidden && document.getElementById("wk-at").hidden`)
		b.do("a bad expression", chromedp.SetValue(chromedp.ID("wk-cron"), "not a schedule"), chromedp.SetValue(chromedp.ID("wk-tz"), "Europe/Paris"),
			chromedp.Click(chromedp.ID("wk-add")))
		b.waitJS("the refusal", `document.getElementById("wk-error").textContent.includes("adding the wake-up failed")`)
		if wks, _ := cl.Wakeups(ctx, sb.ID); len(wks) != 1 {
			t.Fatalf("a refused wake-up changed the list: %+v", wks)
		}
		b.do("a nightly one", chromedp.SetValue(chromedp.ID("wk-cron"), "0 3 * * *"), chromedp.SetValue(chromedp.ID("wk-tz"), "Europe/Paris"),
			chromedp.SetValue(chromedp.ID("wk-cmd"), "./nightly.sh"), chromedp.SetValue(chromedp.ID("wk-timeout"), "600"), chromedp.Click(chromedp.ID("wk-add")))
		b.waitJS("the cron row with its next run", wakeRow(`tr.querySelector(".when").textContent === "cron 0 3 * * * (Europe/Paris)" && tr.querySelector(".next").textContent.includes("in ") && tr.querySelector(".cmd").textContent.includes("./nightly.sh")`))
		if msg := uiEval[string](b, `document.getElementById("wk-error").textContent`); msg != "" {
			t.Fatalf("the error stayed after a good add: %q", msg)
		}
		wks, err := cl.Wakeups(ctx, sb.ID)
		if err != nil || len(wks) != 2 {
			t.Fatalf("wake-ups %+v %v", wks, err)
		}
		cron := wks[1]
		if cron.WakeSchedule != "0 3 * * *" || cron.TimeZone != "Europe/Paris" || cron.TimeoutSeconds != 600 || cron.NextAt == nil ||
			strings.Join(cron.Cmd, " ") != "sh -c ./nightly.sh" {
			t.Fatalf("the cron wake-up the page added: %+v", cron)
		}
		b.screenshot(shots, "sandbox-wakeups.png")

		step(t, "a wake-up removed from the page")
		b.do("removing", chromedp.Click(chromedp.CSS(`#wk-rows tr[data-id="`+cron.ID+`"] button.danger`)))
		b.waitJS("the row gone", `!document.querySelector('#wk-rows tr[data-id="`+cron.ID+`"]') && document.querySelectorAll("#wk-rows tr[data-id]").length === 1`)
		if wks, _ := cl.Wakeups(ctx, sb.ID); len(wks) != 1 || wks[0].ID == cron.ID {
			t.Fatalf("after the removal: %+v", wks)
		}
	}
	b.checkClean()
}
