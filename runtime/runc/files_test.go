package runc

import (
	"context"
	"testing"

	"github.com/torpor-dev/torpor"
)

// TestRootFSRefusesBadIDsAndUnmountedRoots needs no root: nothing is
// mounted in a fresh directory.
func TestRootFSRefusesBadIDsAndUnmountedRoots(t *testing.T) {
	r := &Runtime{dir: t.TempDir()}
	ctx := context.Background()
	for _, id := range []string{"", "../etc", "a/b", "UPPER"} {
		if _, err := r.RootFS(ctx, torpor.InstanceRef{SandboxID: id}); !torpor.IsCode(err, torpor.EInvalid) {
			t.Fatalf("id %q: %v", id, err)
		}
	}
	if _, err := r.RootFS(ctx, torpor.InstanceRef{SandboxID: "sb_abc"}); !torpor.IsCode(err, torpor.EConflict) {
		t.Fatalf("an unmounted root: %v", err)
	}
}
