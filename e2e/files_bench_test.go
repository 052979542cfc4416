package e2e

import (
	"context"
	"crypto/rand"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// BenchmarkFilesThroughput: a 100 MiB file written into a sandbox and read
// back out through the files API (client → HTTP → daemon → the sandbox's
// overlay, and back into a local file), against `cp` of the same file on
// the same host disk, in the same run. Reports MB/s of each and the
// ratios to cp.
//
//	go test -run '^$' -bench FilesThroughput -benchtime 5x ./e2e/
func BenchmarkFilesThroughput(b *testing.B) {
	const size = 100 << 20
	d, cl := benchDaemon(b)
	ctx := context.Background()
	id := strings.TrimSpace(d.ok("create"))
	dir := b.TempDir()
	src, dst := filepath.Join(d.dataDir, "bench-src"), filepath.Join(d.dataDir, "bench-dst")
	writeRandom(b, src, size)
	defer os.Remove(src)
	var cpT, writeT, readT time.Duration
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		cpT += timed(b, func() error { return exec.Command("cp", src, dst).Run() })
		os.Remove(dst)
		writeT += timed(b, func() error {
			f, err := os.Open(src)
			if err != nil {
				return err
			}
			defer f.Close()
			_, err = cl.WriteFile(ctx, id, "/root/bench", f, nil)
			return err
		})
		readT += timed(b, func() error {
			rc, err := cl.ReadFile(ctx, id, "/root/bench")
			if err != nil {
				return err
			}
			defer rc.Close()
			return copyToFile(filepath.Join(dir, "out"), rc)
		})
		os.Remove(filepath.Join(dir, "out"))
	}
	b.StopTimer()
	mb := float64(size) / 1e6 * float64(b.N)
	b.ReportMetric(mb/cpT.Seconds(), "cp-MB/s")
	b.ReportMetric(mb/writeT.Seconds(), "write-MB/s")
	b.ReportMetric(mb/readT.Seconds(), "read-MB/s")
	b.ReportMetric(cpT.Seconds()/writeT.Seconds(), "write/cp")
	b.ReportMetric(cpT.Seconds()/readT.Seconds(), "read/cp")
}

func timed(b *testing.B, fn func() error) time.Duration {
	start := time.Now()
	if err := fn(); err != nil {
		b.Fatal(err)
	}
	return time.Since(start)
}

func writeRandom(b *testing.B, name string, size int64) {
	f, err := os.Create(name)
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if _, err := io.CopyN(f, rand.Reader, size); err != nil {
		b.Fatal(err)
	}
}

func copyToFile(name string, r io.Reader) error {
	f, err := os.Create(name)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}
