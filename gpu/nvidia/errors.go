package nvidia

import "errors"

// ErrNoNVML: NVML cannot be used here (no driver library, or a binary
// built without cgo); the probe falls back to nvidia-smi.
var ErrNoNVML = errors.New("NVML unavailable")
