package runc

import (
	"context"
	"fmt"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/runtime/instances"
)

// Freeze stops every process of the instance with the cgroup freezer.
// Freezing a frozen instance succeeds.
func (r *Runtime) Freeze(ctx context.Context, ref torpor.InstanceRef) error {
	return r.setFrozen(ctx, ref, true)
}

// Thaw lets a frozen instance continue. Thawing a running one succeeds.
func (r *Runtime) Thaw(ctx context.Context, ref torpor.InstanceRef) error {
	return r.setFrozen(ctx, ref, false)
}

func (r *Runtime) setFrozen(ctx context.Context, ref torpor.InstanceRef, frozen bool) error {
	verb := "thaw"
	if frozen {
		verb = "freeze"
	}
	id, err := checkRef(ref)
	if err != nil {
		return err
	}
	defer r.locks.Lock(id)()
	in, alive, err := r.lookup(ctx, id)
	if err != nil {
		return fmt.Errorf("runc: %s %s: %w", verb, id, err)
	}
	switch {
	case in == nil:
		return instances.StateError(verb, torpor.InstanceStatus{State: torpor.InstanceMissing})
	case !alive:
		return instances.StateError(verb, torpor.InstanceStatus{State: torpor.InstanceStopped})
	}
	// Writing the state it is already in is harmless, so there is no
	// need to read it first.
	if frozen {
		err = r.cg.freeze(ctx, r.cgroupRel(id))
	} else {
		err = r.cg.thaw(ctx, r.cgroupRel(id))
	}
	if err != nil {
		return fmt.Errorf("runc: %s %s: %w", verb, id, err)
	}
	return nil
}
