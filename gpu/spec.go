package gpu

import (
	"fmt"
	"math"

	"github.com/torpor-dev/torpor"
)

// DefaultSuspendMode is the mode of a lease whose request names none.
const DefaultSuspendMode = SuspendTransparent

// Tier is an API key's tier; the GPU rules read it.
type Tier string

const (
	TierFree     Tier = "free"
	TierStandard Tier = "standard"
)

// Idle timeout bounds, in seconds (accel.idle_timeout_s).
const (
	DefaultIdleTimeoutS = 600
	MinIdleTimeoutS     = 60
	MaxIdleTimeoutS     = 86400
	// FreeTierMaxIdleTimeoutS is the longest idle timeout a free-tier key
	// may ask for; it may not turn auto-pause off either.
	FreeTierMaxIdleTimeoutS = 600
)

// ReasonFreeTierLimit refines the forbidden error a free-tier key gets
// for an idle timeout it may not ask for.
const ReasonFreeTierLimit = "gpu_free_tier_limit"

// ParamIdleTimeout is the request field of the idle timeout.
const ParamIdleTimeout = "accel.idle_timeout_s"

// AccelRequest is the `accel` object of a create request.
type AccelRequest struct {
	GPUs        int         `json:"gpus,omitempty"`
	VRAMMiB     int64       `json:"vram_mib"`
	SuspendMode SuspendMode `json:"suspend_mode,omitempty"`
	// IdleTimeoutS: nil (omitted or null) takes the default of 600 s; 0
	// turns idle auto-pause off; otherwise [60, 86400].
	IdleTimeoutS *float64 `json:"idle_timeout_s,omitempty"`
}

// Validate checks the request for a key of tier and fills in defaults.
// Bad input is invalid_argument naming the field; an idle timeout the
// free tier may not have is forbidden with reason gpu_free_tier_limit.
func (r AccelRequest) Validate(tier Tier) (Accel, error) {
	a := Accel{GPUs: r.GPUs, VRAMMiB: r.VRAMMiB, SuspendMode: r.SuspendMode}
	if a.GPUs == 0 {
		a.GPUs = 1
	}
	if a.GPUs < 0 {
		return Accel{}, torpor.Invalid("accel.gpus", "must be at least 1")
	}
	if a.VRAMMiB <= 0 {
		return Accel{}, torpor.Invalid("accel.vram_mib", "must be a positive number of MiB (the lease's VRAM slice)")
	}
	switch a.SuspendMode {
	case "":
		a.SuspendMode = DefaultSuspendMode
	case SuspendNone, SuspendTransparent:
	default:
		return Accel{}, torpor.Invalid("accel.suspend_mode", "must be %q or %q", SuspendNone, SuspendTransparent)
	}
	secs, err := IdleTimeout(r.IdleTimeoutS, tier)
	if err != nil {
		return Accel{}, err
	}
	a.IdleTimeoutS = secs
	return a, nil
}

// IdleTimeout validates accel.idle_timeout_s for a key of tier: nil means
// the default (600), 0 turns auto-pause off, otherwise a whole number of
// seconds in [60, 86400]; anything else is invalid_argument naming the
// field. A free-tier key keeps auto-pause on: 0 or more than 600 is
// forbidden (reason gpu_free_tier_limit, same param).
func IdleTimeout(v *float64, tier Tier) (int, error) {
	if v == nil {
		return DefaultIdleTimeoutS, nil
	}
	f := *v
	if math.IsNaN(f) || math.IsInf(f, 0) || f != math.Trunc(f) ||
		(f != 0 && (f < MinIdleTimeoutS || f > MaxIdleTimeoutS)) {
		return 0, torpor.Invalid(ParamIdleTimeout, "must be 0 (auto-pause off) or a whole number of seconds from %d to %d", MinIdleTimeoutS, MaxIdleTimeoutS)
	}
	secs := int(f)
	if tier == TierFree && (secs == 0 || secs > FreeTierMaxIdleTimeoutS) {
		return 0, &torpor.Error{Code: torpor.EForbidden, Reason: ReasonFreeTierLimit, Param: ParamIdleTimeout,
			Message: fmt.Sprintf("a free-tier key keeps GPU idle auto-pause on: %s must be from %d to %d", ParamIdleTimeout, MinIdleTimeoutS, FreeTierMaxIdleTimeoutS)}
	}
	return secs, nil
}

// validateSpec checks a spec before the manager holds its lease.
func validateSpec(s Spec) error {
	switch {
	case s.ID == "":
		return torpor.Invalid("id", "a lease needs an id")
	case s.Group == "":
		return torpor.Invalid("group", "a lease needs the host group of its processes")
	case s.WorkerPID <= 0:
		return torpor.Invalid("worker_pid", "a lease needs its worker's pid")
	case s.Accel.VRAMMiB <= 0:
		return torpor.Invalid("accel.vram_mib", "must be a positive number of MiB")
	case s.Accel.SuspendMode != SuspendNone && s.Accel.SuspendMode != SuspendTransparent:
		return torpor.Invalid("accel.suspend_mode", "must be %q or %q", SuspendNone, SuspendTransparent)
	case s.Accel.IdleTimeoutS != 0 && (s.Accel.IdleTimeoutS < MinIdleTimeoutS || s.Accel.IdleTimeoutS > MaxIdleTimeoutS):
		return torpor.Invalid(ParamIdleTimeout, "must be 0 or from %d to %d", MinIdleTimeoutS, MaxIdleTimeoutS)
	case s.LimitMiB < 0:
		return torpor.Invalid("limit_mib", "must not be negative")
	}
	return nil
}

// limitOf is the watchdog's VRAM limit for the lease of s.
func limitOf(s Spec) int64 {
	if s.LimitMiB > 0 {
		return s.LimitMiB
	}
	return s.Accel.VRAMMiB
}

// targetOf is where the worker of the lease of s is on the host.
func targetOf(s Spec) Target {
	return Target{LeaseID: s.ID, Group: s.Group, WorkerPID: s.WorkerPID, Devices: s.Devices}
}
