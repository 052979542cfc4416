package gpu_test

import (
	"testing"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/gpu"
)

func f64(v float64) *float64 { return &v }

// TestIdleTimeoutRules: accel.idle_timeout_s is 0 (off) or a whole number
// in [60, 86400], else a 400 naming the field; omitted is 600; a
// free-tier key with 0 or more than 600 is forbidden with reason
// gpu_free_tier_limit, same param.
func TestIdleTimeoutRules(t *testing.T) {
	const (
		ok        = ""
		invalid   = "invalid"
		forbidden = "forbidden"
	)
	cases := []struct {
		name string
		v    *float64
		tier gpu.Tier
		want int
		err  string
	}{
		{"omitted takes the default", nil, gpu.TierStandard, 600, ok},
		{"omitted on the free tier", nil, gpu.TierFree, 600, ok},
		{"0 turns auto-pause off", f64(0), gpu.TierStandard, 0, ok},
		{"lower bound", f64(60), gpu.TierStandard, 60, ok},
		{"upper bound", f64(86400), gpu.TierStandard, 86400, ok},
		{"just below the lower bound", f64(59), gpu.TierStandard, 0, invalid},
		{"just above the upper bound", f64(86401), gpu.TierStandard, 0, invalid},
		{"negative", f64(-60), gpu.TierStandard, 0, invalid},
		{"fraction", f64(90.5), gpu.TierStandard, 0, invalid},
		{"free tier may not turn it off", f64(0), gpu.TierFree, 0, forbidden},
		{"free tier up to 600", f64(600), gpu.TierFree, 600, ok},
		{"free tier over 600", f64(601), gpu.TierFree, 0, forbidden},
		{"free tier at the upper bound", f64(86400), gpu.TierFree, 0, forbidden},
		{"free tier out of range is invalid first", f64(30), gpu.TierFree, 0, invalid},
		{"free tier over the upper bound is invalid", f64(100000), gpu.TierFree, 0, invalid},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := gpu.IdleTimeout(c.v, c.tier)
			switch c.err {
			case ok:
				if err != nil || got != c.want {
					t.Fatalf("= %d, %v; want %d", got, err, c.want)
				}
			case invalid:
				wantCode(t, err, torpor.EInvalid, "")
				if e := torpor.AsError(err); e.Param != "accel.idle_timeout_s" {
					t.Fatalf("param = %q", e.Param)
				}
			case forbidden:
				wantCode(t, err, torpor.EForbidden, "gpu_free_tier_limit")
				if e := torpor.AsError(err); e.Param != "accel.idle_timeout_s" {
					t.Fatalf("param = %q", e.Param)
				}
			}
		})
	}
}

// TestAccelRequestValidation: the accel object's fields and defaults.
func TestAccelRequestValidation(t *testing.T) {
	cases := []struct {
		name      string
		req       gpu.AccelRequest
		want      gpu.Accel
		wantParam string
	}{
		{"defaults", gpu.AccelRequest{VRAMMiB: 4096}, gpu.Accel{GPUs: 1, VRAMMiB: 4096, SuspendMode: gpu.SuspendTransparent, IdleTimeoutS: 600}, ""},
		{"none", gpu.AccelRequest{GPUs: 2, VRAMMiB: 4096, SuspendMode: gpu.SuspendNone, IdleTimeoutS: f64(0)}, gpu.Accel{GPUs: 2, VRAMMiB: 4096, SuspendMode: gpu.SuspendNone}, ""},
		{"no slice", gpu.AccelRequest{}, gpu.Accel{}, "accel.vram_mib"},
		{"negative gpus", gpu.AccelRequest{GPUs: -1, VRAMMiB: 1}, gpu.Accel{}, "accel.gpus"},
		{"unknown mode", gpu.AccelRequest{VRAMMiB: 1, SuspendMode: "snapshot"}, gpu.Accel{}, "accel.suspend_mode"},
		{"bad idle timeout", gpu.AccelRequest{VRAMMiB: 1, IdleTimeoutS: f64(1)}, gpu.Accel{}, "accel.idle_timeout_s"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got, err := c.req.Validate(gpu.TierStandard)
			if c.wantParam != "" {
				wantCode(t, err, torpor.EInvalid, "")
				if p := torpor.AsError(err).Param; p != c.wantParam {
					t.Fatalf("param = %q, want %q", p, c.wantParam)
				}
				return
			}
			if err != nil || got != c.want {
				t.Fatalf("= %+v, %v; want %+v", got, err, c.want)
			}
		})
	}
}
