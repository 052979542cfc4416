package torpor

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestValidateSecretRefs(t *testing.T) {
	ok := [][]SecretRef{nil, {{Name: "db", Env: "DB_PASS"}, {Name: "db", Path: "/run/secrets/db"}}}
	for _, refs := range ok {
		if err := ValidateSecretRefs(refs); err != nil {
			t.Errorf("%v: %v", refs, err)
		}
	}
	bad := [][]SecretRef{
		{{Name: "", Env: "X"}},
		{{Name: "a b", Env: "X"}},
		{{Name: "db"}},
		{{Name: "db", Env: "X", Path: "/x"}},
		{{Name: "db", Env: "1X"}},
		{{Name: "db", Env: "PATH"}},
		{{Name: "db", Env: "TORPOR_X"}},
		{{Name: "db", Env: "X"}, {Name: "e", Env: "X"}},
		{{Name: "db", Path: "rel"}},
		{{Name: "db", Path: "/a/../b"}},
		{{Name: "db", Path: "/"}},
		{{Name: "db", Path: "/proc/x"}},
		{{Name: "db", Path: "/sys"}},
		{{Name: "db", Path: "/dev/shm/x"}},
		{{Name: "db", Path: "/a"}, {Name: "e", Path: "/a"}},
		make([]SecretRef, MaxSecretRefs+1),
	}
	for _, refs := range bad {
		if err := ValidateSecretRefs(refs); err == nil {
			t.Errorf("%v: accepted", refs)
		}
	}
}

func TestSecretValueNeverInErrors(t *testing.T) {
	v := []byte(strings.Repeat("s3cr3t-", MaxSecretValueLen))
	if err := ValidateSecretValue(v); err == nil || strings.Contains(err.Error(), "s3cr3t") {
		t.Fatalf("err = %v", err)
	}
	if ValidateSecretValue(nil) == nil {
		t.Fatal("empty value accepted")
	}
	b, _ := json.Marshal(Secret{Tenant: "t", Name: "n", Version: 1})
	if strings.Contains(string(b), "value") {
		t.Fatalf("json %s", b)
	}
}
