package runtimetest

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/torpor-dev/torpor"
)

// testDiskArchive: the disk of a stopped sandbox, exported and imported
// into another runtime (another node's, when the harness can make one;
// else the same one after a Destroy), boots there with every file it had,
// for a disk of the runtime's default kind and one of a fixed size. A
// running or frozen sandbox's disk is not exported, and a stream cut
// short or corrupt is refused and leaves no disk.
func testDiskArchive(t *testing.T, s *suite) {
	arch, ok := s.rt.(torpor.DiskArchiver)
	if !ok {
		t.Skip("the runtime has no torpor.DiskArchiver")
	}
	for _, mib := range []int64{0, 64} {
		t.Run(fmt.Sprintf("disk_mib=%d", mib), func(t *testing.T) {
			ctx := testCtx(t)
			spec := s.spec()
			spec.Resources.DiskMiB = mib
			ref := s.boot(t, spec)
			want := s.putFiles(t, s.rt, ref)
			var sink bytes.Buffer
			if _, err := arch.ExportDisk(ctx, ref, &sink); !torpor.IsCode(err, torpor.EConflict) {
				t.Fatalf("ExportDisk of a running sandbox: err = %v, want a conflict", err)
			}
			if err := s.rt.Freeze(ctx, ref); err != nil {
				t.Fatal(err)
			}
			if _, err := arch.ExportDisk(ctx, ref, &sink); !torpor.IsCode(err, torpor.EConflict) {
				t.Fatalf("ExportDisk of a frozen sandbox: err = %v, want a conflict", err)
			}
			if err := s.rt.Stop(ctx, ref); err != nil {
				t.Fatal(err)
			}
			var stream bytes.Buffer
			n, err := arch.ExportDisk(ctx, ref, &stream)
			if err != nil {
				t.Fatalf("ExportDisk after Stop: %v", err)
			}
			if n != int64(stream.Len()) {
				t.Errorf("ExportDisk says it wrote %d bytes, and wrote %d", n, stream.Len())
			}
			if err := s.rt.Destroy(ctx, ref); err != nil {
				t.Fatal(err)
			}
			if _, err := arch.ExportDisk(ctx, ref, &sink); !torpor.IsCode(err, torpor.ENotFound) {
				t.Errorf("ExportDisk of a destroyed sandbox: err = %v, want not_found", err)
			}

			bare := torpor.InstanceRef{SandboxID: spec.SandboxID}
			dst := s.rt
			if s.h.Elsewhere != nil {
				dst = s.h.Elsewhere(t)
			}
			dstArch, ok := dst.(torpor.DiskArchiver)
			if !ok {
				t.Fatal("the other runtime has no torpor.DiskArchiver")
			}
			good := stream.Bytes()
			flipped := bytes.Clone(good)
			flipped[len(flipped)/2] ^= 0x10
			badMagic := bytes.Clone(good)
			badMagic[0] ^= 0xff
			for name, b := range map[string][]byte{"cut in half": good[:len(good)/2], "without its last byte": good[:len(good)-1], "with a byte flipped": flipped, "with a bad header": badMagic} {
				if err := dstArch.ImportDisk(ctx, spec.SandboxID, bytes.NewReader(b)); err == nil {
					t.Errorf("ImportDisk of the stream %s succeeded", name)
				}
				if st := s.inspect(t, dst, bare); st.DiskExists {
					t.Errorf("ImportDisk of the stream %s left a disk", name)
				}
				if ids, err := dst.List(ctx); err != nil || count(ids, spec.SandboxID) != 0 {
					t.Errorf("after ImportDisk of the stream %s, List = %v, %v: want no %s", name, ids, err, spec.SandboxID)
				}
			}
			if err := dstArch.ImportDisk(ctx, spec.SandboxID, bytes.NewReader(good)); err != nil {
				t.Fatalf("ImportDisk: %v", err)
			}
			if st := s.inspect(t, dst, bare); st.State != torpor.InstanceMissing || !st.DiskExists {
				t.Errorf("after ImportDisk: %+v, want no instance and a disk", st)
			}
			ref2 := torpor.InstanceRef{SandboxID: spec.SandboxID}
			t.Cleanup(func() {
				ctx, cancel := context.WithTimeout(context.Background(), safety)
				defer cancel()
				if err := dst.Destroy(ctx, ref2); err != nil {
					t.Errorf("cleanup: destroy %s: %v", ref2.SandboxID, err)
				}
			})
			handle, err := dst.Boot(ctx, spec)
			if err != nil {
				t.Fatalf("Boot on the imported disk: %v", err)
			}
			ref2.Handle = handle
			if got := s.readFiles(t, dst, ref2); got != want {
				t.Errorf("the files on the imported disk:\n%s\nwant, as before the export:\n%s", got, want)
			}
		})
	}
}

// Files the disk archive test writes and reads back: kinds of entries a
// disk holds (a file of another mode, one of several records,
// a symbolic link, a deleted file of the template).
const (
	putScript = "echo kept > /root/archived && chmod 4750 /root/archived && " +
		"dd if=/dev/urandom of=/root/big bs=65536 count=48 2>/dev/null && ln -s ../root/archived /root/link && " +
		"mkdir -p /root/empty/dir && rm -f /etc/shells"
	readScript = "cat /root/archived; stat -c '%u:%g %a' /root/archived; md5sum /root/big; readlink /root/link; " +
		"ls -d /root/empty/dir; test -e /etc/shells && echo shells-back || echo shells-gone"
)

// putFiles writes files on the sandbox's disk and returns what readFiles
// reads of them: through exec when the runtime runs processes, else
// through its torpor.FileRoot; with neither, it writes nothing.
func (s *suite) putFiles(t *testing.T, rt torpor.Runtime, ref torpor.InstanceRef) string {
	t.Helper()
	if s.h.Processes {
		s.sh(t, ref, putScript)
	} else if fr, ok := rt.(torpor.FileRoot); ok {
		root, err := fr.RootFS(testCtx(t), ref)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.MkdirAll(filepath.Join(root, "root"), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(root, "root/archived"), []byte("kept\n"), 0o640); err != nil {
			t.Fatal(err)
		}
	}
	return s.readFiles(t, rt, ref)
}

func (s *suite) readFiles(t *testing.T, rt torpor.Runtime, ref torpor.InstanceRef) string {
	t.Helper()
	if s.h.Processes {
		out, errs, code := runIn(t, rt, ref, torpor.ExecRequest{Cmd: []string{"/bin/sh", "-c", readScript}})
		if code != 0 {
			t.Fatalf("reading the files: exit %d, stderr %q", code, errs)
		}
		return out
	}
	fr, ok := rt.(torpor.FileRoot)
	if !ok {
		return ""
	}
	root, err := fr.RootFS(testCtx(t), ref)
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join(root, "root/archived"))
	if err != nil {
		return err.Error()
	}
	return string(b)
}
