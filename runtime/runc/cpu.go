package runc

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/torpor-dev/torpor"
)

// CPUUsage returns the CPU time the sandbox's processes have used, from
// its cgroup (cpuacct.usage on v1, cpu.stat usage_usec on v2).
func (r *Runtime) CPUUsage(ctx context.Context, ref torpor.InstanceRef) (time.Duration, error) {
	id, err := checkRef(ref)
	if err != nil {
		return 0, err
	}
	rel := r.cgroupRel(id)
	if r.cg.v2 {
		data, err := os.ReadFile(filepath.Join(r.cg.root, rel, "cpu.stat"))
		if err != nil {
			return 0, cpuErr(id, err)
		}
		for _, line := range strings.Split(string(data), "\n") {
			if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
				us, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				if err != nil {
					return 0, fmt.Errorf("runc: cpu.stat of %s: %w", id, err)
				}
				return time.Duration(us) * time.Microsecond, nil
			}
		}
		return 0, fmt.Errorf("runc: cpu.stat of %s has no usage_usec", id)
	}
	dir, ok := r.cg.controllers["cpuacct"]
	if !ok {
		return 0, fmt.Errorf("runc: no cpuacct cgroup hierarchy on this host")
	}
	data, err := os.ReadFile(filepath.Join(dir, rel, "cpuacct.usage"))
	if err != nil {
		return 0, cpuErr(id, err)
	}
	ns, err := strconv.ParseInt(strings.TrimSpace(string(data)), 10, 64)
	if err != nil {
		return 0, fmt.Errorf("runc: cpuacct.usage of %s: %w", id, err)
	}
	return time.Duration(ns), nil
}

func cpuErr(id string, err error) error {
	if os.IsNotExist(err) {
		return torpor.Errorf(torpor.ENotFound, "sandbox %s has no running instance", id)
	}
	return fmt.Errorf("runc: cpu usage of %s: %w", id, err)
}

var _ torpor.CPUReporter = (*Runtime)(nil)
