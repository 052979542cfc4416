//go:build linux && cgo && nvml

package nvidia

import (
	"fmt"
	"sync"

	"github.com/NVIDIA/go-nvml/pkg/nvml"

	"github.com/torpor-dev/torpor/gpu"
)

// nvmlProbe reads VRAM through NVML. The library (libnvidia-ml.so.1,
// installed with the driver) is opened with dlopen, so the binary builds
// and starts where it is missing.
type nvmlProbe struct {
	mu  sync.Mutex
	lib nvml.Interface
}

func openNVML() (usageReader, error) {
	lib := nvml.New()
	if ret := lib.Init(); ret != nvml.SUCCESS {
		if ret == nvml.ERROR_LIBRARY_NOT_FOUND {
			return nil, fmt.Errorf("%w: libnvidia-ml.so.1 could not be loaded (no NVIDIA driver on this host?)", ErrNoNVML)
		}
		return nil, fmt.Errorf("%w: init: %v", ErrNoNVML, ret)
	}
	return &nvmlProbe{lib: lib}, nil
}

func (p *nvmlProbe) close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	_ = p.lib.Shutdown()
}

// notAvailable is NVML's NVML_VALUE_NOT_AVAILABLE for a 64-bit value.
const nvmlNotAvailable = ^uint64(0)

func (p *nvmlProbe) usage() (gpu.Usage, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	n, ret := p.lib.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return gpu.Usage{}, fmt.Errorf("device count: %v", ret)
	}
	u := gpu.Usage{ByPID: map[int]int64{}}
	for i := 0; i < n; i++ {
		dev, ret := p.lib.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return gpu.Usage{}, fmt.Errorf("device %d: %v", i, ret)
		}
		mem, ret := dev.GetMemoryInfo()
		if ret != nvml.SUCCESS {
			return gpu.Usage{}, fmt.Errorf("device %d memory: %v", i, ret)
		}
		uuid, _ := dev.GetUUID()
		u.Devices = append(u.Devices, gpu.DeviceUsage{Index: i, UUID: uuid,
			UsedMiB: int64(mem.Used >> 20), TotalMiB: int64(mem.Total >> 20)})
		// A process can be listed as compute and as graphics with the same
		// memory: take the larger per device, then add up devices.
		per := map[uint32]uint64{}
		for _, list := range []func() ([]nvml.ProcessInfo, nvml.Return){dev.GetComputeRunningProcesses, dev.GetGraphicsRunningProcesses} {
			procs, ret := list()
			if ret == nvml.ERROR_NOT_SUPPORTED {
				continue
			}
			if ret != nvml.SUCCESS {
				return gpu.Usage{}, fmt.Errorf("device %d processes: %v", i, ret)
			}
			for _, pr := range procs {
				if pr.UsedGpuMemory == nvmlNotAvailable {
					return gpu.Usage{}, fmt.Errorf("device %d: NVML cannot read the memory of pid %d", i, pr.Pid)
				}
				per[pr.Pid] = max(per[pr.Pid], pr.UsedGpuMemory)
			}
		}
		for pid, b := range per {
			u.ByPID[int(pid)] += int64(b >> 20)
		}
	}
	return u, nil
}
