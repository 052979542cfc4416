package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/client"
)

// BenchmarkCreatePooled measures create-to-running of a create that claims
// a member of a warm pool (docs/pools.md), against a cold create of the
// same template on a daemon without a pool, in the same run, alternating.
// Each pooled create waits, untimed, for the pool to be full again, so
// that every one is a hit: the figure is the claim, not the refill.
//
//	TMPDIR=/tmp/x go test ./e2e -run '^$' -bench BenchmarkCreatePooled -benchtime 200x
func BenchmarkCreatePooled(b *testing.B) {
	needsB(b)
	pooled := startDaemonArgs(b, torporBin(b), b.TempDir(), []string{"--warm-pool", "base=2"})
	drainPools(b, pooled)
	cold := startDaemon(b, torporBin(b), b.TempDir())
	pcl, ccl := pooled.client(b), cold.client(b)
	ctx := context.Background()
	create := func(cl *client.Client, fromPool bool) time.Duration {
		start := time.Now()
		sb, err := cl.Create(ctx, torpor.CreateRequest{Template: "base"})
		took := time.Since(start)
		if err != nil || sb.State != torpor.StateRunning || sb.FromPool != fromPool {
			b.Fatalf("create: %+v %v", sb, err)
		}
		if _, err := cl.Delete(ctx, sb.ID); err != nil {
			b.Fatal(err)
		}
		return took
	}
	full := func(p torpor.PoolStatus) bool { return p.Ready == p.Size && p.Size > 0 }
	waitPool(b, pooled, pcl, "base", full)
	var warm, base latencies
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		base = append(base, create(ccl, false))
		b.StopTimer()
		waitPool(b, pooled, pcl, "base", full)
		b.StartTimer()
		warm = append(warm, create(pcl, true))
	}
	b.StopTimer()
	warm.report(b, "pooled-")
	base.report(b, "cold-")
	b.ReportMetric(warm.pct(0.5)/base.pct(0.5), "pooled/cold-p50-x")
	b.ReportMetric(warm.pct(0.99)/base.pct(0.99), "pooled/cold-p99-x")
}
