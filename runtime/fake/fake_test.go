package fake_test

import (
	"fmt"
	"testing"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/runtime/fake"
	"github.com/torpor-dev/torpor/runtime/runtimetest"
)

// TestRuntime runs the behaviour suite every runtime passes, so that the
// fake the engine and API tests use keeps the state machine of the real
// runtimes. It runs no processes, so it gets the state-machine tests (and
// the snapshot ones, as it has that pause, and the disk archive ones,
// over its FilesDir); Exit ends an instance as a real entrypoint's exit
// would, for the tests of a stopped instance.
func TestRuntime(t *testing.T) {
	host := fake.NewHost()
	host.FilesDir = t.TempDir()
	runtimetest.Run(t, runtimetest.Harness{
		New:      func(t *testing.T) torpor.Runtime { return fake.New(host) },
		Template: torpor.Template{Name: "base"},
		// Another node's host, with files of its own.
		Elsewhere: func(t *testing.T) torpor.Runtime {
			other := fake.NewHost()
			other.FilesDir = t.TempDir()
			return fake.New(other)
		},
		Exit: func(t *testing.T, ref torpor.InstanceRef, code int) {
			host.Exit(ref.SandboxID, &torpor.Failure{Code: torpor.FailureEntrypoint, ExitCode: &code,
				Message: fmt.Sprintf("the entrypoint exited with status %d", code)})
		},
	})
}
