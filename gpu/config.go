package gpu

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Environment variables the manager's configuration reads.
const (
	// EnvResumeGrace: seconds after a resume commit during which the
	// watchdog counts only the lease's non-worker processes (default 5).
	EnvResumeGrace = "TORPOR_GPU_RESUME_GRACE_S"
	// EnvIdleAutoPause: "0" turns the idle auto-pause sweep off (on by
	// default).
	EnvIdleAutoPause = "TORPOR_GPU_IDLE_AUTOPAUSE"
)

// Config tunes the lease manager.
type Config struct {
	// ResumeGrace: for this long after a resume commit the watchdog's kill
	// test counts only the lease's non-worker processes.
	ResumeGrace time.Duration
	// IdleAutoPause turns the idle sweep on.
	IdleAutoPause bool
	// KillGrace is how long a killed lease's processes get between
	// SIGTERM and SIGKILL.
	KillGrace time.Duration
	// RowInterval: a tick cuts an open usage interval longer than this
	// into a row, and saves each lease's last sign of life at least this
	// often, so a crash loses at most this much of the trail.
	RowInterval time.Duration
}

// DefaultConfig is the configuration with no environment.
func DefaultConfig() Config {
	return Config{
		ResumeGrace:   5 * time.Second,
		IdleAutoPause: true,
		KillGrace:     5 * time.Second,
		RowInterval:   time.Minute,
	}
}

// ConfigFromEnv is DefaultConfig changed by the environment that getenv
// reads (os.Getenv in the daemon). A malformed value is an error naming
// the variable.
func ConfigFromEnv(getenv func(string) string) (Config, error) {
	c := DefaultConfig()
	if v := strings.TrimSpace(getenv(EnvResumeGrace)); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 0 || math.IsNaN(f) || math.IsInf(f, 0) {
			return Config{}, fmt.Errorf("%s=%q: want a number of seconds, 0 or more", EnvResumeGrace, v)
		}
		c.ResumeGrace = time.Duration(f * float64(time.Second))
	}
	switch v := strings.ToLower(strings.TrimSpace(getenv(EnvIdleAutoPause))); v {
	case "", "1", "true", "on", "yes":
	case "0", "false", "off", "no":
		c.IdleAutoPause = false
	default:
		return Config{}, fmt.Errorf("%s=%q: want 0 (off) or 1 (on)", EnvIdleAutoPause, v)
	}
	return c, nil
}
