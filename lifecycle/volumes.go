package lifecycle

import (
	"context"
	"fmt"
	"slices"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/files"
)

// Tenants' volumes (docs/volumes.md): the store keeps their records, the
// runtime that is a torpor.VolumeHost their data. A sandbox names the
// volumes it mounts (Sandbox.VolumeMounts); each boot (create, start from
// hibernation, restart) binds them again, so that a volume keeps its
// files whatever becomes of the sandboxes.

// FailureVolume is the failure of a boot that could not mount one of the
// sandbox's volumes.
const FailureVolume = "volume_unavailable"

// volumeHost returns the runtime that keeps volumes: the default one if
// it can, else the first by kind that can.
func (e *Engine) volumeHost() (torpor.VolumeHost, error) {
	if vh, ok := e.runtimes[e.defKind].(torpor.VolumeHost); ok {
		return vh, nil
	}
	for _, info := range e.Runtimes() {
		if vh, ok := e.runtimes[info.Kind].(torpor.VolumeHost); ok {
			return vh, nil
		}
	}
	return nil, torpor.Errorf(torpor.EUnavailable, "no runtime of this server keeps volumes")
}

// volumeLock serialises the create of a sandbox that mounts tenant's
// volume name with the volume's delete.
func (e *Engine) volumeLock(tenant, name string) func() {
	return e.locks.Lock("volume\x00" + tenant + "\x00" + name)
}

// volumeLocks takes the locks of the volumes ms names, each once, in
// order, and returns the function that releases them.
func (e *Engine) volumeLocks(tenant string, ms []torpor.VolumeMount) func() {
	var names []string
	for _, m := range ms {
		names = append(names, m.Name)
	}
	slices.Sort(names)
	names = slices.Compact(names)
	unlocks := make([]func(), 0, len(names))
	for _, n := range names {
		unlocks = append(unlocks, e.volumeLock(tenant, n))
	}
	return func() {
		for i := len(unlocks) - 1; i >= 0; i-- {
			unlocks[i]()
		}
	}
}

// CreateVolume makes tenant's volume name of sizeMiB: its record, then
// its data.
func (e *Engine) CreateVolume(ctx context.Context, tenant, name string, sizeMiB int64) (torpor.Volume, error) {
	if err := torpor.ValidateVolumeName(name); err != nil {
		return torpor.Volume{}, err
	}
	if err := torpor.ValidateVolumeSize(sizeMiB); err != nil {
		return torpor.Volume{}, err
	}
	vh, err := e.volumeHost()
	if err != nil {
		return torpor.Volume{}, err
	}
	defer e.volumeLock(tenant, name)()
	now := e.now()
	v := torpor.Volume{Tenant: tenant, Name: name, ID: torpor.NewID("vol_", 20), SizeMiB: sizeMiB, Node: e.node, CreatedAt: now, UpdatedAt: now}
	if err := e.store.CreateVolume(ctx, v); err != nil {
		return torpor.Volume{}, err
	}
	if err := vh.MakeVolume(ctx, v.ID, sizeMiB); err != nil {
		// What MakeVolume made of it (its directory, a part-made image)
		// goes with the record: nothing else would name it.
		if rerr := vh.RemoveVolume(context.WithoutCancel(ctx), v.ID); rerr != nil {
			e.log.Warn("volumes: removing the data of a volume not made", "volume", name, "id", v.ID, "err", rerr)
		}
		if derr := e.store.DeleteVolume(context.WithoutCancel(ctx), tenant, name); derr != nil {
			e.log.Warn("volumes: removing the record of a volume not made", "volume", name, "err", derr)
		}
		if torpor.IsDiskFull(err) {
			return torpor.Volume{}, torpor.DiskFull()
		}
		return torpor.Volume{}, err
	}
	return e.volumeView(ctx, vh, v), nil
}

// ListVolumes answers tenant's volumes by name.
func (e *Engine) ListVolumes(ctx context.Context, tenant string) ([]torpor.Volume, error) {
	return e.store.ListVolumes(ctx, tenant)
}

// GetVolume answers one of tenant's volumes with the space it uses and
// the sandboxes that mount it.
func (e *Engine) GetVolume(ctx context.Context, tenant, name string) (torpor.Volume, error) {
	if err := torpor.ValidateVolumeName(name); err != nil {
		return torpor.Volume{}, err
	}
	v, err := e.store.GetVolume(ctx, tenant, name)
	if err != nil {
		return torpor.Volume{}, err
	}
	vh, err := e.volumeHost()
	if err != nil {
		return v, nil
	}
	v = e.volumeView(ctx, vh, v)
	users, err := e.volumeUsers(ctx, tenant, name)
	if err != nil {
		return torpor.Volume{}, err
	}
	v.MountedBy = users
	return v, nil
}

// volumeView fills in the space v uses, where its runtime can tell.
func (e *Engine) volumeView(ctx context.Context, vh torpor.VolumeHost, v torpor.Volume) torpor.Volume {
	if used, err := vh.VolumeUsed(ctx, v.ID); err == nil {
		v.UsedBytes = &used
	} else if !torpor.IsCode(err, torpor.EConflict) { // held by a VM: not mounted here
		e.log.Warn("volumes: space used", "volume", v.Name, "tenant", v.Tenant, "err", err)
	}
	return v
}

// volumeUsers returns the ids of tenant's sandboxes that are not
// terminated and mount its volume name.
func (e *Engine) volumeUsers(ctx context.Context, tenant, name string) ([]string, error) {
	sbs, err := e.store.ListSandboxes(ctx, torpor.SandboxFilter{Tenant: tenant})
	if err != nil {
		return nil, err
	}
	users := []string{}
	for _, sb := range sbs {
		if slices.ContainsFunc(sb.VolumeMounts, func(m torpor.VolumeMount) bool { return m.Name == name }) {
			users = append(users, sb.ID)
		}
	}
	return users, nil
}

// ResizeVolume grows tenant's volume name to sizeMiB; a smaller size is
// refused (an ext4 file system does not shrink while mounted, and what
// it holds may not fit).
func (e *Engine) ResizeVolume(ctx context.Context, tenant, name string, sizeMiB int64) (torpor.Volume, error) {
	if err := torpor.ValidateVolumeName(name); err != nil {
		return torpor.Volume{}, err
	}
	if err := torpor.ValidateVolumeSize(sizeMiB); err != nil {
		return torpor.Volume{}, err
	}
	vh, err := e.volumeHost()
	if err != nil {
		return torpor.Volume{}, err
	}
	defer e.volumeLock(tenant, name)()
	v, err := e.store.GetVolume(ctx, tenant, name)
	if err != nil {
		return torpor.Volume{}, err
	}
	switch {
	case sizeMiB < v.SizeMiB:
		return torpor.Volume{}, torpor.Invalid("size_mib", "a volume cannot shrink: %q is %d MiB", name, v.SizeMiB)
	case sizeMiB == v.SizeMiB:
		return e.GetVolume(ctx, tenant, name)
	}
	if err := vh.GrowVolume(ctx, v.ID, sizeMiB); err != nil {
		if torpor.IsDiskFull(err) {
			return torpor.Volume{}, torpor.DiskFull()
		}
		return torpor.Volume{}, err
	}
	if _, err := e.store.ResizeVolume(ctx, tenant, name, sizeMiB, e.now()); err != nil {
		return torpor.Volume{}, err
	}
	return e.GetVolume(ctx, tenant, name)
}

// DeleteVolume removes tenant's volume name and its data, refused while a
// sandbox that is not terminated mounts it.
func (e *Engine) DeleteVolume(ctx context.Context, tenant, name string) error {
	if err := torpor.ValidateVolumeName(name); err != nil {
		return err
	}
	defer e.volumeLock(tenant, name)()
	v, err := e.store.GetVolume(ctx, tenant, name)
	if err != nil {
		return err
	}
	// The record goes first, then the data: the store's delete is where
	// the check that no sandbox mounts the volume is (one transaction),
	// so removing the image before it could destroy a volume in use. A
	// crash or a failed removal between the two leaves an image no record
	// names, which the sweep at the daemon's start removes
	// (sweepVolumes).
	if err := e.store.DeleteVolume(ctx, tenant, name); err != nil {
		return err
	}
	vh, err := e.volumeHost()
	if err != nil {
		return nil
	}
	if err := vh.RemoveVolume(ctx, v.ID); err != nil {
		e.log.Warn("volumes: removing the data of a deleted volume", "volume", name, "id", v.ID, "tenant", tenant, "err", err)
	}
	return nil
}

// VolumeFS returns the files of tenant's volume name, confined to it, for
// the files API: its root is the volume's root.
func (e *Engine) VolumeFS(ctx context.Context, tenant, name string) (files.FS, error) {
	if err := torpor.ValidateVolumeName(name); err != nil {
		return nil, err
	}
	v, err := e.store.GetVolume(ctx, tenant, name)
	if err != nil {
		return nil, err
	}
	vh, err := e.volumeHost()
	if err != nil {
		return nil, err
	}
	dir, err := vh.VolumeDir(ctx, v.ID)
	if err != nil {
		return nil, err
	}
	root, err := files.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	return files.HostFS(root), nil
}

// wireVolumeDevices hands the volume host's images to the runtimes that
// attach volumes as block devices (VMs), and tells the host who holds
// which (docs/volumes.md, "VM sandboxes").
func (e *Engine) wireVolumeDevices() {
	vh, err := e.volumeHost()
	if err != nil {
		return
	}
	vd, ok := vh.(torpor.VolumeDevices)
	if !ok {
		return
	}
	var attachers []torpor.VolumeAttacher
	for _, info := range e.Runtimes() {
		if a, ok := e.runtimes[info.Kind].(torpor.VolumeAttacher); ok {
			a.UseVolumeDevices(vd)
			attachers = append(attachers, a)
		}
	}
	if len(attachers) == 0 {
		return
	}
	e.volumeDevices = true
	e.volumeAttachers = attachers
	vd.SetVolumeHolder(e.volumeHolder)
}

// volumeHolder answers the VM sandbox that holds volume id, if one does.
func (e *Engine) volumeHolder(id string) (string, bool) {
	for _, a := range e.volumeAttachers {
		if sb, ok := a.VolumeHolder(id); ok {
			return sb, true
		}
	}
	return "", false
}

// mountsVolumes reports whether sandboxes of rt can mount volumes.
func (e *Engine) mountsVolumes(rt torpor.Runtime) bool {
	if _, ok := rt.(torpor.VolumeHost); ok {
		return true
	}
	_, ok := rt.(torpor.VolumeAttacher)
	return ok && e.volumeDevices
}

// holdsInstance reports whether a sandbox in state s has (or will have
// at once) an instance that uses its volumes.
func holdsInstance(s torpor.State) bool {
	switch s {
	case torpor.StateHibernated, torpor.StateTerminated, torpor.StateFailed:
		return false
	}
	return true
}

// checkVolumeMounts refuses a create (or a boot: self is then the
// sandbox) whose volume mounts name a volume the tenant does not have,
// whose runtime cannot mount volumes, or one that a VM holds alone: a
// volume a VM sandbox mounts is that VM's while it runs or is paused,
// and a VM mounts only a volume no other sandbox with an instance does.
func (e *Engine) checkVolumeMounts(ctx context.Context, tenant string, rt torpor.Runtime, ms []torpor.VolumeMount) error {
	return e.checkVolumeMountsFor(ctx, tenant, "", rt, ms)
}

func (e *Engine) checkVolumeMountsFor(ctx context.Context, tenant, self string, rt torpor.Runtime, ms []torpor.VolumeMount) error {
	if len(ms) == 0 {
		return nil
	}
	if !e.mountsVolumes(rt) {
		return torpor.Invalid("volume_mounts", "sandboxes of the %s runtime cannot mount volumes on this server (docs/volumes.md)", rt.Kind())
	}
	_, isVM := rt.(torpor.VolumeAttacher)
	for _, m := range ms {
		v, err := e.store.GetVolume(ctx, tenant, m.Name)
		if err != nil {
			if torpor.IsCode(err, torpor.ENotFound) {
				return torpor.Invalid("volume_mounts."+m.Name, "no volume %q: create it first (torpor volumes create)", m.Name)
			}
			return err
		}
		if sb, held := e.volumeHolder(v.ID); held && sb != self {
			err := torpor.AsError(torpor.VolumeHeld(m.Name, sb))
			err.Param = "volume_mounts." + m.Name
			return err
		}
		if !isVM {
			continue
		}
		sbs, err := e.store.ListSandboxes(ctx, torpor.SandboxFilter{Tenant: tenant})
		if err != nil {
			return err
		}
		for _, sb := range sbs {
			if sb.ID == self || !holdsInstance(sb.State) {
				continue
			}
			if slices.ContainsFunc(sb.VolumeMounts, func(o torpor.VolumeMount) bool { return o.Name == m.Name }) {
				return &torpor.Error{Code: torpor.EConflict, Reason: "volume_in_use", Param: "volume_mounts." + m.Name,
					Message: fmt.Sprintf("volume %q is mounted by sandbox %s (%s): a VM sandbox mounts a volume alone, as a block device; hibernate or delete that sandbox first", m.Name, sb.ID, sb.State)}
			}
		}
	}
	return nil
}

// volumeBinds resolves sb's volume mounts for a boot.
func (e *Engine) volumeBinds(ctx context.Context, sb *torpor.Sandbox) ([]torpor.VolumeBind, error) {
	var out []torpor.VolumeBind
	for _, m := range sb.VolumeMounts {
		v, err := e.store.GetVolume(ctx, sb.Tenant, m.Name)
		if torpor.IsCode(err, torpor.ENotFound) {
			return nil, &torpor.Error{Code: torpor.EConflict, Param: "volume_mounts." + m.Name,
				Message: fmt.Sprintf("sandbox %s mounts volume %q, which no longer exists", sb.ID, m.Name)}
		}
		if err != nil {
			return nil, err
		}
		out = append(out, torpor.VolumeBind{ID: v.ID, SizeMiB: v.SizeMiB, Path: m.Path, ReadOnly: m.ReadOnly})
	}
	return out, nil
}

// sweepVolumes runs at the daemon's start (Recover): it removes the data
// of every volume the runtime keeps that no record names (a volume whose
// delete or create was cut short between the record and its image), and
// mounts the others again where they are not mounted (after a host
// reboot). A store that cannot list the records sweeps nothing.
func (e *Engine) sweepVolumes(ctx context.Context) {
	vh, err := e.volumeHost()
	if err != nil {
		return
	}
	lister, ok := vh.(torpor.VolumeLister)
	if !ok {
		return
	}
	ids, err := lister.VolumeIDs(ctx)
	if err != nil {
		e.log.Warn("volumes: listing the volumes on this node", "err", err)
		return
	}
	if len(ids) == 0 {
		return
	}
	tenants, err := e.store.ListTenants(ctx)
	if err != nil {
		e.log.Warn("volumes: listing tenants to sweep volumes", "err", err)
		return
	}
	named := map[string]bool{}
	for _, t := range tenants {
		vs, err := e.store.ListVolumes(ctx, t.Name)
		if err != nil {
			e.log.Warn("volumes: listing volumes to sweep them", "tenant", t.Name, "err", err)
			return
		}
		for _, v := range vs {
			named[v.ID] = true
		}
	}
	for _, id := range ids {
		if !named[id] {
			e.log.Info("volumes: removing the data of a volume no record names", "id", id)
			if err := vh.RemoveVolume(ctx, id); err != nil {
				e.log.Warn("volumes: removing the data of a volume no record names", "id", id, "err", err)
			}
			continue
		}
		if _, err := vh.VolumeDir(ctx, id); err != nil && !torpor.IsCode(err, torpor.EConflict) {
			e.log.Warn("volumes: mounting a volume", "id", id, "err", err)
		}
	}
}

// checkVolumesFree refuses a cold start of sb while one of its volumes
// is held by a VM sandbox (or, for a VM, mounted by another sandbox with
// an instance): 409, the sandbox staying as it is, rather than a boot
// that fails.
func (e *Engine) checkVolumesFree(ctx context.Context, sb *torpor.Sandbox) error {
	if len(sb.VolumeMounts) == 0 {
		return nil
	}
	rt, err := e.runtime(sb.Runtime.Kind)
	if err != nil {
		return err
	}
	err = e.checkVolumeMountsFor(ctx, sb.Tenant, sb.ID, rt, sb.VolumeMounts)
	if e := torpor.AsError(err); err != nil && e.Code == torpor.EConflict && e.Reason == "volume_in_use" {
		return err
	}
	return nil
}
