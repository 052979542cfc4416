package postgres_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api"
	"github.com/torpor-dev/torpor/lifecycle"
	"github.com/torpor-dev/torpor/runtime/fake"
	"github.com/torpor-dev/torpor/store/postgres/pgtest"
	"github.com/torpor-dev/torpor/store/sqlite"
)

// BenchmarkTenThousandEngineAndAPI: 10,000 sandboxes of one tenant (a
// third paused by freeze, the rest running) in a SQLite store and in a
// PostgreSQL one (a local server with fsync and synchronous_commit on, as
// SQLite's synchronous=FULL is), each with a fake host that holds their
// instances. Each iteration, taking turns between the stores:
//
//   - "start" is the engine's start-up: lifecycle.New and Recover, which
//     reconciles every record with its instance, adopts it, and loads
//     the idle scheduler, until Recover returns;
//   - "paused" is GET /v1/sandboxes?state=paused (3,334 sandboxes)
//     through the API's real HTTP handler (api.New, with its
//     authentication) over that engine, until the body is written.
//
// The ratios are PostgreSQL's over SQLite's (BENCHMARKS.md). Setting up
// writes 20,000 durable records (about a minute); run with -benchtime=5x.
func BenchmarkTenThousandEngineAndAPI(b *testing.B) {
	const n = 10000
	ctx := b.Context()
	sq, err := sqlite.Open(ctx, filepath.Join(b.TempDir(), "torpor.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer sq.Close()
	pg := open(b, pgtest.NewDurable(b).NewDatabase(b), b.TempDir())
	defer pg.Close()
	type side struct {
		name  string
		store torpor.Store
		host  *fake.Host
		key   string
		start []time.Duration
		list  []time.Duration
	}
	sides := []*side{{name: "sqlite", store: sq}, {name: "postgres", store: pg}}
	t0 := time.Now().UTC().Add(-time.Hour)
	for _, s := range sides {
		fillTenThousand(b, s.store, n, t0)
		s.host = fake.NewHost()
		rt := fake.New(s.host)
		for i := range n {
			id := benchID(i)
			if _, err := rt.Boot(ctx, torpor.BootSpec{SandboxID: id}); err != nil {
				b.Fatal(err)
			}
			if i%3 == 0 {
				if err := rt.Freeze(ctx, torpor.InstanceRef{SandboxID: id}); err != nil {
					b.Fatal(err)
				}
			}
		}
		if err := s.store.CreateTenant(ctx, torpor.Tenant{Name: "acme", CreatedAt: t0}); err != nil {
			b.Fatal(err)
		}
		secret, k := torpor.NewAPIKey("acme", false, t0)
		if err := s.store.CreateAPIKey(ctx, k); err != nil {
			b.Fatal(err)
		}
		s.key = secret
	}
	quiet := slog.New(slog.NewTextHandler(io.Discard, nil))
	for b.Loop() {
		for _, s := range sides {
			t1 := time.Now()
			eng, err := lifecycle.New(lifecycle.Config{Store: s.store, Runtimes: []torpor.Runtime{fake.New(s.host)}, Logger: quiet})
			if err != nil {
				b.Fatal(err)
			}
			if err := eng.Recover(ctx); err != nil {
				b.Fatal(err)
			}
			t2 := time.Now()
			srv := api.New(api.Config{Engine: eng, Auth: s.store, Templates: s.store, Webhooks: s.store, Logger: quiet})
			srv.SetReady()
			req := httptest.NewRequestWithContext(ctx, http.MethodGet, "/v1/sandboxes?state=paused", nil)
			req.Header.Set("Authorization", "Bearer "+s.key)
			rec := httptest.NewRecorder()
			t3 := time.Now()
			srv.ServeHTTP(rec, req)
			t4 := time.Now()
			eng.Close()
			if rec.Code != http.StatusOK {
				b.Fatalf("%s: GET /v1/sandboxes?state=paused: %d %s", s.name, rec.Code, rec.Body)
			}
			if got := countListed(b, rec.Body.Bytes()); got != (n+2)/3 {
				b.Fatalf("%s: GET /v1/sandboxes?state=paused listed %d, want %d", s.name, got, (n+2)/3)
			}
			s.start = append(s.start, t2.Sub(t1))
			s.list = append(s.list, t4.Sub(t3))
		}
	}
	sql, pgs := sides[0], sides[1]
	for _, m := range []struct {
		name   string
		sq, pg []time.Duration
	}{{"start", sql.start, pgs.start}, {"paused", sql.list, pgs.list}} {
		b.ReportMetric(p50(m.sq), m.name+"-sqlite-p50-ms")
		b.ReportMetric(p50(m.pg), m.name+"-pg-p50-ms")
		b.ReportMetric(p50(m.pg)/p50(m.sq), m.name+"-p50-pg/sqlite")
	}
}

func benchID(i int) string { return fmt.Sprintf("sb_%05d", i) }

// fillTenThousand stores n sandboxes of tenant acme on the fake runtime,
// every third paused by freeze, the rest running, from 8 writers.
func fillTenThousand(b *testing.B, st torpor.Store, n int, t0 time.Time) {
	b.Helper()
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for w := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := w; i < n; i += 8 {
				sb := &torpor.Sandbox{ID: benchID(i), Tenant: "acme", Template: "base", State: torpor.StateRunning,
					Runtime: torpor.RuntimeConfig{Kind: "fake"}, Resources: torpor.DefaultLimits.Default,
					CreatedAt: t0.Add(time.Duration(i) * time.Millisecond), Metadata: map[string]string{"n": fmt.Sprint(i)}}
				sb.LastActivityAt = sb.CreatedAt
				if i%3 == 0 {
					sb.State, sb.PauseMode = torpor.StatePaused, torpor.PauseFreeze
				}
				if err := st.CreateSandbox(context.Background(), sb, torpor.Event{Type: torpor.EventCreated, SandboxID: sb.ID, Tenant: "acme", Time: sb.CreatedAt}); err != nil {
					errs <- err
					return
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		b.Fatal(err)
	}
}

// countListed counts the sandboxes in a list answer.
func countListed(b *testing.B, body []byte) int {
	b.Helper()
	var page struct {
		Sandboxes []json.RawMessage `json:"sandboxes"`
	}
	if err := json.Unmarshal(body, &page); err != nil {
		b.Fatalf("list answer: %v", err)
	}
	return len(page.Sandboxes)
}
