package e2e

import (
	"context"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/chromedp/chromedp"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/client"
)

// TestUIListByPages: with more sandboxes than the table's first page, the
// page reads the list by pages and ends with every sandbox counted and
// reachable through the pager, the counts no longer greyed; a sandbox
// created afterwards is counted live.
func TestUIListByPages(t *testing.T) {
	needs(t)
	chromiumPath(t)
	const n = 130 // the first page is 100
	d := startDaemon(t, torporBin(t), t.TempDir(), "TORPOR_CAPACITY_VCPUS="+strconv.Itoa(n+8), "TORPOR_CAPACITY_MEMORY_MIB="+strconv.Itoa(32*(n+8)))
	key, cl := tenantClient(t, d, "pages")
	ctx := context.Background()
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
			sb, err := cl.Create(ctx, torpor.CreateRequest{Template: "base", Resources: &torpor.Resources{VCPUs: 1, MemoryMiB: 16, DiskMiB: 64}})
			if err != nil {
				failed.Store(err)
				return
			}
			ids[i] = sb.ID
		}()
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		t.Fatal(err)
	}
	all, err := cl.List(ctx, client.ListOptions{})
	if err != nil || len(all) != n {
		t.Fatalf("List: %d, %v", len(all), err)
	}
	rowSel := func(id string) string { return `document.querySelector('tr[data-id="` + id + `"]')` }
	total := `document.querySelector('#counts button[data-state=""] .n').textContent`

	b := newUIBrowser(t, "http://"+d.addr)
	b.signIn(key)
	b.waitJS("the whole list", `document.body.dataset.listComplete === "1"`)
	if got := uiEval[string](b, total); got != strconv.Itoa(n) {
		t.Fatalf("the count of all reads %q, want %d", got, n)
	}
	if uiEval[bool](b, `document.getElementById("counts").classList.contains("partial")`) {
		t.Fatal("the counts stay greyed after the whole list came in")
	}
	if got := uiEval[string](b, `document.getElementById("pg-info").textContent`); got != "page 1 of 2 · "+strconv.Itoa(n)+" sandboxes" {
		t.Fatalf("the pager reads %q", got)
	}
	b.waitJS("the oldest on the first page", rowSel(all[0].ID))
	if got := uiEval[int](b, `document.querySelectorAll("#sb-rows tr").length`); got != 100 {
		t.Fatalf("the first page shows %d rows", got)
	}
	b.do("the next page", chromedp.Click(chromedp.ID("pg-next")))
	b.waitJS("the newest on the second page", rowSel(all[n-1].ID))
	if got := uiEval[int](b, `document.querySelectorAll("#sb-rows tr").length`); got != n-100 {
		t.Fatalf("the second page shows %d rows", got)
	}
	sb, err := cl.Create(ctx, torpor.CreateRequest{Template: "base", Resources: &torpor.Resources{VCPUs: 1, MemoryMiB: 16, DiskMiB: 64}})
	if err != nil {
		t.Fatal(err)
	}
	b.waitJS("the new sandbox counted", total+` === "`+strconv.Itoa(n+1)+`"`)
	b.waitJS("the new sandbox on the second page", rowSel(sb.ID))
	b.checkClean()
}

// TestUITemplateBuildProgress: an admin's build from the templates view
// streams debootstrap's progress into the page as it comes, and ends with
// the build's outcome. The package asked for does not exist, so the build
// fails on any machine (with Debian's mirror: no such package; without
// it: no release file), quickly and without building a root filesystem;
// the page shows the failure as text and lists no such template.
func TestUITemplateBuildProgress(t *testing.T) {
	needs(t)
	chromiumPath(t)
	d := startDaemon(t, torporBin(t), t.TempDir())
	b := newUIBrowser(t, "http://"+d.addr)
	b.signIn(d.key)
	b.route("#/templates")
	b.waitJS("the build form", `!document.getElementById("t-build").hidden`)
	const pkg = "torpor-no-such-package"
	b.do("building", chromedp.SetValue(chromedp.ID("t-name"), "nosuch"), chromedp.SetValue(chromedp.ID("t-packages"), pkg),
		chromedp.Click(chromedp.CSS(`#t-build-form button[type="submit"]`)))
	out := `document.getElementById("t-progress").textContent`
	b.waitJS("debootstrap's command line", out+`.includes("debootstrap --variant=minbase --include=`+pkg+`")`)
	b.waitJS("the build's end", `document.querySelector("#t-progress .stderr")`)
	text := uiEval[string](b, out)
	errText := uiEval[string](b, `document.querySelector("#t-progress .stderr").textContent`)
	progress := strings.TrimSuffix(text, errText)
	if !strings.HasPrefix(errText, "error: ") || strings.Count(progress, "\n") < 2 {
		t.Fatalf("the progress view shows:\n%s", text)
	}
	// debootstrap's own progress lines came through, before the end, not
	// only the daemon's first line.
	if !strings.Contains(progress, "\nI: ") {
		t.Fatalf("no debootstrap progress in the view:\n%s", text)
	}
	t.Logf("the progress view:\n%s", text)
	b.waitJS("the templates list", `Array.from(document.querySelectorAll("#t-rows td:first-child")).some(td => td.textContent === "base")`)
	if uiEval[bool](b, `Array.from(document.querySelectorAll("#t-rows td:first-child")).some(td => td.textContent === "nosuch")`) {
		t.Fatal("the failed build is listed as a template")
	}
	b.checkClean()
}

// TestUIGPULease: on the simulated GPU host, a sandbox's GPU lease shows
// on its page (GPUs, VRAM, suspend mode, the lease's phase) and in the
// capacity view's lease table; pausing it from the page spills the lease,
// and the page shows it suspended.
func TestUIGPULease(t *testing.T) {
	needs(t)
	chromiumPath(t)
	d := startDaemon(t, torporBin(t), t.TempDir(), "TORPOR_GPU_SIM=true")
	key, cl := tenantClient(t, d, "gpus")
	ctx := context.Background()
	sb, err := cl.Create(ctx, torpor.CreateRequest{Template: "base", Accel: &torpor.AccelRequest{GPUs: 1, VRAMMiB: 4096, SuspendMode: "transparent"}})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := cl.Create(ctx, torpor.CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	b := newUIBrowser(t, "http://"+d.addr)
	b.signIn(key)

	gpuCard := `document.getElementById("d-gpu")`
	b.route("#/sandbox/" + plain.ID)
	b.waitJS("the plain sandbox's page", `document.body.dataset.detailReady === "`+plain.ID+`"`)
	if !uiEval[bool](b, gpuCard+`.closest(".card").hidden`) {
		t.Fatal("a sandbox without a GPU shows a GPU card")
	}

	b.route("#/sandbox/" + sb.ID)
	b.waitJS("the GPU sandbox's page", `document.body.dataset.detailReady === "`+sb.ID+`"`)
	b.waitJS("the GPU card", `!`+gpuCard+`.closest(".card").hidden`)
	card := uiEval[string](b, gpuCard+`.textContent`)
	for _, want := range []string{"4096 MiB", "transparent", "resident"} {
		if !strings.Contains(card, want) {
			t.Fatalf("the GPU card lacks %q: %q", want, card)
		}
	}

	b.route("#/capacity")
	b.waitJS("the GPU leases table", `!document.getElementById("c-gpu").hidden && document.querySelector('#c-gpu-rows a[href="#/sandbox/`+sb.ID+`"]')`)
	row := uiEval[string](b, `document.querySelector('#c-gpu-rows a[href="#/sandbox/`+sb.ID+`"]').closest("tr").innerText`)
	if !strings.Contains(row, "4096") || !strings.Contains(row, "transparent") {
		t.Fatalf("the lease's row reads %q", row)
	}
	if uiEval[bool](b, `!!document.querySelector('#c-gpu-rows a[href="#/sandbox/`+plain.ID+`"]')`) {
		t.Fatal("a sandbox without a GPU is listed as a lease")
	}

	b.route("#/sandbox/" + sb.ID)
	b.waitJS("the GPU sandbox's page again", `document.body.dataset.detailReady === "`+sb.ID+`"`)
	b.do("pausing", chromedp.Click(chromedp.CSS(`#d-actions button[data-act="pause"][data-mode="freeze"]`)))
	b.waitJS("the paused badge", `document.getElementById("d-badge").textContent === "paused"`)
	b.waitJS("the lease suspended", gpuCard+`.textContent.includes("suspended")`)
	if got, err := cl.Get(ctx, sb.ID); err != nil || got.State != torpor.StatePaused {
		t.Fatalf("after the page's pause: %+v %v", got, err)
	}
	t.Logf("the GPU card after the pause: %s", uiEval[string](b, gpuCard+`.innerText`))
	b.checkClean()
}
