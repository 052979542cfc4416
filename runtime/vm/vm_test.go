package vm

import (
	"testing"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/runtime/runtimetest"
)

// TestRuntime runs the behaviour suite every runtime passes.
func TestRuntime(t *testing.T) {
	needHost(t)
	cfg := testConfig(t)
	tmpl := baseTemplate(t)
	runtimetest.Run(t, runtimetest.Harness{
		New:       func(t *testing.T) torpor.Runtime { return newRuntime(t, cfg) },
		Template:  tmpl,
		Processes: true,
		// Another node's runtime: a directory of its own.
		Elsewhere: func(t *testing.T) torpor.Runtime { return newRuntime(t, testConfig(t)) },
	})
}

// Describe names the isolation and the acceleration for GET /v1/runtimes.
func TestDescribe(t *testing.T) {
	needHost(t)
	r := newRuntime(t, testConfig(t))
	d := r.Describe()
	if d.Kind != Kind || d.Isolation != torpor.IsolationVM || len(d.PauseModes) != 2 || d.PauseModes[0] != torpor.PauseSnapshot {
		t.Errorf("describe: %+v", d)
	}
	if a := d.Details["accel"]; a != AccelKVM && a != AccelTCG {
		t.Errorf("accel %q", a)
	}
	if d.Details["qemu_version"] == "" || d.Details["kernel"] == "" {
		t.Errorf("details %v", d.Details)
	}
}
