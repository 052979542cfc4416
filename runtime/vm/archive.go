package vm

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/runtime/diskarchive"
	"github.com/torpor-dev/torpor/runtime/instances"
)

var _ torpor.DiskArchiver = (*Runtime)(nil)

// A sandbox's disk is a qcow2 overlay on its template's image, and that
// image is this node's own: its name (imageKey) and its bytes (mkfs.ext4
// -d) differ from another node's image of the same template, so the
// overlay cannot travel without it. The disk travels as the whole disk
// the guest sees instead, the template's files and the sandbox's writes:
// a raw image (qemu-img convert, which leaves the zeros out as holes) in
// a diskarchive stream. The node that imports it makes a qcow2 image of
// it with no backing file, which boots as any disk does; it does not
// share its template's image.
//
// The import converts the stream from raw, named as such (qemu-img -f
// raw), so nothing in the stream is read as an image format: a qcow2
// header in it could otherwise name a host file as its backing file.

// Names, in the sandbox's directory, of the raw images an export or an
// import writes on its way; a crash leaves them, the next one removes
// them.
const (
	exportRawName = "disk.export.raw"
	importRawName = "disk.import.raw"
	importName    = "disk.qcow2.import"
)

// ExportDisk writes the disk of a sandbox whose VM has stopped (Stop
// quits QEMU, which flushes the disk) to w and returns the bytes written.
// A running or frozen VM is a conflict; a sandbox without a disk is
// not_found. A snapshot the sandbox has stays here: only the disk
// travels.
func (r *Runtime) ExportDisk(ctx context.Context, ref torpor.InstanceRef, w io.Writer) (int64, error) {
	var n int64
	err := instances.Locked(&r.locks, ref, checkRef, "vm: export disk", func(id string) error {
		if err := r.quiesce(ctx, id, "export the disk of"); err != nil {
			return err
		}
		if !r.diskExists(id) {
			return torpor.Errorf(torpor.ENotFound, "sandbox %s has no disk", id)
		}
		raw := r.sandboxPath(id, exportRawName)
		_ = os.Remove(raw)
		defer os.Remove(raw)
		if err := r.convert(ctx, "qcow2", r.diskPath(id), "raw", raw); err != nil {
			return err
		}
		var err error
		n, err = diskarchive.WriteImage(ctx, w, raw)
		return err
	})
	return n, err
}

// ImportDisk makes the disk of sandbox id from a stream ExportDisk wrote,
// replacing any disk (and snapshot) it has, ready for a Boot. The disk is
// moved into place only once all of the stream has been read and found
// good (diskarchive.Import), so a refused or failed import leaves the
// sandbox the disk it had (none, and no directory, for a new one).
// A running or frozen VM is a conflict.
func (r *Runtime) ImportDisk(ctx context.Context, id string, src io.Reader) error {
	return instances.Locked(&r.locks, torpor.InstanceRef{SandboxID: id}, checkRef, "vm: import disk", func(id string) error {
		if err := r.quiesce(ctx, id, "replace the disk of"); err != nil {
			return err
		}
		return diskarchive.Import(src, r.sandboxDir(id), 0o700, func(rd *diskarchive.Reader) error {
			if rd.Kind != diskarchive.Image {
				return torpor.Invalid("disk", "the disk stream is refused: it holds a %s, and a VM's disk is an image", rd.Kind)
			}
			return r.importDisk(ctx, id, rd)
		})
	})
}

func (r *Runtime) importDisk(ctx context.Context, id string, rd *diskarchive.Reader) error {
	raw, tmp := r.sandboxPath(id, importRawName), r.sandboxPath(id, importName)
	_ = os.Remove(raw)
	_ = os.Remove(tmp)
	defer os.Remove(raw)
	f, err := os.OpenFile(raw, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err != nil {
		return err
	}
	err = rd.ExtractImage(ctx, f)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = r.convert(ctx, "raw", raw, "qcow2", tmp)
	}
	if err == nil {
		// The snapshot was of the disk this one replaces.
		err = r.dropSnapshot(id)
	}
	if err == nil {
		err = os.Rename(tmp, r.diskPath(id))
	}
	if err != nil {
		_ = os.Remove(tmp)
		return err
	}
	return nil
}

// quiesce makes sure no QEMU has the sandbox's disk open: a live VM is a
// conflict, and one that stopped by itself is removed as Stop removes it.
func (r *Runtime) quiesce(ctx context.Context, id, verb string) error {
	st, _, err := r.inspect(ctx, id)
	if err != nil {
		return err
	}
	if instances.Live(st) {
		return &torpor.Error{Code: torpor.EConflict, Reason: "state",
			Message: fmt.Sprintf("cannot %s sandbox %s while its VM is %s: stop it first", verb, id, st.State)}
	}
	if st.State == torpor.InstanceStopped {
		return r.removeInstance(ctx, id)
	}
	return nil
}

// convert copies the image src (of format from) to a new image dst (of
// format to) with qemu-img.
func (r *Runtime) convert(ctx context.Context, from, src, to, dst string) error {
	cmd := exec.CommandContext(ctx, r.qemuImg, "convert", "-q", "-f", from, "-O", to, src, dst)
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("qemu-img convert: %v: %s", err, bytes.TrimSpace(out))
	}
	return nil
}
