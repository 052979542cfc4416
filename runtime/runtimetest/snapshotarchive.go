package runtimetest

import (
	"bytes"
	"context"
	"errors"
	"testing"

	"github.com/torpor-dev/torpor"
)

// testSnapshotArchive: the state of a snapshotted sandbox, exported and
// imported into another runtime of the same host (another node's, when
// the harness can make one; else the same one after a Destroy), restores
// there with every file it had. A sandbox that is not snapshotted is not
// exported; a stream cut short or corrupt is refused and leaves nothing,
// and one that says it was made on another host is refused with
// FailureSnapshot.
func testSnapshotArchive(t *testing.T, s *suite) {
	arch, ok := s.rt.(torpor.SnapshotArchiver)
	if !ok {
		t.Skip("the runtime has no torpor.SnapshotArchiver")
	}
	ctx := testCtx(t)
	spec := s.spec()
	ref := s.boot(t, spec)
	want := s.putFiles(t, s.rt, ref)
	var sink bytes.Buffer
	if _, err := arch.ExportSnapshot(ctx, ref, &sink); !torpor.IsCode(err, torpor.EConflict) {
		t.Fatalf("ExportSnapshot of a running sandbox: err = %v, want a conflict", err)
	}
	if _, err := arch.Snapshot(ctx, ref); err != nil {
		t.Fatal(err)
	}
	var stream bytes.Buffer
	n, err := arch.ExportSnapshot(ctx, ref, &stream)
	if err != nil {
		t.Fatalf("ExportSnapshot after Snapshot: %v", err)
	}
	if n != int64(stream.Len()) {
		t.Errorf("ExportSnapshot says it wrote %d bytes, and wrote %d", n, stream.Len())
	}
	if err := s.rt.Destroy(ctx, ref); err != nil {
		t.Fatal(err)
	}

	bare := torpor.InstanceRef{SandboxID: spec.SandboxID}
	dst := s.rt
	if s.h.Elsewhere != nil {
		dst = s.h.Elsewhere(t)
	}
	dstArch, ok := dst.(torpor.SnapshotArchiver)
	if !ok {
		t.Fatal("the other runtime has no torpor.SnapshotArchiver")
	}
	if dstArch.Host() != arch.Host() || arch.Host() == "" {
		t.Fatalf("the runtimes' hosts are %q and %q: want one", arch.Host(), dstArch.Host())
	}
	good := stream.Bytes()
	flipped := bytes.Clone(good)
	flipped[len(flipped)/2] ^= 0x10
	// The same length, so that the stream's framing still holds.
	foreign := bytes.Replace(good, []byte(arch.Host()), bytes.Repeat([]byte("x"), len(arch.Host())), 1)
	for name, b := range map[string][]byte{"cut in half": good[:len(good)/2], "without its last byte": good[:len(good)-1],
		"with a byte flipped": flipped, "of another host": foreign} {
		_, err := dstArch.ImportSnapshot(ctx, spec.SandboxID, bytes.NewReader(b))
		var te *torpor.Error
		switch {
		case err == nil:
			t.Errorf("ImportSnapshot of the stream %s succeeded", name)
		case name == "of another host" && (!errors.As(err, &te) || te.Reason != torpor.FailureSnapshot):
			t.Errorf("ImportSnapshot of the stream %s: %v, want reason %s", name, err, torpor.FailureSnapshot)
		}
		if st := s.inspect(t, dst, bare); st.DiskExists {
			t.Errorf("ImportSnapshot of the stream %s left a disk", name)
		}
		if ids, err := dst.List(ctx); err != nil || count(ids, spec.SandboxID) != 0 {
			t.Errorf("after ImportSnapshot of the stream %s, List = %v, %v: want no %s", name, ids, err, spec.SandboxID)
		}
	}
	info, err := dstArch.ImportSnapshot(ctx, spec.SandboxID, bytes.NewReader(good))
	if err != nil {
		t.Fatalf("ImportSnapshot: %v", err)
	}
	if info.Path == "" || info.SizeBytes <= 0 {
		t.Errorf("ImportSnapshot says the snapshot is %+v", info)
	}
	if st := s.inspect(t, dst, bare); st.State != torpor.InstanceMissing || !st.DiskExists {
		t.Errorf("after ImportSnapshot: %+v, want no instance and a disk", st)
	}
	ref2 := torpor.InstanceRef{SandboxID: spec.SandboxID}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), safety)
		defer cancel()
		if err := dst.Destroy(ctx, ref2); err != nil {
			t.Errorf("cleanup: destroy %s: %v", ref2.SandboxID, err)
		}
	})
	handle, err := dstArch.Restore(ctx, ref2)
	if err != nil {
		t.Fatalf("Restore of the imported snapshot: %v", err)
	}
	ref2.Handle = handle
	if st := s.inspect(t, dst, ref2); st.State != torpor.InstanceRunning {
		t.Errorf("after Restore: %+v, want running", st)
	}
	if got := s.readFiles(t, dst, ref2); got != want {
		t.Errorf("the files of the imported snapshot:\n%s\nwant, as before the export:\n%s", got, want)
	}
}
