package torpor

import (
	"slices"
	"testing"
)

func TestTemplateDefaultsApply(t *testing.T) {
	d := TemplateDefaults{
		Env:        map[string]string{"A": "template", "B": "template"},
		Setup:      []string{"t1"},
		Entrypoint: []string{"serve"},
		Resources:  &Resources{VCPUs: 2, MemoryMiB: 1024},
	}
	got := d.Apply(CreateRequest{Env: map[string]string{"B": "request"}, Runtime: RuntimeConfig{Setup: []string{"r1"}},
		Resources: &Resources{MemoryMiB: 256}})
	if got.Env["A"] != "template" || got.Env["B"] != "request" {
		t.Errorf("env %v", got.Env)
	}
	if !slices.Equal(got.Runtime.Setup, []string{"t1", "r1"}) || !slices.Equal(got.Runtime.Entrypoint, []string{"serve"}) {
		t.Errorf("runtime %+v", got.Runtime)
	}
	if *got.Resources != (Resources{VCPUs: 2, MemoryMiB: 256}) {
		t.Errorf("resources %+v", *got.Resources)
	}
	if got := d.Apply(CreateRequest{Runtime: RuntimeConfig{Entrypoint: []string{"mine"}}}); !slices.Equal(got.Runtime.Entrypoint, []string{"mine"}) {
		t.Errorf("the request's entrypoint lost: %v", got.Runtime.Entrypoint)
	}
	if got := (TemplateDefaults{}).Apply(CreateRequest{}); got.Env != nil || got.Resources != nil || got.Runtime.Setup != nil {
		t.Errorf("empty defaults changed the request: %+v", got)
	}
}

func TestValidateTemplateName(t *testing.T) {
	for _, ok := range []string{"a", "python", "py-3.12", "0", "a123456789012345678901234567890123456789012345678901234567890ab"} {
		if err := ValidateTemplateName("name", ok); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "Py", "-a", ".a", "a_b", "a/b", "a b", "a123456789012345678901234567890123456789012345678901234567890abc"} {
		if err := ValidateTemplateName("name", bad); !IsCode(err, EInvalid) {
			t.Errorf("%q: %v", bad, err)
		}
	}
}

func TestTemplateDefaultIsolation(t *testing.T) {
	d := TemplateDefaults{Isolation: IsolationVM}
	cases := []struct {
		req  CreateRequest
		want string
	}{
		{CreateRequest{}, IsolationVM},
		{CreateRequest{Isolation: IsolationContainer}, IsolationContainer},
		{CreateRequest{Runtime: RuntimeConfig{Kind: "runc"}}, ""}, // a named runtime decides
	}
	for _, c := range cases {
		if got := d.Apply(c.req).Isolation; got != c.want {
			t.Errorf("Apply(%+v).Isolation = %q, want %q", c.req, got, c.want)
		}
	}
	if err := (TemplateOptions{Isolation: "chroot"}).Validate(); !IsCode(err, EInvalid) {
		t.Errorf("an unknown isolation in template options: %v", err)
	}
}
