package lifecycle_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

// A sandbox starts with its template's defaults under what the create
// request says: env merged (the request wins), template setup first, the
// template's entrypoint only when the request gives none, resources for
// the fields the request leaves out.
func TestCreateAppliesTemplateDefaults(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	if err := e.store.PutTemplate(ctx, torpor.Template{Name: "py", RootFS: "/x", CreatedAt: time.Now(), Defaults: torpor.TemplateDefaults{
		Env:        map[string]string{"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"},
		Setup:      []string{"mkdir -p /work"},
		Entrypoint: []string{"python3", "-m", "http.server"},
		Resources:  &torpor.Resources{MemoryMiB: 1024, VCPUs: 2},
		ImageCmd:   []string{"python3"},
	}}); err != nil {
		t.Fatal(err)
	}
	var specs []torpor.BootSpec
	e.host.BootHook = func(ctx context.Context, spec torpor.BootSpec) error {
		specs = append(specs, spec)
		return nil
	}
	sb, err := e.eng.Create(ctx, "acme", torpor.CreateRequest{Template: "py",
		Env:       map[string]string{"LANG": "en_US.UTF-8", "TOKEN": "x"},
		Resources: &torpor.Resources{VCPUs: 0.5},
		Runtime:   torpor.RuntimeConfig{Setup: []string{"echo hi"}}})
	if err != nil {
		t.Fatal(err)
	}
	spec := specs[0]
	if spec.Env["PATH"] != "/usr/local/bin:/usr/bin:/bin" || spec.Env["LANG"] != "en_US.UTF-8" || spec.Env["TOKEN"] != "x" {
		t.Errorf("env %v", spec.Env)
	}
	if !slices.Equal(spec.Setup, []string{"mkdir -p /work", "echo hi"}) || !slices.Equal(spec.Entrypoint, []string{"python3", "-m", "http.server"}) {
		t.Errorf("setup %q entrypoint %q", spec.Setup, spec.Entrypoint)
	}
	if sb.Resources.MemoryMiB != 1024 || sb.Resources.VCPUs != 0.5 || sb.Resources.Pids == 0 {
		t.Errorf("resources %+v", sb.Resources)
	}
	// The request's entrypoint wins.
	if _, err := e.eng.Create(ctx, "acme", torpor.CreateRequest{Template: "py", Runtime: torpor.RuntimeConfig{Entrypoint: []string{"sleep", "9"}}}); err != nil {
		t.Fatal(err)
	}
	if got := specs[len(specs)-1].Entrypoint; !slices.Equal(got, []string{"sleep", "9"}) {
		t.Errorf("entrypoint %q, want the request's", got)
	}
}
