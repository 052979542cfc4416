package postgres_test

import (
	"fmt"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/store/postgres/pgtest"
	"github.com/torpor-dev/torpor/store/sqlite"
)

// BenchmarkTenThousand: a store holding 10,000 sandboxes (a third of them
// paused), SQLite and PostgreSQL (a local server with fsync on) in the same
// run, taking turns: "paused" is GET /v1/sandboxes?state=paused's query,
// "load" the idle engine's start-up load (every sandbox not terminated),
// "update" one durable state change with an event. The ratios are
// PostgreSQL's over SQLite's (BENCHMARKS.md).
func BenchmarkTenThousand(b *testing.B) {
	const n = 10000
	ctx := b.Context()
	sq, err := sqlite.Open(ctx, filepath.Join(b.TempDir(), "torpor.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer sq.Close()
	pg := open(b, pgtest.NewDurable(b).NewDatabase(b), b.TempDir())
	defer pg.Close()
	stores := []torpor.Store{sq, pg}
	t0 := time.Date(2025, 3, 14, 0, 0, 0, 0, time.UTC)
	var hot []*torpor.Sandbox
	for _, s := range stores {
		for i := range n {
			st := torpor.StateRunning
			if i%3 == 0 {
				st = torpor.StatePaused
			}
			sb := &torpor.Sandbox{ID: fmt.Sprintf("sb_%05d", i), Tenant: "acme", Template: "base", State: st,
				CreatedAt: t0.Add(time.Duration(i) * time.Millisecond), Metadata: map[string]string{"n": fmt.Sprint(i)}}
			if err := s.CreateSandbox(ctx, sb, torpor.Event{Type: torpor.EventCreated, SandboxID: sb.ID, Tenant: "acme", Time: t0}); err != nil {
				b.Fatal(err)
			}
			if i == 0 {
				hot = append(hot, sb)
			}
		}
	}
	type lat struct{ paused, load, update []time.Duration }
	got := make([]lat, 2)
	for i := 0; b.Loop(); i++ {
		for k, s := range stores {
			t1 := time.Now()
			sbs, err := s.ListSandboxes(ctx, torpor.SandboxFilter{States: []torpor.State{torpor.StatePaused}})
			if err != nil || len(sbs) != (n+2)/3 {
				b.Fatalf("list paused: %d, %v", len(sbs), err)
			}
			t2 := time.Now()
			if sbs, err = s.ListSandboxes(ctx, torpor.SandboxFilter{}); err != nil || len(sbs) != n {
				b.Fatalf("list all: %d, %v", len(sbs), err)
			}
			t3 := time.Now()
			sb := hot[k]
			sb.Boots = i
			if err := s.UpdateSandbox(ctx, sb, torpor.Event{Type: torpor.EventStateChange, SandboxID: sb.ID, Tenant: "acme", Time: t0}); err != nil {
				b.Fatal(err)
			}
			t4 := time.Now()
			got[k].paused = append(got[k].paused, t2.Sub(t1))
			got[k].load = append(got[k].load, t3.Sub(t2))
			got[k].update = append(got[k].update, t4.Sub(t3))
		}
	}
	for _, m := range []struct {
		name   string
		sq, pg []time.Duration
	}{{"paused", got[0].paused, got[1].paused}, {"load", got[0].load, got[1].load}, {"update", got[0].update, got[1].update}} {
		b.ReportMetric(p50(m.sq), m.name+"-sqlite-p50-ms")
		b.ReportMetric(p50(m.pg), m.name+"-pg-p50-ms")
		b.ReportMetric(p50(m.pg)/p50(m.sq), m.name+"-p50-pg/sqlite")
	}
}

// p50 is the median of d in milliseconds.
func p50(d []time.Duration) float64 {
	s := slices.Clone(d)
	slices.Sort(s)
	return float64(s[len(s)/2].Microseconds()) / 1000
}
