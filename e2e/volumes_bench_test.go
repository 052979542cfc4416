package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor/client"
)

// BenchmarkVolumeThroughput: write and read throughput inside a runc
// sandbox on a volume mounted at /data, against the sandbox's own disk
// (its overlay's upper layer, on an ext4 image of the same size) in the
// same sandbox, alternating. Writes are 512 MiB of dd with conv=fsync
// (the data on the image, not only in the page cache); reads are dd with
// iflag=direct (from the image, not the page cache). Each dd is one exec
// through the API (about a millisecond of its time is the exec's, the
// same on both sides). Reports MB/s of each and the ratios volume/disk.
//
//	go test -run '^$' -bench VolumeThroughput -benchtime 5x ./e2e/
func BenchmarkVolumeThroughput(b *testing.B) {
	ctx := context.Background()
	d, cl := benchDaemon(b)
	d.ok("volumes", "create", "bench", "1024")
	id := strings.TrimSpace(d.ok("create", "--disk", "1024", "--volume", "bench:/data"))
	// Before the daemon's shutdown: the volume goes, unmounted.
	b.Cleanup(func() {
		d.cli("rm", id)
		d.cli("volumes", "rm", "bench")
	})
	dd := func(args ...string) time.Duration {
		b.Helper()
		start := time.Now()
		res, err := cl.Exec(ctx, id, client.ExecRequest{Cmd: append([]string{"dd", "bs=1M"}, args...), TimeoutSeconds: 120})
		took := time.Since(start)
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("dd %v: %v %+v", args, err, res)
		}
		return took
	}
	var diskW, volW, diskR, volR time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		diskW += dd("if=/dev/zero", "of=/root/f", "count=512", "conv=fsync")
		volW += dd("if=/dev/zero", "of=/data/f", "count=512", "conv=fsync")
		diskR += dd("if=/root/f", "of=/dev/null", "iflag=direct")
		volR += dd("if=/data/f", "of=/dev/null", "iflag=direct")
		d.ok("exec", id, "--", "rm", "/root/f", "/data/f")
	}
	b.StopTimer()
	mb := float64(512<<20) / 1e6 * float64(b.N)
	b.ReportMetric(mb/diskW.Seconds(), "disk-write-MB/s")
	b.ReportMetric(mb/volW.Seconds(), "volume-write-MB/s")
	b.ReportMetric(mb/diskR.Seconds(), "disk-read-MB/s")
	b.ReportMetric(mb/volR.Seconds(), "volume-read-MB/s")
	b.ReportMetric(diskW.Seconds()/volW.Seconds(), "write-volume/disk")
	b.ReportMetric(diskR.Seconds()/volR.Seconds(), "read-volume/disk")
}
