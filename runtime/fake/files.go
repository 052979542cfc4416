package fake

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/torpor-dev/torpor"
)

var _ torpor.FileRoot = (*Runtime)(nil)

// RootFS returns Host.FilesDir/<id>, made on first use, while the sandbox
// has a running or frozen instance; a conflict otherwise, as a runtime
// whose root is unmounted answers. Without a FilesDir the fake gives no
// access to files.
func (r *Runtime) RootFS(ctx context.Context, ref torpor.InstanceRef) (string, error) {
	if err := checkID(ref.SandboxID); err != nil {
		return "", err
	}
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	if r.h.FilesDir == "" {
		return "", torpor.Errorf(torpor.EInvalid, "the fake runtime has no FilesDir")
	}
	if err := r.h.takeFail("rootfs"); err != nil {
		return "", err
	}
	if _, err := r.live(ref.SandboxID); err != nil {
		return "", &torpor.Error{Code: torpor.EConflict, Reason: "state", Message: "the sandbox's root file system is not mounted"}
	}
	dir := filepath.Join(r.h.FilesDir, ref.SandboxID)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("fake: %w", err)
	}
	return dir, nil
}
