//go:build !(linux && cgo && nvml)

package nvidia

import "fmt"

// openNVML: NVML needs cgo (go-nvml calls the library through it); a
// binary built with CGO_ENABLED=0 reads VRAM with nvidia-smi.
func openNVML() (usageReader, error) {
	return nil, fmt.Errorf("%w: this binary was built without cgo and the nvml tag; reading VRAM with nvidia-smi", ErrNoNVML)
}
