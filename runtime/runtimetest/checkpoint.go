package runtimetest

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/torpor-dev/torpor"
)

// testCheckpoint: a checkpoint of a running sandbox leaves it running; a
// clone of the checkpoint boots a new sandbox with the checkpoint's files
// and not those written after it; a restore of the stopped sandbox brings
// its disk back to the checkpoint; a live instance refuses a restore;
// checkpoints outlive a Destroy of their sandbox until deleted; bad names
// are refused. For a disk of the runtime's default kind and one of a
// fixed size.
func testCheckpoint(t *testing.T, s *suite) {
	cp, ok := s.rt.(torpor.Checkpointer)
	if !ok {
		t.Skip("the runtime has no torpor.Checkpointer")
	}
	for _, mib := range []int64{0, 64} {
		t.Run(fmt.Sprintf("disk_mib=%d", mib), func(t *testing.T) {
			ctx := testCtx(t)
			spec := s.spec()
			spec.Resources.DiskMiB = mib
			ref := s.boot(t, spec)
			want := s.putFiles(t, s.rt, ref)
			t.Cleanup(func() { _ = cp.DeleteCheckpoint(context.Background(), spec.SandboxID, "cp1") })
			info, err := cp.Checkpoint(ctx, ref, "cp1")
			if err != nil {
				t.Fatalf("Checkpoint of a running sandbox: %v", err)
			}
			if info.Name != "cp1" || info.Kind == "" {
				t.Errorf("Checkpoint: %+v", info)
			}
			s.wantState(t, s.rt, ref, torpor.InstanceRunning)
			if _, err := cp.Checkpoint(ctx, ref, "../x"); !torpor.IsCode(err, torpor.EInvalid) {
				t.Errorf("Checkpoint named ../x: %v, want invalid", err)
			}
			if s.h.Processes {
				s.sh(t, ref, "echo later > /root/later && rm /root/archived")
			}
			later := "test -e /root/later && echo later-here || echo later-gone"

			// A clone boots on the checkpoint's files.
			kid := s.spec()
			kid.Resources.DiskMiB = mib
			kref := torpor.InstanceRef{SandboxID: kid.SandboxID}
			t.Cleanup(func() { _ = s.rt.Destroy(context.Background(), kref) })
			if err := cp.CloneCheckpoint(ctx, spec.SandboxID, "cp1", kid.SandboxID); err != nil {
				t.Fatalf("CloneCheckpoint: %v", err)
			}
			if err := cp.CloneCheckpoint(ctx, spec.SandboxID, "nope", s.spec().SandboxID); !torpor.IsCode(err, torpor.ENotFound) {
				t.Errorf("CloneCheckpoint of a missing checkpoint: %v, want not_found", err)
			}
			if kref.Handle, err = s.rt.Boot(ctx, kid); err != nil {
				t.Fatalf("Boot of the clone: %v", err)
			}
			if got := s.readFiles(t, s.rt, kref); got != want {
				t.Errorf("the clone's files:\n%s\nwant the checkpoint's:\n%s", got, want)
			}
			if s.h.Processes {
				if got := s.sh(t, kref, later); got != "later-gone\n" {
					t.Errorf("the clone sees a file written after the checkpoint: %q", got)
				}
			}

			// A restore brings the disk back.
			if err := cp.RestoreCheckpoint(ctx, ref, "cp1"); !torpor.IsCode(err, torpor.EConflict) {
				t.Errorf("RestoreCheckpoint of a running sandbox: %v, want a conflict", err)
			}
			if err := s.rt.Stop(ctx, ref); err != nil {
				t.Fatal(err)
			}
			if err := cp.RestoreCheckpoint(ctx, ref, "cp1"); err != nil {
				t.Fatalf("RestoreCheckpoint: %v", err)
			}
			if ref.Handle, err = s.rt.Boot(ctx, spec); err != nil {
				t.Fatalf("Boot on the restored disk: %v", err)
			}
			if got := s.readFiles(t, s.rt, ref); got != want {
				t.Errorf("the restored files:\n%s\nwant the checkpoint's:\n%s", got, want)
			}
			if s.h.Processes {
				if got := s.sh(t, ref, later); got != "later-gone\n" {
					t.Errorf("the restored disk keeps a file written after the checkpoint: %q", got)
				}
			}

			// A checkpoint of a stopped sandbox; checkpoints outlive the
			// instance's Destroy, and go with DeleteCheckpoint.
			if err := s.rt.Stop(ctx, ref); err != nil {
				t.Fatal(err)
			}
			if _, err := cp.Checkpoint(ctx, ref, "cp2"); err != nil {
				t.Fatalf("Checkpoint of a stopped sandbox: %v", err)
			}
			if err := s.rt.Destroy(ctx, ref); err != nil {
				t.Fatal(err)
			}
			held, err := cp.ListCheckpoints(ctx)
			if err != nil {
				t.Fatal(err)
			}
			got := slices.Sorted(slices.Values(held[spec.SandboxID]))
			if !slices.Equal(got, []string{"cp1", "cp2"}) {
				t.Errorf("ListCheckpoints after the Destroy: %v, want [cp1 cp2]", got)
			}
			for _, n := range []string{"cp1", "cp2", "cp2"} {
				if err := cp.DeleteCheckpoint(ctx, spec.SandboxID, n); err != nil {
					t.Errorf("DeleteCheckpoint %s: %v", n, err)
				}
			}
			if held, err := cp.ListCheckpoints(ctx); err != nil || len(held[spec.SandboxID]) != 0 {
				t.Errorf("ListCheckpoints after the deletes: %v %v", held[spec.SandboxID], err)
			}
		})
	}
}
