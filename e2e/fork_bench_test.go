package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

// BenchmarkCheckpointFork measures checkpoints and forks (docs/fork.md)
// of a runc sandbox with a 1 GiB disk image holding 64 MiB of random
// data, against baselines in the same run: a checkpoint (freeze, sync,
// copy of the image, two store writes, thaw) against `cp --reflink=auto`
// of the same image; a fork of N = 1 and 4 from a checkpoint against N
// cold creates of the same template and resources, one after another as
// the fork boots them.
//
//	TMPDIR=/tmp/x go test ./e2e -run '^$' -bench BenchmarkCheckpointFork -benchtime 5x
func BenchmarkCheckpointFork(b *testing.B) {
	needsB(b)
	dataDir := b.TempDir()
	d := startDaemon(b, torporBin(b), dataDir, "TORPOR_CAPACITY_VCPUS=64")
	cl := d.client(b)
	ctx := context.Background()
	id := strings.TrimSpace(d.ok("create", "--disk", "1024"))
	d.ok("exec", id, "--", "sh", "-c", "mkdir -p /data && dd if=/dev/urandom of=/data/random bs=1M count=64 2>/dev/null && sync")
	if _, err := cl.CreateCheckpoint(ctx, id, "base"); err != nil {
		b.Fatal(err)
	}
	image := filepath.Join(dataDir, "runc", "sandboxes", id, "disk.img")
	if _, err := os.Stat(image); err != nil {
		b.Skipf("the sandbox has no disk image (%v): this host gives directory disks", err)
	}
	timed := func(f func()) time.Duration {
		start := time.Now()
		f()
		return time.Since(start)
	}
	rmAll := func(ids []string) {
		for _, k := range ids {
			if _, err := cl.Delete(ctx, k); err != nil {
				b.Fatal(err)
			}
		}
	}
	var ckpt, cp latencies
	fork := map[int]*latencies{1: {}, 4: {}}
	cold := map[int]*latencies{1: {}, 4: {}}
	method := ""
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		name := fmt.Sprintf("bench-%d", i)
		ckpt = append(ckpt, timed(func() {
			info, err := cl.CreateCheckpoint(ctx, id, name)
			if err != nil {
				b.Fatal(err)
			}
			method = info.Method
		}))
		if err := cl.DeleteCheckpoint(ctx, id, name); err != nil {
			b.Fatal(err)
		}
		out := filepath.Join(dataDir, "cp-out.img")
		cp = append(cp, timed(func() {
			if o, err := exec.Command("cp", "--reflink=auto", image, out).CombinedOutput(); err != nil {
				b.Fatalf("cp: %v %s", err, o)
			}
		}))
		os.Remove(out)
		for _, n := range []int{1, 4} {
			var res *torpor.ForkResult
			*fork[n] = append(*fork[n], timed(func() {
				var err error
				if res, err = cl.Fork(ctx, id, torpor.ForkRequest{Count: n, Checkpoint: "base"}); err != nil {
					b.Fatal(err)
				}
			}))
			var ids []string
			for _, k := range res.Sandboxes {
				ids = append(ids, k.ID)
			}
			rmAll(ids)
			ids = nil
			*cold[n] = append(*cold[n], timed(func() {
				for j := 0; j < n; j++ {
					sb, err := cl.Create(ctx, torpor.CreateRequest{Template: "base", Resources: &torpor.Resources{DiskMiB: 1024}})
					if err != nil {
						b.Fatal(err)
					}
					ids = append(ids, sb.ID)
				}
			}))
			rmAll(ids)
		}
	}
	b.StopTimer()
	b.Logf("checkpoint copy method: %s", method)
	ckpt.report(b, "checkpoint-")
	cp.report(b, "cp-reflink-auto-")
	b.ReportMetric(ckpt.pct(0.5)/cp.pct(0.5), "checkpoint/cp")
	for _, n := range []int{1, 4} {
		fork[n].report(b, fmt.Sprintf("fork%d-", n))
		cold[n].report(b, fmt.Sprintf("create%d-", n))
		b.ReportMetric(fork[n].pct(0.5)/cold[n].pct(0.5), fmt.Sprintf("fork%d/create%d", n, n))
	}
}
