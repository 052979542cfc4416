package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

// BenchmarkArchiveRestore measures the archive tier (docs/archive.md) on
// a runc sandbox holding 64 MiB of data (32 MiB random, 32 MiB of text):
// the archive's size against the hibernated disk's (du of its working
// copy), and a start that restores it from its archive against two
// baselines in the same run: a start of the same sandbox from hibernated
// (the disk still on the node), and `zstd -d` of the archive's zstd stream
// (its 21-byte header cut) into a file on the same disk.
//
//	TMPDIR=/tmp/x go test ./e2e -run '^$' -bench BenchmarkArchiveRestore -benchtime 10x
func BenchmarkArchiveRestore(b *testing.B) {
	needsB(b)
	if _, err := exec.LookPath("zstd"); err != nil {
		b.Skip("needs zstd (apt-get install zstd)")
	}
	dataDir := b.TempDir()
	d := startDaemon(b, torporBin(b), dataDir)
	cl := d.client(b)
	ctx := context.Background()
	id := strings.TrimSpace(d.ok("create", "--disk", "1024"))
	d.ok("exec", id, "--", "sh", "-c", `set -e; mkdir -p /data
dd if=/dev/urandom of=/data/random bs=1M count=32 2>/dev/null
i=0; while [ $(stat -c %s /data/text 2>/dev/null || echo 0) -lt 33554432 ]; do seq $i $((i+100000)) >> /data/text; i=$((i+100000)); done`)
	sbDir := filepath.Join(dataDir, "runc", "sandboxes", id)
	must := func(sb *torpor.Sandbox, err error) *torpor.Sandbox {
		b.Helper()
		if err != nil {
			b.Fatal(err)
		}
		return sb
	}
	timed := func(f func()) time.Duration {
		start := time.Now()
		f()
		return time.Since(start)
	}
	var restore, hibernated, zstdD, archive latencies
	var diskBytes, archiveBytes int64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		must(cl.Hibernate(ctx, id))
		diskBytes = duBytes(b, sbDir)
		hibernated = append(hibernated, timed(func() {
			if sb := must(cl.Start(ctx, id)); sb.State != torpor.StateRunning {
				b.Fatalf("start from hibernated: %s", sb.State)
			}
		}))
		must(cl.Hibernate(ctx, id))
		var sb *torpor.Sandbox
		archive = append(archive, timed(func() { sb = must(cl.Archive(ctx, id)) }))
		if sb.State != torpor.StateArchived || sb.Archive == nil {
			b.Fatalf("archive: %s %+v", sb.State, sb.Archive)
		}
		archiveBytes = sb.Archive.Bytes
		obj := filepath.Join(dataDir, "archive", filepath.FromSlash(sb.Archive.Key))
		out := filepath.Join(dataDir, "zstd-out")
		zstdD = append(zstdD, timed(func() {
			cmd := exec.Command("sh", "-c", fmt.Sprintf("tail -c +22 %q | zstd -d -q -o %q -f", obj, out))
			if o, err := cmd.CombinedOutput(); err != nil {
				b.Fatalf("zstd -d: %v %s", err, o)
			}
		}))
		os.Remove(out)
		restore = append(restore, timed(func() {
			if sb := must(cl.Start(ctx, id)); sb.State != torpor.StateRunning || sb.RestoredFromArchiveAt == nil {
				b.Fatalf("start from archived: %s", sb.State)
			}
		}))
	}
	b.StopTimer()
	if out := d.ok("exec", id, "--", "sh", "-c", "stat -c %s /data/random /data/text"); !strings.Contains(out, "33554432") {
		b.Fatalf("the data after the restores: %q", out)
	}
	b.ReportMetric(float64(diskBytes)/(1<<20), "disk-MiB")
	b.ReportMetric(float64(archiveBytes)/(1<<20), "archive-MiB")
	b.ReportMetric(float64(archiveBytes)/float64(diskBytes), "size-ratio")
	archive.report(b, "archive-")
	restore.report(b, "restore-")
	hibernated.report(b, "start-hibernated-")
	zstdD.report(b, "zstd-d-")
	b.ReportMetric(restore.pct(0.5)/hibernated.pct(0.5), "restore/start-hibernated")
	b.ReportMetric(restore.pct(0.5)/zstdD.pct(0.5), "restore/zstd-d")
}

// duBytes is what `du -s -B1` says path holds on disk.
func duBytes(b *testing.B, path string) int64 {
	b.Helper()
	out, err := exec.Command("du", "-s", "-B1", path).Output()
	if err != nil {
		b.Fatalf("du %s: %v", path, err)
	}
	n, err := strconv.ParseInt(strings.Fields(string(out))[0], 10, 64)
	if err != nil {
		b.Fatal(err)
	}
	return n
}
