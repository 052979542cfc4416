package vm

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/runtime/vm/proto"
)

// Volumes (docs/volumes.md) reach a VM as block devices: the volume's
// ext4 image, kept by the volume host (the runc runtime), is attached to
// the sandbox's QEMU as one more virtio disk (machine.Volumes, so that a
// restore from a snapshot starts the same machine), and the guest agent
// mounts it at the mount's path before the setup commands run. ext4 is
// not a cluster file system: while a VM sandbox holds a volume (from its
// boot until its instance is gone for good; a paused sandbox's snapshot
// still holds it) the host does not mount it, so the volume's files
// routes, and any other sandbox that would mount it, are refused
// (torpor.VolumeHeld). The volume's root is the directory data/ of its
// file system, as on the host.

var _ torpor.VolumeAttacher = (*Runtime)(nil)

// machineVolume is a volume's drive on a sandbox's QEMU.
type machineVolume struct {
	ID       string `json:"id"`
	Image    string `json:"image"`
	ReadOnly bool   `json:"read_only,omitempty"`
}

// volumeSerial names the i-th volume drive to the guest (a virtio-blk
// serial: at most 20 bytes).
func volumeSerial(i int) string { return fmt.Sprintf("torpor-vol%d", i) }

// qemuEscape escapes a value of a QEMU option list (a comma doubles).
func qemuEscape(s string) string { return strings.ReplaceAll(s, ",", ",,") }

// volumeArgs are the QEMU arguments of m's volume drives.
func (m machine) volumeArgs() []string {
	var a []string
	for i, v := range m.Volumes {
		drive := fmt.Sprintf("id=vol%d,if=none,format=raw,file=%s,discard=unmap", i, qemuEscape(v.Image))
		if v.ReadOnly {
			drive += ",readonly=on"
		}
		a = append(a, "-drive", drive, "-device", fmt.Sprintf("virtio-blk-device,drive=vol%d,serial=%s", i, volumeSerial(i)))
	}
	return a
}

// UseVolumeDevices is how the engine hands the runtime the volume host's
// images.
func (r *Runtime) UseVolumeDevices(vd torpor.VolumeDevices) {
	r.volMu.Lock()
	defer r.volMu.Unlock()
	r.volDevs = vd
}

func (r *Runtime) volumeDevices() torpor.VolumeDevices {
	r.volMu.Lock()
	defer r.volMu.Unlock()
	return r.volDevs
}

// setBooting marks sandbox id as booting (or restoring): its machine's
// volumes are held from before QEMU starts.
func (r *Runtime) setBooting(id string, on bool) {
	r.volMu.Lock()
	defer r.volMu.Unlock()
	if r.booting == nil {
		r.booting = map[string]bool{}
	}
	if on {
		r.booting[id] = true
	} else {
		delete(r.booting, id)
	}
}

// VolumeHolder answers the sandbox whose machine has volume vol as a
// drive and that holds it: booting, running (its QEMU alive) or paused
// with a snapshot to restore.
func (r *Runtime) VolumeHolder(vol string) (string, bool) {
	ents, err := os.ReadDir(filepath.Join(r.dir, "sandboxes"))
	if err != nil {
		return "", false
	}
	for _, ent := range ents {
		id := ent.Name()
		if !torpor.ValidID(id) {
			continue
		}
		var m machine
		if ok, err := r.loadJSON(id, "machine.json", &m); err != nil || !ok {
			continue
		}
		if !slices.ContainsFunc(m.Volumes, func(v machineVolume) bool { return v.ID == vol }) {
			continue
		}
		r.volMu.Lock()
		booting := r.booting[id]
		r.volMu.Unlock()
		if booting {
			return id, true
		}
		if _, err := os.Stat(filepath.Join(r.snapshotDir(id), metaFile)); err == nil {
			return id, true
		}
		var in instance
		if ok, _ := r.loadJSON(id, "instance.json", &in); ok && in.Alive() {
			return id, true
		}
	}
	return "", false
}

// takeVolumes takes the images of a boot's volumes from the volume host
// (the caller has marked the sandbox booting) and returns the machine's
// drives, one a volume (read-only when every mount of it is), and what
// the agent mounts where.
func (r *Runtime) takeVolumes(ctx context.Context, binds []torpor.VolumeBind) ([]machineVolume, []proto.Volume, error) {
	if len(binds) == 0 {
		return nil, nil, nil
	}
	vd := r.volumeDevices()
	if vd == nil {
		return nil, nil, torpor.Invalid("volume_mounts", "this server has no volume host for VM sandboxes")
	}
	var drives []machineVolume
	var mounts []proto.Volume
	index := map[string]int{}
	for _, b := range binds {
		i, ok := index[b.ID]
		if !ok {
			image, err := vd.TakeVolume(ctx, b.ID)
			if err != nil {
				return nil, nil, err
			}
			i = len(drives)
			index[b.ID] = i
			drives = append(drives, machineVolume{ID: b.ID, Image: image, ReadOnly: true})
		}
		if !b.ReadOnly {
			drives[i].ReadOnly = false
		}
		mounts = append(mounts, proto.Volume{Serial: volumeSerial(i), Path: b.Path, ReadOnly: b.ReadOnly})
	}
	return drives, mounts, nil
}

// retakeVolumes takes a restored machine's volumes again (the host holds
// none of them while the snapshot does, but a host mount made before
// this runtime knew of the snapshot is ended here).
func (r *Runtime) retakeVolumes(ctx context.Context, m machine) error {
	if len(m.Volumes) == 0 {
		return nil
	}
	vd := r.volumeDevices()
	if vd == nil {
		return snapshotError("it mounts volumes, and this server has no volume host for VM sandboxes")
	}
	for _, v := range m.Volumes {
		image, err := vd.TakeVolume(ctx, v.ID)
		if err != nil {
			return err
		}
		if image != v.Image {
			return snapshotError("volume %s's image moved from %s to %s", v.ID, v.Image, image)
		}
	}
	return nil
}
