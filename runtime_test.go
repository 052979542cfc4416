package torpor

import (
	"errors"
	"testing"
)

func TestBootSpecValidate(t *testing.T) {
	ok := BootSpec{SandboxID: "abc123", Hostname: "abc123", Env: map[string]string{"A": "b"},
		Setup: []string{"true"}, Entrypoint: []string{"sleep", "1"}, Resources: Resources{VCPUs: 1, MemoryMiB: 64}}
	if err := ok.Validate(); err != nil {
		t.Fatalf("a good spec: %v", err)
	}
	cases := []struct {
		name  string
		edit  func(*BootSpec)
		param string
	}{
		{"bad id", func(s *BootSpec) { s.SandboxID = "../x" }, "sandbox_id"},
		{"bad host name", func(s *BootSpec) { s.Hostname = "-x" }, "hostname"},
		{"env name with =", func(s *BootSpec) { s.Env = map[string]string{"A=B": "c"} }, "env"},
		{"env value with NUL", func(s *BootSpec) { s.Env = map[string]string{"A": "b\x00"} }, "env"},
		{"setup with NUL", func(s *BootSpec) { s.Setup = []string{"a\x00"} }, "setup"},
		{"empty program", func(s *BootSpec) { s.Entrypoint = []string{""} }, "entrypoint"},
		{"negative memory", func(s *BootSpec) { s.Resources.MemoryMiB = -1 }, "resources"},
		{"4 MiB of memory", func(s *BootSpec) { s.Resources.MemoryMiB = 4 }, "resources.memory_mib"},
	}
	for _, c := range cases {
		s := ok
		s.Env = map[string]string{"A": "b"}
		c.edit(&s)
		err := s.Validate()
		var te *Error
		if !errors.As(err, &te) || te.Code != EInvalid || te.Param != c.param {
			t.Errorf("%s: %v, want invalid_argument naming %s", c.name, err, c.param)
		}
	}
}
