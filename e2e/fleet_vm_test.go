package e2e

import (
	"context"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

// TestFleetVMSnapshotMoves: a VM sandbox paused by snapshot on n1 is
// uploaded whole (disk and memory, durability remote); n1 is killed; an
// exec through n2, a node of the same host, takes it, downloads its
// snapshot and resumes it there: the process it ran is the same one, and
// what it kept only in memory (tmpfs) is there, and it was billed once.
func TestFleetVMSnapshotMoves(t *testing.T) {
	r, a, b := vmFleet(t)
	ctx := context.Background()
	id, pid := r.pausedVM(a)
	paused := time.Now()
	r.waitSandbox(a, id, "paused by snapshot with durability remote", 60*time.Second, func(sb *torpor.Sandbox) bool {
		return sb.State == torpor.StatePaused && sb.PauseMode == torpor.PauseSnapshot && sb.Durability == torpor.DurabilityRemote
	})
	t.Logf("the snapshot was uploaded %v after the pause", time.Since(paused).Round(time.Millisecond))

	a.kill()
	r.waitNode(b, "n1", torpor.NodeDown, time.Duration(r.down)*time.Second+4*time.Second)
	released := r.waitSandbox(b, id, "released", 15*time.Second, func(sb *torpor.Sandbox) bool { return sb.Node == "" })
	if released.State != torpor.StatePaused || released.Durability != torpor.DurabilityRemote {
		r.fatalf("the released sandbox is %s (%s), want paused and remote, not lost", released.State, released.Durability)
	}

	// An exec wakes it on n2, from its snapshot.
	r.checkMovedVM(b, id, pid)
	evs := sandboxEvents(t, b.cl(), id)
	i := slices.IndexFunc(evs, func(e torpor.Event) bool { return e.Type == torpor.EventReleased })
	if i < 0 {
		r.fatalf("no sandbox.released among %v", eventTypes(evs))
	}
	if after := evs[i+1:]; countEvents(after, torpor.EventClaimed) != 1 || countEvents(after, torpor.EventResumed) != 1 || countEvents(after, torpor.EventStarted) != 0 {
		r.fatalf("after its release: %v, want one claimed and one resumed, no start", eventTypes(after))
	}
	r.checkFleetLedger(b, id)
	if _, err := b.cl().Delete(ctx, id); err != nil {
		r.fatalf("delete the moved sandbox: %v", err)
	}
}

// TestFleetVMSnapshotDrains: a drain of n1 uploads its VM paused by
// snapshot whole and releases it, still paused; a request through n1
// (draining) resumes it on n2, memory and all.
func TestFleetVMSnapshotDrains(t *testing.T) {
	r, a, b := vmFleet(t)
	ctx := context.Background()
	id, pid := r.pausedVM(a)
	if _, err := b.cl().DrainNode(ctx, "n1"); err != nil {
		r.fatalf("drain n1: %v", err)
	}
	released := r.waitSandbox(b, id, "released by the drain", 60*time.Second, func(sb *torpor.Sandbox) bool { return sb.Node == "" })
	if released.State != torpor.StatePaused || released.Durability != torpor.DurabilityRemote {
		r.fatalf("the drained sandbox is %s (%s), want paused and remote", released.State, released.Durability)
	}
	// The record is released first; the drained node's copy goes right
	// after (it failed once when looked at in between).
	waitGone(t, filepath.Join(a.dataDir, "vm", "sandboxes", id))
	r.checkMovedVM(a, id, pid)
}

// vmFleet starts two nodes that run VMs, without a sandbox network: two
// bridges of one machine cannot share a range, and a snapshot's guest
// keeps its address (Host names the network). They are one host.
func vmFleet(t *testing.T) (*fleetRig, *fleetNode, *fleetNode) {
	for _, kv := range needsVM(t) {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	noNet := []string{"--network-bridge", ""}
	r := newFleetRig(t, fleetOptions{Nodes: 2, Args: map[int][]string{1: noNet, 2: noNet}})
	n1, n2 := r.nodeOf(r.node(2), "n1"), r.nodeOf(r.node(2), "n2")
	if n1.Host == "" || n1.Host != n2.Host || !strings.Contains(n1.Host, "qemu") {
		r.fatalf("the nodes' hosts are %q and %q: want one, naming QEMU", n1.Host, n2.Host)
	}
	return r, r.node(1), r.node(2)
}

// pausedVM makes a VM sandbox through via (on it), with a file in tmpfs,
// one on its disk and a process, and pauses it by snapshot; it returns
// the sandbox and the process.
func (r *fleetRig) pausedVM(via *fleetNode) (id, pid string) {
	r.t.Helper()
	sb := r.create(via, torpor.CreateRequest{Isolation: "vm", Resources: &torpor.Resources{MemoryMiB: 256, DiskMiB: 512}})
	if sb.Node != via.name || sb.Runtime.Kind != "vm" {
		r.fatalf("a VM create through %s is a %s sandbox on %q", via.name, sb.Runtime.Kind, sb.Node)
	}
	r.sh(via, sb.ID, "echo in-memory > /dev/shm/kept; echo on-disk > /kept; sync")
	pid = strings.TrimSpace(r.sh(via, sb.ID, "sleep 100000 </dev/null >/dev/null 2>&1 & echo $!"))
	if _, err := via.cl().Pause(context.Background(), sb.ID, torpor.PauseSnapshot); err != nil {
		r.fatalf("pause %s by snapshot: %v", sb.ID, err)
	}
	return sb.ID, pid
}

// checkMovedVM wakes VM sandbox id with an exec through via and checks
// that it resumed on n2 from its snapshot: the files and the process
// pausedVM left, one boot in all.
func (r *fleetRig) checkMovedVM(via *fleetNode, id, pid string) {
	r.t.Helper()
	if out := r.sh(via, id, "cat /dev/shm/kept /kept"); out != "in-memory\non-disk\n" {
		r.fatalf("what the VM kept, after its move: %q", out)
	}
	if out := strings.TrimSpace(r.sh(via, id, "kill -0 "+pid+" && echo alive")); out != "alive" {
		r.fatalf("the process %s after the move: %q", pid, out)
	}
	moved := r.get(via, id)
	if moved.State != torpor.StateRunning || moved.Node != "n2" || moved.Boots != 1 || moved.Durability != torpor.DurabilityNode {
		r.fatalf("the moved sandbox is %s on %q, boots %d, durability %s; want running on n2, booted once, node", moved.State, moved.Node, moved.Boots, moved.Durability)
	}
}
