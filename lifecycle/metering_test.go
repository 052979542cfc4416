package lifecycle_test

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/lifecycle"
)

type segment = torpor.UsageSpan

// ledgerOf returns a sandbox's ledger rows as spans, checking that they
// follow each other with no gap and no overlap.
func ledgerOf(t *testing.T, e *env, id string) ([]segment, []torpor.UsageRecord) {
	t.Helper()
	rows, err := e.store.ListUsage(ctx, torpor.UsageFilter{SandboxID: id})
	if err != nil {
		t.Fatal(err)
	}
	slices.SortFunc(rows, func(a, b torpor.UsageRecord) int { return a.Start.Compare(b.Start) })
	spans, err := torpor.SpansOfRows(rows)
	if err != nil {
		t.Fatal(err)
	}
	return spans, rows
}

// timelineOf derives what a sandbox was metered as from its event log.
func timelineOf(t *testing.T, e *env, id string, end time.Time) []segment {
	t.Helper()
	evs, err := e.store.ListEvents(ctx, torpor.EventFilter{SandboxID: id})
	if err != nil {
		t.Fatal(err)
	}
	return torpor.SpansOfEvents(evs, end)
}

func TestUsageLedgerFollowsTransitionsAndPricing(t *testing.T) {
	e := newEnv(t, func(c *lifecycle.Config) {
		c.Pricing = torpor.Pricing{VCPUSecond: 1, MemoryGiBSecond: 10, DiskGiBMonth: torpor.SecondsPerMonth * 100, SnapshotGiBMonth: 1}
	})
	sb := e.create(torpor.CreateRequest{Resources: &torpor.Resources{VCPUs: 2, MemoryMiB: 512, DiskMiB: 1024}})
	e.clock.Advance(90 * time.Minute)
	must(e.eng.Pause(ctx, "acme", sb.ID, ""))
	e.clock.Advance(30 * time.Minute)
	must(e.eng.Hibernate(ctx, "acme", sb.ID))
	e.clock.Advance(2 * time.Hour)
	got := e.get(sb.ID)
	// The open hibernated interval shows in the meters before it is settled.
	m := got.Meters
	if m.RunningS != 5400 || m.FrozenS != 1800 || m.HibernatedS < 7200 || m.ResidentS != 7200 || m.BilledS != 7200 {
		t.Fatalf("meters while hibernated: %s", m)
	}
	must(e.eng.Delete(ctx, "acme", sb.ID))
	end := e.clock.Now()
	segs, rows := ledgerOf(t, e, sb.ID)
	want := []segment{
		{Kind: torpor.UsageRunning, Start: sb.CreatedAt, End: sb.CreatedAt.Add(90 * time.Minute)},
		{Kind: torpor.UsageFrozen, Start: sb.CreatedAt.Add(90 * time.Minute), End: sb.CreatedAt.Add(2 * time.Hour)},
		{Kind: torpor.UsageHibernated, Start: sb.CreatedAt.Add(2 * time.Hour), End: end},
	}
	if !slices.Equal(segs, want) {
		t.Fatalf("ledger %v, want %v", segs, want)
	}
	// Prices: running 2 vCPU + 0.5 GiB + 1 GiB disk; frozen memory and
	// disk; hibernated disk only. Disk is 100 per GiB-second here.
	wantCost := 5400*(2*1+0.5*10+100) + 1800*(0.5*10+100) + 7200*100.0
	var cost float64
	for _, r := range rows {
		cost += r.Cost
		if r.Start.Truncate(time.Hour) != r.End.Add(-time.Microsecond).Truncate(time.Hour) {
			t.Errorf("row %s-%s crosses an hour boundary", r.Start, r.End)
		}
	}
	if math.Abs(cost-wantCost) > 1e-6*wantCost {
		t.Errorf("ledger cost %.3f, want %.3f", cost, wantCost)
	}
	final := e.get(sb.ID).Meters
	if math.Abs(final.Cost-cost) > 1e-9*cost || final.HibernatedS != 7200 {
		t.Errorf("meters after delete %s disagree with the ledger (cost %.3f)", final, cost)
	}
}

func TestUsageSettlesOpenIntervalsOnTheTick(t *testing.T) {
	e := newEnv(t, func(c *lifecycle.Config) { c.SettleEvery = time.Minute })
	sb := e.create(torpor.CreateRequest{})
	e.clock.Advance(150 * time.Second)
	deadline := time.Now().Add(5 * time.Second)
	for {
		_, rows := ledgerOf(t, e, sb.ID)
		if len(rows) >= 2 {
			last := rows[len(rows)-1]
			if !last.End.Equal(e.clock.Now().Truncate(time.Minute)) || last.Kind != torpor.UsageRunning {
				t.Fatalf("settled up to %s as %s, want the last minute boundary %s", last.End, last.Kind, e.clock.Now().Truncate(time.Minute))
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no settlement after two ticks: %d rows", len(rows))
		}
		time.Sleep(5 * time.Millisecond)
	}
	// Settled seconds and the open rest add up to the sandbox's age.
	if got := e.get(sb.ID).Meters.RunningS; got != 150 {
		t.Errorf("running_s %.3f, want 150", got)
	}
}

// A sandbox whose instance died with the daemon stops being charged as
// running at its last sign of life, not when the daemon comes back.
func TestUsageOfALostInstanceEndsAtItsLastSignOfLife(t *testing.T) {
	e := newEnv(t, func(c *lifecycle.Config) { c.SeenEvery = 10 * time.Second })
	sb := e.create(torpor.CreateRequest{})
	e.clock.Advance(10 * time.Second)
	waitFor(t, func() bool {
		st, _ := e.store.GetSandbox(ctx, sb.ID)
		return st.Usage.SeenAt.Equal(sb.CreatedAt.Add(10 * time.Second))
	})
	e.eng.Close()
	e.host.Exit(sb.ID, &torpor.Failure{Code: torpor.FailureRuntime, Message: "gone with the host"})
	e.clock.Advance(time.Hour)
	e.restart()
	got := e.get(sb.ID)
	if got.State != torpor.StateFailed {
		t.Fatalf("state %s, want failed", got.State)
	}
	if got.Meters.RunningS != 10 {
		t.Errorf("running_s %.3f, want 10 (up to the last sign of life)", got.Meters.RunningS)
	}
	segs, _ := ledgerOf(t, e, sb.ID)
	if len(segs) != 1 || segs[0].Kind != torpor.UsageRunning || !segs[0].End.Equal(sb.CreatedAt.Add(10*time.Second)) {
		t.Errorf("ledger %v", segs)
	}
}

func waitFor(t *testing.T, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatal("condition not met in 5s")
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// Crashes at random points of random transitions, with the clock moving
// across settlement boundaries: afterwards the ledger covers every second
// from creation to deletion once, as what the event log says it was. It
// runs on each store (SQLite and PostgreSQL), reopened at each restart.
func TestUsageLedgerIsExactAcrossCrashes(t *testing.T) {
	points := []string{"", "", "pausing.before-runtime", "pausing.after-runtime", "resuming.before-runtime",
		"resuming.after-runtime", "hibernating.before-runtime", "hibernating.after-runtime",
		"starting.before-runtime", "starting.after-runtime", "restarting.after-runtime"}
	eachStore(t, func(t *testing.T, kind string) {
		for seed := uint64(1); seed <= 8; seed++ {
			t.Run("", func(t *testing.T) {
				rng := rand.New(rand.NewPCG(seed, seed))
				e := newEnvOn(t, kind, func(c *lifecycle.Config) { c.SettleEvery = time.Minute })
				ids := []string{e.create(torpor.CreateRequest{}).ID, e.create(torpor.CreateRequest{}).ID}
				crashes := 0
				defer func() { t.Logf("%d crashes", crashes) }()
				for step := 0; step < 60; step++ {
					id := ids[rng.IntN(len(ids))]
					e.clock.Advance(time.Duration(rng.IntN(90_000)) * time.Millisecond)
					verb := rng.IntN(5)
					e.crashAt = points[rng.IntN(len(points))]
					func() {
						defer func() {
							if r := recover(); r != nil {
								if _, ok := r.(crash); !ok {
									panic(r)
								}
								e.crashAt = ""
								crashes++
								// The daemon is down for a while.
								e.clock.Advance(time.Duration(rng.IntN(30_000)) * time.Millisecond)
								e.restart()
							}
						}()
						switch verb {
						case 0:
							e.eng.Pause(ctx, "acme", id, []torpor.PauseMode{torpor.PauseFreeze, torpor.PauseSnapshot}[rng.IntN(2)])
						case 1:
							e.eng.Start(ctx, "acme", id)
						case 2:
							e.eng.Hibernate(ctx, "acme", id)
						case 3:
							e.eng.Restart(ctx, "acme", id)
						case 4:
							e.restart()
						}
					}()
					e.crashAt = ""
				}
				for _, id := range ids {
					must(e.eng.Delete(ctx, "acme", id))
				}
				end := e.clock.Now()
				for _, id := range ids {
					sb := e.get(id)
					segs, rows := ledgerOf(t, e, id)
					if len(segs) == 0 || !segs[0].Start.Equal(sb.CreatedAt) || !segs[len(segs)-1].End.Equal(*sb.TerminatedAt) {
						t.Fatalf("ledger of %s %v does not span its life %s-%s", id, segs, sb.CreatedAt, sb.TerminatedAt)
					}
					if want := timelineOf(t, e, id, end); !slices.Equal(segs, want) {
						t.Fatalf("ledger of %s\n%v\ndiffers from its timeline\n%v", id, segs, want)
					}
					var secs float64
					for _, r := range rows {
						secs += r.Seconds
					}
					m := sb.Meters
					if total := m.RunningS + m.FrozenS + m.SnapshotPausedS + m.HibernatedS; math.Abs(total-secs) > 1e-6 {
						t.Errorf("meters count %.6fs, the ledger %.6fs", total, secs)
					}
				}
			})
		}
	})
}
