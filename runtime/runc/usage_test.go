package runc

import (
	"context"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

// TestResourceUsageIsMeasured: the figures come from the sandbox's cgroup
// and its writable layer, and follow what the sandbox does.
func TestResourceUsageIsMeasured(t *testing.T) {
	needHost(t)
	r, base := newTestRuntime(t)
	ref := bootOne(t, r, base, nil)
	before, err := r.ResourceUsage(context.Background(), ref)
	if err != nil {
		t.Fatal(err)
	}
	if before.CPU == nil || before.MemoryBytes == nil || *before.MemoryBytes <= 0 || before.DiskBytes == nil {
		t.Fatalf("usage of a fresh sandbox: cpu %v memory %v disk %v", before.CPU, before.MemoryBytes, before.DiskBytes)
	}
	// 8 MiB written to its disk (and held in the page cache), and some CPU.
	res, err := r.Exec(context.Background(), ref, torpor.ExecRequest{
		Cmd:     []string{"/bin/sh", "-c", "dd if=/dev/zero of=/big bs=1M count=8 2>/dev/null && i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done"},
		Timeout: time.Minute,
	})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("exec: %v %+v", err, res)
	}
	after, err := r.ResourceUsage(context.Background(), ref)
	if err != nil {
		t.Fatal(err)
	}
	if got := *after.DiskBytes - *before.DiskBytes; got < 8<<20 {
		t.Errorf("the disk grew by %d bytes after writing 8 MiB", got)
	}
	if *after.CPU <= *before.CPU {
		t.Errorf("CPU time did not grow: %v then %v", *before.CPU, *after.CPU)
	}
	if after.MemoryCacheBytes == nil || *after.MemoryBytes < *after.MemoryCacheBytes {
		t.Errorf("memory %v, of it cache %v", *after.MemoryBytes, after.MemoryCacheBytes)
	}
	// Gone: an error, not zeros.
	if err := r.Destroy(context.Background(), ref); err != nil {
		t.Fatal(err)
	}
	if _, err := r.ResourceUsage(context.Background(), ref); err == nil {
		t.Error("usage of a destroyed sandbox is not an error")
	}
}
