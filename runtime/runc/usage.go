package runc

import (
	"context"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"github.com/torpor-dev/torpor"
)

// ResourceUsage returns what the sandbox uses now: CPU time and memory
// from its cgroup (memory.current and memory.stat's file on v2,
// memory.usage_in_bytes and total_cache on v1), and the space its
// writable layer holds (diskBytes).
func (r *Runtime) ResourceUsage(ctx context.Context, ref torpor.InstanceRef) (torpor.ResourceUsage, error) {
	id, err := checkRef(ref)
	if err != nil {
		return torpor.ResourceUsage{}, err
	}
	var u torpor.ResourceUsage
	if cpu, err := r.CPUUsage(ctx, ref); err == nil {
		u.CPU = &cpu
	} else if torpor.IsCode(err, torpor.ENotFound) {
		return torpor.ResourceUsage{}, err
	}
	dir := r.cg.memoryDir(r.cgroupRel(id))
	current, cacheKey := "memory.current", "file"
	if !r.cg.v2 {
		current, cacheKey = "memory.usage_in_bytes", "total_cache"
	}
	if n, err := readInt(filepath.Join(dir, current)); err == nil {
		u.MemoryBytes = &n
	}
	if n, ok := statValue(filepath.Join(dir, "memory.stat"), cacheKey); ok {
		u.MemoryCacheBytes = &n
	}
	if n, err := r.diskBytes(ctx, id); err == nil {
		u.DiskBytes = &n
	}
	return u, nil
}

func readInt(path string) (int64, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("runc: %s: %w", path, err)
	}
	return n, nil
}

// statValue reads one "key value" line of a cgroup stat file.
func statValue(path, key string) (int64, bool) {
	data, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, key+" "); ok {
			n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return n, err == nil
		}
	}
	return 0, false
}

// diskUsage adds up the blocks the files under dir take, without
// following links (the sandbox controls what the directory holds). Files
// that vanish while it walks are skipped.
func diskUsage(ctx context.Context, dir string) (int64, error) {
	if _, err := os.Lstat(dir); err != nil {
		return 0, err
	}
	var total int64
	err := filepath.WalkDir(dir, func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if err := ctx.Err(); err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		if st, ok := info.Sys().(*syscall.Stat_t); ok {
			total += st.Blocks * 512
		} else {
			total += info.Size()
		}
		return nil
	})
	return total, err
}

var _ torpor.UsageReporter = (*Runtime)(nil)
