package torpor

import "testing"

// A create's volume mounts: absolute, clean paths that are not /, not
// under /proc, /sys, /dev or torpor's own, no .., no two on one path.
func TestValidateVolumeMounts(t *testing.T) {
	ok := [][]VolumeMount{
		nil,
		{{Name: "data", Path: "/data"}},
		{{Name: "data", Path: "/mnt/data", ReadOnly: true}, {Name: "models", Path: "/mnt/models"}},
	}
	for _, ms := range ok {
		if err := ValidateVolumeMounts(ms); err != nil {
			t.Errorf("ValidateVolumeMounts(%+v) = %v, want nil", ms, err)
		}
	}
	bad := [][]VolumeMount{
		{{Name: "data", Path: "data"}},
		{{Name: "data", Path: "/"}},
		{{Name: "data", Path: "/a/../b"}},
		{{Name: "data", Path: "/.."}},
		{{Name: "data", Path: "/a//b"}},
		{{Name: "data", Path: "/proc"}},
		{{Name: "data", Path: "/sys/fs"}},
		{{Name: "data", Path: "/dev/shm"}},
		{{Name: "data", Path: "/.torpor/run"}},
		{{Name: "data", Path: "/a\x00b"}},
		{{Name: "Bad Name", Path: "/data"}},
		{{Name: "../x", Path: "/data"}},
		{{Name: "a", Path: "/data"}, {Name: "b", Path: "/data"}},
		{{Name: "a", Path: "/data"}, {Name: "b", Path: "/data/sub"}},
	}
	for _, ms := range bad {
		if err := ValidateVolumeMounts(ms); !IsCode(err, EInvalid) {
			t.Errorf("ValidateVolumeMounts(%+v) = %v, want invalid_argument", ms, err)
		}
	}
	if err := ValidateVolumeSize(MinVolumeMiB - 1); !IsCode(err, EInvalid) {
		t.Errorf("a size below the least = %v", err)
	}
}
