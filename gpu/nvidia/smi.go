package nvidia

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/torpor-dev/torpor/gpu"
)

// The nvidia-smi queries of the fallback probe.
var (
	smiAppsArgs = []string{"--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"}
	smiGPUArgs  = []string{"--query-gpu=index,uuid,memory.used,memory.total", "--format=csv,noheader,nounits"}
)

// notAvailable reports whether a CSV value is one of nvidia-smi's
// placeholders ([N/A], [Not Supported], [Insufficient Permissions], ...).
func notAvailable(v string) bool {
	return v == "" || strings.HasPrefix(v, "[") || strings.EqualFold(v, "N/A")
}

// parseComputeApps parses `nvidia-smi --query-compute-apps=pid,used_memory
// --format=csv,noheader,nounits`: one "pid, MiB" line per process and
// device. A process on several devices is summed. A value nvidia-smi
// cannot read (in a container without the host pid namespace, say) makes
// the whole reading unreadable: a partial attribution could hide a
// non-worker's VRAM.
func parseComputeApps(out []byte) (map[int]int64, error) {
	by := map[int]int64{}
	for i, line := range strings.Split(string(out), "\n") {
		line = strings.TrimSpace(line)
		if line == "" || strings.HasPrefix(line, "No running") {
			continue
		}
		f := strings.Split(line, ",")
		if len(f) != 2 {
			return nil, fmt.Errorf("%w: nvidia-smi compute-apps line %d: %q", gpu.ErrProbeUnavailable, i+1, line)
		}
		ps, ms := strings.TrimSpace(f[0]), strings.TrimSpace(f[1])
		if notAvailable(ps) || notAvailable(ms) {
			return nil, fmt.Errorf("%w: nvidia-smi cannot read process memory (%q)", gpu.ErrProbeUnavailable, line)
		}
		pid, err := strconv.Atoi(ps)
		if err != nil || pid <= 0 {
			return nil, fmt.Errorf("%w: nvidia-smi compute-apps pid %q", gpu.ErrProbeUnavailable, ps)
		}
		mib, err := strconv.ParseInt(ms, 10, 64)
		if err != nil || mib < 0 {
			return nil, fmt.Errorf("%w: nvidia-smi compute-apps memory %q", gpu.ErrProbeUnavailable, ms)
		}
		by[pid] += mib
	}
	return by, nil
}

// parseGPUs parses `nvidia-smi
// --query-gpu=index,uuid,memory.used,memory.total
// --format=csv,noheader,nounits`.
func parseGPUs(out []byte) ([]gpu.DeviceUsage, error) {
	var devs []gpu.DeviceUsage
	for i, line := range strings.Split(string(out), "\n") {
		line = strings.TrimSpace(line)
		if line == "" {
			continue
		}
		f := strings.Split(line, ",")
		if len(f) != 4 {
			return nil, fmt.Errorf("%w: nvidia-smi gpu line %d: %q", gpu.ErrProbeUnavailable, i+1, line)
		}
		for j := range f {
			f[j] = strings.TrimSpace(f[j])
		}
		idx, err1 := strconv.Atoi(f[0])
		used, err2 := strconv.ParseInt(f[2], 10, 64)
		total, err3 := strconv.ParseInt(f[3], 10, 64)
		if err1 != nil || err2 != nil || err3 != nil {
			return nil, fmt.Errorf("%w: nvidia-smi gpu line %d: %q", gpu.ErrProbeUnavailable, i+1, line)
		}
		devs = append(devs, gpu.DeviceUsage{Index: idx, UUID: f[1], UsedMiB: used, TotalMiB: total})
	}
	if len(devs) == 0 {
		return nil, fmt.Errorf("%w: nvidia-smi lists no GPU", gpu.ErrProbeUnavailable)
	}
	return devs, nil
}

// smiUsage reads the usage with nvidia-smi. It sees compute processes
// only: graphics processes' VRAM needs NVML.
func (h *Host) smiUsage(ctx context.Context) (gpu.Usage, error) {
	out, err := h.run(ctx, h.cfg.SMIBin, smiAppsArgs...)
	if err != nil {
		return gpu.Usage{}, fmt.Errorf("%w: %v", gpu.ErrProbeUnavailable, err)
	}
	by, err := parseComputeApps(out)
	if err != nil {
		return gpu.Usage{}, err
	}
	out, err = h.run(ctx, h.cfg.SMIBin, smiGPUArgs...)
	if err != nil {
		return gpu.Usage{}, fmt.Errorf("%w: %v", gpu.ErrProbeUnavailable, err)
	}
	devs, err := parseGPUs(out)
	if err != nil {
		return gpu.Usage{}, err
	}
	return gpu.Usage{ByPID: by, Devices: devs}, nil
}
