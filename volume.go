package torpor

import (
	"context"
	"path"
	"regexp"
	"strings"
	"time"
)

// Volume is a tenant's named persistent volume (docs/volumes.md): a file
// system of its own size that outlives the sandboxes that mount it.
type Volume struct {
	Tenant string `json:"tenant"`
	Name   string `json:"name"`
	// ID names the volume's data on its node (its image and mount); it
	// is made at create, so that a name deleted and made again is a new
	// volume.
	ID      string `json:"id"`
	SizeMiB int64  `json:"size_mib"`
	// Node is the fleet node whose disk holds the volume ("" on a single
	// server), so that the fleet can place the sandboxes that mount it
	// next to it.
	Node      string    `json:"node"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`

	// UsedBytes and MountedBy are filled in by the engine when it answers
	// one volume, never stored: the blocks in use in its file system,
	// and the sandboxes that are not terminated and mount it.
	UsedBytes *int64   `json:"used_bytes,omitempty"`
	MountedBy []string `json:"mounted_by,omitempty"`
}

// VolumeMount is how a sandbox uses a volume: mounted at Path inside it,
// read-only with ReadOnly.
type VolumeMount struct {
	Name     string `json:"name"`
	Path     string `json:"path"`
	ReadOnly bool   `json:"read_only,omitempty"`
}

// VolumeBind is what a runtime needs of a volume mount at boot: the
// volume's data (ID, its size) and where it goes.
type VolumeBind struct {
	ID       string
	SizeMiB  int64
	Path     string
	ReadOnly bool
}

// VolumeStore keeps tenants' volume records; the data is the runtime's
// (VolumeHost).
type VolumeStore interface {
	// CreateVolume inserts v; its tenant must exist, and a name the
	// tenant already has is a conflict.
	CreateVolume(ctx context.Context, v Volume) error
	// ListVolumes answers tenant's volumes by name.
	ListVolumes(ctx context.Context, tenant string) ([]Volume, error)
	// GetVolume answers one volume; not_found when absent.
	GetVolume(ctx context.Context, tenant, name string) (Volume, error)
	// ResizeVolume sets the size of tenant's volume name at time at;
	// not_found when absent.
	ResizeVolume(ctx context.Context, tenant, name string, sizeMiB int64, at time.Time) (Volume, error)
	// DeleteVolume removes it, in one transaction with the check that no
	// sandbox of the tenant that is not terminated mounts it: otherwise a
	// conflict whose message names such a sandbox. not_found when
	// absent.
	DeleteVolume(ctx context.Context, tenant, name string) error
}

// VolumeHost is an optional Runtime capability: it keeps volumes' data
// on the host, each a file system of a fixed size, and binds them into
// the sandboxes it boots (BootSpec.Volumes). Every method is idempotent.
type VolumeHost interface {
	// MakeVolume makes the volume's file system of sizeMiB if it has none.
	MakeVolume(ctx context.Context, id string, sizeMiB int64) error
	// VolumeDir mounts the volume where it is not mounted and returns the
	// host directory that is its root.
	VolumeDir(ctx context.Context, id string) (string, error)
	// GrowVolume makes the volume's file system sizeMiB large.
	GrowVolume(ctx context.Context, id string, sizeMiB int64) error
	// VolumeUsed returns the bytes in use in its file system.
	VolumeUsed(ctx context.Context, id string) (int64, error)
	// RemoveVolume unmounts the volume and removes its data.
	RemoveVolume(ctx context.Context, id string) error
}

// VolumeLister is an optional VolumeHost capability: it lists the ids
// of the volumes whose data it keeps, so that the engine can remove, at
// its start, the data of volumes no record names.
type VolumeLister interface {
	VolumeIDs(ctx context.Context) ([]string, error)
}

// VolumeDevices is an optional VolumeHost capability: it hands a
// volume's image to a runtime that attaches it to a VM as a block
// device (VolumeAttacher). ext4 is no cluster file system, so a volume a
// VM holds is that VM's alone: the host does not mount it while it is
// held (VolumeDir and GrowVolume are then a conflict naming the holder).
type VolumeDevices interface {
	// TakeVolume unmounts the volume from the host and returns the path
	// of its image, for a VM's drive: a conflict while a host mount of
	// it is still in use (a container sandbox binds it, a files call has
	// it open), which is then mounted again.
	TakeVolume(ctx context.Context, id string) (string, error)
	// SetVolumeHolder tells the host who holds volumes as devices:
	// holder answers the sandbox that holds volume id, if one does.
	SetVolumeHolder(holder func(id string) (sandbox string, held bool))
}

// VolumeAttacher is an optional Runtime capability: its sandboxes mount
// volumes as block devices, their images handed over by a VolumeDevices
// host. A sandbox holds its volumes from its boot until its instance is
// gone for good (a paused sandbox's snapshot keeps them).
type VolumeAttacher interface {
	UseVolumeDevices(VolumeDevices)
	// VolumeHolder answers the sandbox that holds volume id, if one does.
	VolumeHolder(id string) (sandbox string, held bool)
}

// VolumeHeld is the conflict of a volume that a VM sandbox holds.
func VolumeHeld(volume, sandbox string) error {
	return &Error{Code: EConflict, Reason: "volume_in_use",
		Message: "volume " + volume + " is mounted by VM sandbox " + sandbox + ", which holds it alone while it runs or is paused (a VM's volume is a block device, and ext4 is not shared): hibernate or delete that sandbox first"}
}

const (
	// MaxVolumeMounts bounds a sandbox's volume mounts.
	MaxVolumeMounts = 16
	// MinVolumeMiB and MaxVolumeMiB bound a volume's size.
	MinVolumeMiB     = 16
	MaxVolumeMiB     = 1 << 20
	maxVolumePathLen = 1024
)

var volumeNameRe = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)

// ValidateVolumeName checks a volume's name: lower-case letters, digits,
// '.', '_' and '-', starting with a letter or digit, at most 63.
func ValidateVolumeName(name string) error {
	if !volumeNameRe.MatchString(name) {
		return Invalid("name", "volume name %q is not valid (lower-case letters, digits, . _ -; at most 63)", truncate(name))
	}
	return nil
}

// ValidateVolumeSize checks a volume's size in MiB.
func ValidateVolumeSize(sizeMiB int64) error {
	if sizeMiB < MinVolumeMiB || sizeMiB > MaxVolumeMiB {
		return Invalid("size_mib", "size_mib must be %d to %d", MinVolumeMiB, MaxVolumeMiB)
	}
	return nil
}

// ValidateVolumeMounts checks a create's volume mounts: known names,
// absolute clean paths that are not /, /proc, /sys, /dev or below them,
// each path once.
func ValidateVolumeMounts(ms []VolumeMount) error {
	if len(ms) > MaxVolumeMounts {
		return Invalid("volume_mounts", "at most %d volume mounts", MaxVolumeMounts)
	}
	paths := map[string]bool{}
	for i, m := range ms {
		if err := ValidateVolumeName(m.Name); err != nil {
			return Invalid("volume_mounts", "volume name %q is not valid", truncate(m.Name))
		}
		p := m.Path
		param := "volume_mounts." + m.Name
		if len(p) > maxVolumePathLen || !path.IsAbs(p) || strings.ContainsRune(p, 0) {
			return Invalid(param, "path %q must be absolute", truncate(p))
		}
		for _, el := range strings.Split(p, "/") {
			if el == ".." {
				return Invalid(param, "path %q holds ..", truncate(p))
			}
		}
		if path.Clean(p) != p {
			return Invalid(param, "path %q must be clean", truncate(p))
		}
		if p == "/" {
			return Invalid(param, "a volume cannot be mounted at /")
		}
		for _, bad := range []string{"/proc", "/sys", "/dev", "/.torpor"} {
			if p == bad || strings.HasPrefix(p, bad+"/") {
				return Invalid(param, "path %q is under %s", truncate(p), bad)
			}
		}
		for q := range paths {
			if q == p || strings.HasPrefix(p, q+"/") || strings.HasPrefix(q, p+"/") {
				return Invalid(param, "path %q overlaps another volume's", truncate(p))
			}
		}
		paths[p] = true
		_ = i
	}
	return nil
}

// CloneVolumeMounts copies ms (nil stays nil).
func CloneVolumeMounts(ms []VolumeMount) []VolumeMount {
	if ms == nil {
		return nil
	}
	return append([]VolumeMount(nil), ms...)
}
