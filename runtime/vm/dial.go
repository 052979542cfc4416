package vm

import (
	"context"
	"net"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/runtime/vm/proto"
)

var (
	_ torpor.Dialer      = (*Runtime)(nil)
	_ torpor.CPUReporter = (*Runtime)(nil)
)

// DialContext connects to addr inside the guest (its loopback: a VM
// without internet access has no other interface). The agent dials and
// relays the connection's bytes over its port; the connection holds the
// agent connection until it is closed.
func (r *Runtime) DialContext(ctx context.Context, ref torpor.InstanceRef, network, addr string) (net.Conn, error) {
	id, err := checkRef(ref)
	if err != nil {
		return nil, err
	}
	switch network {
	case "tcp", "tcp4", "tcp6", "unix":
	default:
		return nil, torpor.Invalid("network", "cannot dial %q in a VM", network)
	}
	ac, release, err := r.liveAgent(ctx, id, "connect to")
	if err != nil {
		return nil, err
	}
	mine, theirs := net.Pipe()
	rid := ac.newID()
	in := ac.c.Receive(rid, proto.Stdout, mine)
	ch, err := ac.send(rid, proto.OpDial, proto.Dial{Network: network, Addr: addr})
	if err == nil {
		err = ac.await(ctx, rid, ch, nil)
	}
	if err != nil {
		ac.c.Drop(rid)
		mine.Close()
		theirs.Close()
		release()
		return nil, agentError(id, err)
	}
	// Bytes the caller writes go to the guest; when either side ends,
	// both do (net.Pipe has no half close).
	go func() {
		_ = ac.c.SendStream(context.Background(), rid, proto.Stdin, mine)
		_ = ac.c.Send(&proto.Frame{T: proto.TCancel, ID: rid})
		ac.c.Drop(rid)
		release()
	}()
	go func() {
		<-in.Done() // everything the guest sent has been read
		mine.Close()
	}()
	return theirs, nil
}

// CPUUsage returns the CPU time the sandbox's processes used since boot
// (the guest's cgroup accounting; time spent frozen or snapshotted does
// not count).
func (r *Runtime) CPUUsage(ctx context.Context, ref torpor.InstanceRef) (time.Duration, error) {
	id, err := checkRef(ref)
	if err != nil {
		return 0, err
	}
	ac, release, err := r.liveAgent(ctx, id, "measure")
	if err != nil {
		return 0, err
	}
	defer release()
	var cpu proto.CPU
	if err := ac.call(ctx, proto.OpCPU, nil, &cpu); err != nil {
		return 0, agentError(id, err)
	}
	return time.Duration(cpu.UsageUsec) * time.Microsecond, nil
}
