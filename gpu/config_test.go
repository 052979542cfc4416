package gpu_test

import (
	"testing"
	"time"

	"github.com/torpor-dev/torpor/gpu"
)

// TestConfigFromEnv: resume grace defaults to 5 s and reads
// TORPOR_GPU_RESUME_GRACE_S; idle auto-pause is on unless
// TORPOR_GPU_IDLE_AUTOPAUSE=0; bad values name the variable.
func TestConfigFromEnv(t *testing.T) {
	cases := []struct {
		name      string
		env       map[string]string
		wantGrace time.Duration
		wantAuto  bool
		wantErr   bool
	}{
		{"defaults", nil, 5 * time.Second, true, false},
		{"grace", map[string]string{gpu.EnvResumeGrace: "12.5"}, 12500 * time.Millisecond, true, false},
		{"grace 0", map[string]string{gpu.EnvResumeGrace: "0"}, 0, true, false},
		{"negative grace", map[string]string{gpu.EnvResumeGrace: "-1"}, 0, false, true},
		{"garbage grace", map[string]string{gpu.EnvResumeGrace: "soon"}, 0, false, true},
		{"kill switch", map[string]string{gpu.EnvIdleAutoPause: "0"}, 5 * time.Second, false, false},
		{"explicitly on", map[string]string{gpu.EnvIdleAutoPause: "1"}, 5 * time.Second, true, false},
		{"garbage switch", map[string]string{gpu.EnvIdleAutoPause: "maybe"}, 0, false, true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			cfg, err := gpu.ConfigFromEnv(func(k string) string { return c.env[k] })
			if c.wantErr {
				if err == nil {
					t.Fatal("no error")
				}
				return
			}
			if err != nil || cfg.ResumeGrace != c.wantGrace || cfg.IdleAutoPause != c.wantAuto {
				t.Fatalf("= %+v, %v", cfg, err)
			}
		})
	}
}
