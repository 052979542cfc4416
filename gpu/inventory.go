package gpu

import (
	"context"
	"slices"
	"strings"
)

// Device is one GPU of a host.
type Device struct {
	Index    int
	Model    string
	TotalMiB int64
}

// Inventory is an optional Host capability: the host's GPUs, with their
// model. A host without it is described by its usage probe's devices,
// with no model.
type Inventory interface {
	Devices(ctx context.Context) ([]Device, error)
}

// Capacity is a host's GPUs as a node of a fleet says them: how many,
// of which model (several models are joined with " + "), and their VRAM
// in all.
type Capacity struct {
	Count    int
	Model    string
	TotalMiB int64
}

// Capacity describes the manager's host. It asks the host (Inventory,
// else a usage reading), so a caller keeps the answer rather than asking
// at each placement.
func (m *Manager) Capacity(ctx context.Context) (Capacity, error) {
	var devs []Device
	if inv, ok := m.host.(Inventory); ok {
		d, err := inv.Devices(ctx)
		if err != nil {
			return Capacity{}, err
		}
		devs = d
	} else {
		u, err := m.host.Usage(ctx)
		if err != nil {
			return Capacity{}, err
		}
		for _, d := range u.Devices {
			devs = append(devs, Device{Index: d.Index, TotalMiB: d.TotalMiB})
		}
	}
	c := Capacity{Count: len(devs)}
	var models []string
	for _, d := range devs {
		c.TotalMiB += d.TotalMiB
		if d.Model != "" && !slices.Contains(models, d.Model) {
			models = append(models, d.Model)
		}
	}
	c.Model = strings.Join(models, " + ")
	return c, nil
}

// HeldVRAMMiB is the VRAM the slices of the leases that hold a seat take
// (resident leases, frozen ones included): what a new lease cannot have.
// A spilled or dead lease holds none.
func (m *Manager) HeldVRAMMiB() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	var n int64
	for _, l := range m.leases {
		if l.phase == PhaseResident {
			n += l.spec.Accel.VRAMMiB
		}
	}
	return n
}
