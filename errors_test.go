package torpor_test

import (
	"fmt"
	"os"
	"syscall"
	"testing"

	"github.com/torpor-dev/torpor"
)

// A host file system's ENOSPC, however wrapped, is the full data disk: 503
// with a message that names no host path. A sandbox's own full disk is not.
func TestNoSpaceIsTheFullDataDisk(t *testing.T) {
	err := fmt.Errorf("runc: boot x: %w", &os.PathError{Op: "write", Path: "/var/lib/torpor/runc/x/disk.img", Err: syscall.ENOSPC})
	e := torpor.AsError(err)
	if !torpor.IsDiskFull(err) || e.Code != torpor.EUnavailable || e.Reason != torpor.ReasonDiskFull || e.RetryAfter <= 0 {
		t.Fatalf("ENOSPC: %+v", e)
	}
	if torpor.ErrorCodeOf(err) != torpor.EUnavailable {
		t.Fatalf("ErrorCodeOf(ENOSPC) = %s", torpor.ErrorCodeOf(err))
	}
	sandboxFull := &torpor.Error{Code: torpor.EConflict, Reason: "no_space", Message: "/f: the sandbox's disk is full"}
	if torpor.IsDiskFull(sandboxFull) || torpor.AsError(sandboxFull).Code != torpor.EConflict {
		t.Fatalf("a sandbox's full disk: %+v", torpor.AsError(sandboxFull))
	}
	if torpor.IsDiskFull(os.ErrNotExist) || torpor.AsError(os.ErrNotExist).Code != torpor.EInternal {
		t.Fatal("another host error is not the full disk")
	}
}
