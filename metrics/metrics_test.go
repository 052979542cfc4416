package metrics_test

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api"
	"github.com/torpor-dev/torpor/client"
	"github.com/torpor-dev/torpor/lifecycle"
	"github.com/torpor-dev/torpor/metrics"
	"github.com/torpor-dev/torpor/runtime/fake"
	"github.com/torpor-dev/torpor/store/sqlite"
)

// TestFiguresMoveWithSandboxes scrapes /metrics of a real engine and API
// while a sandbox is created, paused, resumed and deleted.
func TestFiguresMoveWithSandboxes(t *testing.T) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "torpor.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	now := time.Now()
	st.PutTemplate(ctx, torpor.Template{Name: "base", RootFS: "/x", CreatedAt: now})
	st.CreateTenant(ctx, torpor.Tenant{Name: "default", CreatedAt: now})
	secret, k := torpor.NewAPIKey("default", true, now)
	st.CreateAPIKey(ctx, k)

	m := metrics.New()
	eng, err := lifecycle.New(lifecycle.Config{Store: st, Runtimes: []torpor.Runtime{fake.New(fake.NewHost())}, Observer: m,
		Capacity: lifecycle.Capacity{VCPUs: 8, MemoryMiB: 4096}})
	if err != nil {
		t.Fatal(err)
	}
	defer eng.Close()
	m.AddSource(eng)
	if err := eng.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	srv := api.New(api.Config{Engine: eng, Auth: st, Templates: st, Metrics: m.Handler(), Requests: m})
	srv.SetReady()
	hs := httptest.NewServer(srv)
	defer hs.Close()
	cl, _ := client.New(hs.URL, secret)

	scrape := func() string {
		resp, err := http.Get(hs.URL + "/metrics") // no key needed
		if err != nil || resp.StatusCode != 200 {
			t.Fatalf("scrape: %v %v", resp, err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return string(b)
	}
	value := func(body, series string) float64 {
		m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(series) + ` (\S+)$`).FindStringSubmatch(body)
		if m == nil {
			return 0
		}
		v, _ := strconv.ParseFloat(m[1], 64)
		return v
	}
	sb, err := cl.Create(ctx, torpor.CreateRequest{Template: "base", Resources: &torpor.Resources{VCPUs: 2, MemoryMiB: 512}})
	if err != nil {
		t.Fatal(err)
	}
	body := scrape()
	checks := map[string]float64{
		`torpor_sandboxes{state="running"}`:                                 1,
		`torpor_capacity_used{resource="vcpus"}`:                            2,
		`torpor_capacity{resource="memory_mib"}`:                            4096,
		`torpor_transitions_total{cause="api",kind="create"}`:               1,
		`torpor_http_requests_total{code="201",route="POST /v1/sandboxes"}`: 1,
		`torpor_transition_seconds_count{kind="create"}`:                    1,
	}
	for series, want := range checks {
		if got := value(body, series); got != want {
			t.Errorf("%s = %v, want %v", series, got, want)
		}
	}
	cl.Pause(ctx, sb.ID, "")
	cl.Start(ctx, sb.ID)
	cl.Pause(ctx, sb.ID, "")
	body = scrape()
	for series, want := range map[string]float64{
		`torpor_sandboxes{state="running"}`:                   0,
		`torpor_sandboxes{state="paused"}`:                    1,
		`torpor_transitions_total{cause="api",kind="pause"}`:  2,
		`torpor_transitions_total{cause="api",kind="resume"}`: 1,
	} {
		if got := value(body, series); got != want {
			t.Errorf("after pause, resume, pause: %s = %v, want %v", series, got, want)
		}
	}
	// At least one write for each of the three transitions (a pause by
	// freeze and a thaw store once each).
	if value(body, "torpor_store_write_seconds_count") < 3 {
		t.Error("store writes are not counted")
	}
	// running, frozen, running: three intervals closed into the ledger.
	if got := value(body, "torpor_usage_ledger_rows_total"); got != 3 {
		t.Errorf("usage ledger rows = %v, want 3", got)
	}
	cl.Delete(ctx, sb.ID)
	if got := value(scrape(), `torpor_sandboxes{state="paused"}`); got != 0 {
		t.Errorf("after delete: paused = %v", got)
	}
}
