package storetest

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

func nodeTests() []test {
	return []test{
		{"JoinRegistersAnUpNodeAtEpochOne", testJoinNew},
		{"RejoinKeepsTheEpoch", testRejoinKeepsEpoch},
		{"AnotherInstanceIsRefusedUntilDown", testJoinOtherInstance},
		{"HeartbeatRecordsTimeAndUse", testHeartbeat},
		{"SetStateDrainsAndUndrains", testSetNodeState},
		{"DeclareDownTakesOnlyStaleNodes", testDeclareDownStale},
		{"DownNodeIsFencedUntilItRejoins", testDownFenced},
		{"FencedWritesChangeNothing", testFencedWrites},
		{"FencingIsPerHandle", testFencingPerHandle},
		{"ListNodesCountsSandboxes", testNodeCounts},
		{"FilterByNode", testListNode},
		{"ExclusiveHasOneHolder", testExclusive},
		{"NoWriteCommitsAfterDown", testDeclareDownRace},
	}
}

// nodes returns s as a torpor.NodeStore, or fails the test.
func (h *harness) nodes(s torpor.Store) torpor.NodeStore {
	h.t.Helper()
	ns, ok := s.(torpor.NodeStore)
	if !ok {
		h.t.Fatalf("storetest: %T is not a torpor.NodeStore", s)
	}
	return ns
}

// fleetNode returns a node called name with every field a join stores.
func fleetNode(name string) torpor.Node {
	return torpor.Node{
		Name:         name,
		Instance:     "data-dir-of-" + name,
		Address:      name + ".internal:7420",
		ProxyAddress: name + ".internal:7421",
		Labels:       map[string]string{"zone": "eu-1", "gpu": "none"},
		Runtimes:     []string{"runc", "vm"},
		Host:         "qemu-9.0/linux-6.8",
		Capacity:     torpor.Resources{VCPUs: 15.5, MemoryMiB: 64 << 10, Pids: 100000, DiskMiB: 1 << 20},
		GPUs:         torpor.NodeGPUs{Count: 2, Model: "NVIDIA H100 80GB HBM3", VRAMMiB: 2 * 81559, UsedVRAMMiB: 4096},
	}
}

// join joins n through s and returns its epoch, or fails the test.
func (h *harness) join(s torpor.Store, n torpor.Node) int64 {
	h.t.Helper()
	epoch, err := h.nodes(s).JoinNode(h.t.Context(), n)
	if err != nil {
		h.t.Fatalf("JoinNode(%q): %v", n.Name, err)
	}
	return epoch
}

// listNodes returns the nodes by name, or fails the test.
func (h *harness) listNodes() map[string]torpor.Node {
	h.t.Helper()
	list, err := h.nodes(h.s).ListNodes(h.t.Context())
	if err != nil {
		h.t.Fatalf("ListNodes: %v", err)
	}
	out := map[string]torpor.Node{}
	for i, n := range list {
		if i > 0 && list[i-1].Name >= n.Name {
			h.t.Errorf("ListNodes: %q before %q, want them by name", list[i-1].Name, n.Name)
		}
		out[n.Name] = n
	}
	return out
}

// declareDown calls DeclareDown and returns the names it marked, or fails
// the test.
func (h *harness) declareDown(s torpor.Store, timeout time.Duration) []torpor.Node {
	h.t.Helper()
	down, err := h.nodes(s).DeclareDown(h.t.Context(), timeout)
	if err != nil {
		h.t.Fatalf("DeclareDown(%s): %v", timeout, err)
	}
	return down
}

func names(nodes []torpor.Node) []string {
	out := make([]string, len(nodes))
	for i, n := range nodes {
		out[i] = n.Name
	}
	return out
}

// wantFenced fails the test unless err is torpor.Fenced.
func wantFenced(t *testing.T, err error, what string) {
	t.Helper()
	var e *torpor.Error
	if !errors.As(err, &e) || e.Code != torpor.EUnavailable || e.Reason != torpor.ReasonFenced {
		t.Fatalf("%s: %v, want the unavailable error with reason %q", what, err, torpor.ReasonFenced)
	}
}

// recent fails the test unless tm is a UTC time within a minute of now
// (the database's clock is this machine's in the tests).
func recent(t *testing.T, what string, tm time.Time) {
	t.Helper()
	if tm.Location() != time.UTC || time.Since(tm).Abs() > time.Minute {
		t.Errorf("%s = %s, want about now, in UTC", what, tm)
	}
}

// A first join stores what the node says of itself, up at epoch 1, joined
// and heartbeating now.
func testJoinNew(t *testing.T, h *harness) {
	want := fleetNode("node-a")
	if epoch := h.join(h.s, want); epoch != 1 {
		t.Fatalf("a new node's epoch = %d, want 1", epoch)
	}
	got, ok := h.listNodes()["node-a"]
	if !ok {
		t.Fatal("ListNodes does not list the node that joined")
	}
	recent(t, "JoinedAt", got.JoinedAt)
	if !got.HeartbeatAt.Equal(got.JoinedAt) {
		t.Errorf("HeartbeatAt %s, want the join's time %s", got.HeartbeatAt, got.JoinedAt)
	}
	want.State, want.Epoch, want.JoinedAt, want.HeartbeatAt = torpor.NodeUp, 1, got.JoinedAt, got.HeartbeatAt
	want.Sandboxes = map[torpor.State]int{}
	checkSame(t, "joined node", got, want)

	if _, err := h.nodes(h.s).JoinNode(t.Context(), torpor.Node{}); !torpor.IsCode(err, torpor.EInvalid) {
		t.Errorf("JoinNode without a name: %v, want invalid_argument", err)
	}
}

// A node that joins again without having been declared down (a restart)
// keeps its epoch, and so its sandboxes, and what it says now replaces
// what it said before.
func testRejoinKeepsEpoch(t *testing.T, h *harness) {
	h.join(h.s, fleetNode("node-a"))
	first := h.listNodes()["node-a"]
	time.Sleep(2 * time.Millisecond)
	n := fleetNode("node-a")
	n.Address, n.Labels, n.Capacity.VCPUs = "10.0.0.9:7420", map[string]string{"zone": "eu-2"}, 7
	s := h.restart()
	if epoch := h.join(s, n); epoch != 1 {
		t.Fatalf("a rejoin's epoch = %d, want the node's 1", epoch)
	}
	got := h.listNodes()["node-a"]
	if got.Address != n.Address || !maps.Equal(got.Labels, n.Labels) || got.Capacity.VCPUs != 7 || got.State != torpor.NodeUp {
		t.Errorf("rejoined node = %+v, want the new address, labels and capacity, up", got)
	}
	if !got.JoinedAt.After(first.JoinedAt) {
		t.Errorf("JoinedAt %s after a rejoin, want later than %s", got.JoinedAt, first.JoinedAt)
	}
	// A node whose GPU host went away says so when it joins again.
	n.GPUs = torpor.NodeGPUs{}
	h.join(s, n)
	if got := h.listNodes()["node-a"].GPUs; got != (torpor.NodeGPUs{}) {
		t.Errorf("a node that rejoined without GPUs lists %+v, want none", got)
	}
}

// A daemon of another data dir (another instance: a cloned host) under the
// name of a node that is up is refused, naming the node, and changes
// nothing; a join that gives no instance (an older daemon) is let in and
// keeps the stored one. Once the node is down the other instance takes
// the name, at the new epoch, and the first one is fenced: its
// heartbeats, even at the new epoch, and its join are refused.
func testJoinOtherInstance(t *testing.T, h *harness) {
	ns, ctx := h.nodes(h.s), t.Context()
	mine := fleetNode("node-a")
	h.join(h.s, mine)
	before := h.listNodes()["node-a"]
	if before.Instance != mine.Instance {
		t.Fatalf("the node's instance is %q, want %q", before.Instance, mine.Instance)
	}

	b := h.another()
	clone := fleetNode("node-a")
	clone.Instance, clone.Address = "data-dir-of-a-clone", "10.0.0.99:7420"
	_, err := h.nodes(b).JoinNode(ctx, clone)
	var te *torpor.Error
	if !errors.As(err, &te) || te.Code != torpor.EConflict || te.Reason != torpor.ReasonNodeInUse || !strings.Contains(te.Message, "node-a") {
		t.Fatalf("a join of an up node from another instance: %v, want a conflict with reason %q naming the node", err, torpor.ReasonNodeInUse)
	}
	checkSame(t, "the node after the refused join", h.listNodes()["node-a"], before)

	old := fleetNode("node-a")
	old.Instance = ""
	if epoch := h.join(h.another(), old); epoch != 1 {
		t.Errorf("a join without an instance: epoch %d, want 1", epoch)
	}
	if got := h.listNodes()["node-a"].Instance; got != mine.Instance {
		t.Errorf("a join without an instance left the instance %q, want %q", got, mine.Instance)
	}
	if epoch := h.join(h.s, mine); epoch != 1 {
		t.Errorf("a rejoin from the same instance: epoch %d, want 1", epoch)
	}
	if _, err := h.nodes(b).JoinNode(ctx, clone); !torpor.IsCode(err, torpor.EConflict) {
		t.Errorf("a join from another instance after a join without one: %v, want a conflict", err)
	}

	h.declareDown(h.s, 0)
	epoch := h.join(b, clone)
	if epoch != 2 {
		t.Fatalf("the other instance's join of the down node: epoch %d, want 2", epoch)
	}
	if n := h.listNodes()["node-a"]; n.Instance != clone.Instance || n.Address != clone.Address || n.State != torpor.NodeUp {
		t.Errorf("after the other instance joined, the node is %s at %q from instance %q", n.State, n.Address, n.Instance)
	}
	for _, e := range []int64{1, epoch} {
		_, err := ns.Heartbeat(ctx, "node-a", e, torpor.Resources{}, 0)
		wantFenced(t, err, fmt.Sprintf("the first instance's heartbeat at epoch %d", e))
	}
	if _, err := ns.JoinNode(ctx, mine); !torpor.IsCode(err, torpor.EConflict) {
		t.Errorf("the first instance's join once the other runs the node: %v, want a conflict", err)
	}
	if st, err := h.nodes(b).Heartbeat(ctx, "node-a", epoch, torpor.Resources{}, 0); err != nil || st != torpor.NodeUp {
		t.Errorf("the other instance's heartbeat = %s, %v; want up", st, err)
	}
}

// A heartbeat moves HeartbeatAt on (JoinedAt stays) and stores what the
// node uses; it returns the node's state.
func testHeartbeat(t *testing.T, h *harness) {
	epoch := h.join(h.s, fleetNode("node-a"))
	joined := h.listNodes()["node-a"]
	time.Sleep(2 * time.Millisecond)
	used := torpor.Resources{VCPUs: 2.5, MemoryMiB: 3072, Pids: 77, DiskMiB: 4096}
	st, err := h.nodes(h.s).Heartbeat(t.Context(), "node-a", epoch, used, 24576)
	if err != nil || st != torpor.NodeUp {
		t.Fatalf("Heartbeat = %q, %v; want up", st, err)
	}
	got := h.listNodes()["node-a"]
	if !got.HeartbeatAt.After(joined.HeartbeatAt) || !got.JoinedAt.Equal(joined.JoinedAt) {
		t.Errorf("after a heartbeat: joined %s, heartbeat %s; want joined %s and a later heartbeat", got.JoinedAt, got.HeartbeatAt, joined.JoinedAt)
	}
	recent(t, "HeartbeatAt", got.HeartbeatAt)
	checkSame(t, "Used", got.Used, used)
	wantGPUs := fleetNode("node-a").GPUs
	wantGPUs.UsedVRAMMiB = 24576
	checkSame(t, "GPUs", got.GPUs, wantGPUs)

	if _, err := h.nodes(h.s).Heartbeat(t.Context(), "node-x", 1, used, 0); !torpor.IsCode(err, torpor.ENotFound) {
		t.Errorf("Heartbeat of a node that never joined: %v, want not_found", err)
	}
}

// An up node can be set draining and back; heartbeats report it. Only up
// and draining can be set, only on a node that exists and is not down.
func testSetNodeState(t *testing.T, h *harness) {
	ns := h.nodes(h.s)
	ctx := t.Context()
	epoch := h.join(h.s, fleetNode("node-a"))
	for _, st := range []torpor.NodeState{torpor.NodeDraining, torpor.NodeDraining, torpor.NodeUp, torpor.NodeUp, torpor.NodeDraining} {
		if err := ns.SetNodeState(ctx, "node-a", st); err != nil {
			t.Fatalf("SetNodeState(%s): %v", st, err)
		}
		if got := h.listNodes()["node-a"].State; got != st {
			t.Fatalf("state after SetNodeState(%s) = %s", st, got)
		}
		if got, err := ns.Heartbeat(ctx, "node-a", epoch, torpor.Resources{}, 0); err != nil || got != st {
			t.Fatalf("Heartbeat after SetNodeState(%s) = %s, %v", st, got, err)
		}
	}
	for _, st := range []torpor.NodeState{torpor.NodeDown, "sideways", ""} {
		if err := ns.SetNodeState(ctx, "node-a", st); !torpor.IsCode(err, torpor.EInvalid) {
			t.Errorf("SetNodeState(%q): %v, want invalid_argument", st, err)
		}
	}
	if err := ns.SetNodeState(ctx, "node-x", torpor.NodeDraining); !torpor.IsCode(err, torpor.ENotFound) {
		t.Errorf("SetNodeState of an unknown node: %v, want not_found", err)
	}
	h.declareDown(h.s, 0)
	if err := ns.SetNodeState(ctx, "node-a", torpor.NodeUp); !torpor.IsCode(err, torpor.EConflict) {
		t.Errorf("SetNodeState of a down node: %v, want a conflict", err)
	}
	if got := h.listNodes()["node-a"].State; got != torpor.NodeDown {
		t.Errorf("a refused SetNodeState left the node %s, want down", got)
	}
}

// DeclareDown marks down the up and draining nodes whose last heartbeat is
// older than the timeout, each with the next epoch, and returns them as
// they were; a node that beat since is left alone, and one already down
// is not taken twice.
func testDeclareDownStale(t *testing.T, h *harness) {
	ns := h.nodes(h.s)
	ctx := t.Context()
	if down := h.declareDown(h.s, 0); len(down) != 0 {
		t.Fatalf("DeclareDown with no nodes returned %q", names(down))
	}
	// The gap between the two nodes' heartbeats grows until the machine
	// is quick enough to call DeclareDown within half of it.
	for try, gap := 1, 100*time.Millisecond; ; try, gap = try+1, gap*2 {
		stale, fresh := fmt.Sprintf("stale-%d", try), fmt.Sprintf("fresh-%d", try)
		staleEpoch := h.join(h.s, fleetNode(stale))
		if err := ns.SetNodeState(ctx, stale, torpor.NodeDraining); err != nil {
			t.Fatal(err)
		}
		used := torpor.Resources{VCPUs: 1, MemoryMiB: 512}
		if _, err := ns.Heartbeat(ctx, stale, staleEpoch, used, 0); err != nil {
			t.Fatal(err)
		}
		before := h.listNodes()[stale]
		time.Sleep(gap)
		start := time.Now()
		h.join(h.s, fleetNode(fresh))
		down := h.declareDown(h.s, gap/2)
		if time.Since(start) >= gap/2 {
			if gap > 5*time.Second {
				t.Fatalf("DeclareDown took %s after a join", time.Since(start))
			}
			continue
		}
		if !slices.Contains(names(down), stale) || slices.Contains(names(down), fresh) {
			t.Fatalf("DeclareDown(%s) returned %q; want %s (last beat %s ago) and not %s (just joined)", gap/2, names(down), stale, gap, fresh)
		}
		if !slices.IsSorted(names(down)) {
			t.Errorf("DeclareDown returned %q, want them by name", names(down))
		}
		i := slices.Index(names(down), stale)
		got := down[i]
		before.Sandboxes = got.Sandboxes
		checkSame(t, "the node DeclareDown returned", got, before)
		after := h.listNodes()
		if n := after[stale]; n.State != torpor.NodeDown || n.Epoch != staleEpoch+1 || !n.HeartbeatAt.Equal(before.HeartbeatAt) {
			t.Errorf("a node declared down is %s at epoch %d (heartbeat %s); want down at %d with its last heartbeat %s",
				n.State, n.Epoch, n.HeartbeatAt, staleEpoch+1, before.HeartbeatAt)
		}
		if n := after[fresh]; n.State != torpor.NodeUp || n.Epoch != 1 {
			t.Errorf("the fresh node is %s at epoch %d; want up at 1", n.State, n.Epoch)
		}
		// Already down: not again, and the epoch does not move on.
		for _, n := range h.declareDown(h.s, 0) {
			if n.Name == stale {
				t.Errorf("DeclareDown took %s, already down, a second time", stale)
			}
		}
		if n := h.listNodes()[stale]; n.Epoch != staleEpoch+1 {
			t.Errorf("a second DeclareDown moved a down node's epoch to %d", n.Epoch)
		}
		return
	}
}

// A node declared down is fenced: its heartbeats, at the old epoch or the
// new, are refused until it joins again, which brings it back up at the
// epoch DeclareDown gave it; the old epoch stays fenced.
func testDownFenced(t *testing.T, h *harness) {
	ns := h.nodes(h.s)
	ctx := t.Context()
	old := h.join(h.s, fleetNode("node-a"))
	if down := h.declareDown(h.s, 0); !slices.Equal(names(down), []string{"node-a"}) {
		t.Fatalf("DeclareDown(0) = %q, want node-a", names(down))
	}
	for _, e := range []int64{old, old + 1} {
		_, err := ns.Heartbeat(ctx, "node-a", e, torpor.Resources{}, 0)
		wantFenced(t, err, fmt.Sprintf("Heartbeat of a down node at epoch %d", e))
	}
	if n := h.listNodes()["node-a"]; n.State != torpor.NodeDown {
		t.Errorf("a refused heartbeat left the node %s", n.State)
	}
	epoch := h.join(h.s, fleetNode("node-a"))
	if epoch != old+1 {
		t.Fatalf("the epoch of a rejoin after down = %d, want %d", epoch, old+1)
	}
	if n := h.listNodes()["node-a"]; n.State != torpor.NodeUp || n.Epoch != epoch {
		t.Errorf("after the rejoin the node is %s at %d, want up at %d", n.State, n.Epoch, epoch)
	}
	if st, err := ns.Heartbeat(ctx, "node-a", epoch, torpor.Resources{}, 0); err != nil || st != torpor.NodeUp {
		t.Errorf("Heartbeat at the new epoch = %s, %v; want up", st, err)
	}
	_, err := ns.Heartbeat(ctx, "node-a", old, torpor.Resources{}, 0)
	wantFenced(t, err, "Heartbeat at the old epoch after the rejoin")
}

// Once a handle's node is declared down, every sandbox write through that
// handle is refused as fenced and changes nothing: no record, version,
// event, usage row or sign of life. A rejoin lets it write again.
func testFencedWrites(t *testing.T, h *harness) {
	ctx := t.Context()
	h.join(h.s, fleetNode("node-a"))
	sb := newSandbox("sb_1", "acme", torpor.StateRunning, at(0))
	sb.Node, sb.NodeEpoch = "node-a", 1
	h.create(sb, event(sb, torpor.EventCreated, at(0), nil))
	h.declareDown(h.s, 0)
	stored := h.get(sb.ID)
	evs := h.events(torpor.EventFilter{})

	paused := stored.Clone()
	paused.State = torpor.StatePaused
	wantFenced(t, h.s.UpdateSandbox(ctx, paused, event(sb, torpor.EventPaused, at(time.Second), nil)), "UpdateSandbox")
	wantFenced(t, h.s.UpdateSandboxUsage(ctx, paused, []torpor.UsageRecord{row(sb, torpor.UsageRunning, 0, time.Second)}), "UpdateSandboxUsage")
	other := newSandbox("sb_2", "acme", torpor.StateRunning, at(time.Second))
	wantFenced(t, h.s.CreateSandbox(ctx, other, event(other, torpor.EventCreated, at(0), nil)), "CreateSandbox")
	wantFenced(t, h.s.MarkSeen(ctx, at(time.Hour), sb.ID), "MarkSeen")

	checkSandbox(t, "the sandbox after fenced writes", h.get(sb.ID), stored)
	if _, err := h.s.GetSandbox(ctx, other.ID); !torpor.IsCode(err, torpor.ENotFound) {
		t.Errorf("GetSandbox of a fenced create: %v, want not_found", err)
	}
	if got := h.events(torpor.EventFilter{}); len(got) != len(evs) {
		t.Errorf("%d events after fenced writes, want the %d from before", len(got), len(evs))
	}
	if rows := h.usage(torpor.UsageFilter{}); len(rows) != 0 {
		t.Errorf("a fenced write stored %d usage rows", len(rows))
	}

	h.join(h.s, fleetNode("node-a"))
	paused.NodeEpoch = 2
	h.update(paused)
	h.create(other)
	if err := h.s.MarkSeen(ctx, at(time.Hour), sb.ID); err != nil {
		t.Fatalf("MarkSeen after the rejoin: %v", err)
	}
	if got := h.get(sb.ID); got.State != torpor.StatePaused || got.NodeEpoch != 2 || !got.Usage.SeenAt.Equal(at(time.Hour)) {
		t.Errorf("after the rejoin the sandbox is %s at node epoch %d, seen %s", got.State, got.NodeEpoch, got.Usage.SeenAt)
	}
}

// Fencing belongs to the handle that joined: a second daemon on the same
// data that never joined writes as it likes, and one that joined as
// another node is fenced by that node alone.
func testFencingPerHandle(t *testing.T, h *harness) {
	ctx := t.Context()
	b := h.another()
	h.join(h.s, fleetNode("node-a"))
	sb := newSandbox("sb_1", "acme", torpor.StateRunning, at(0))
	sb.Node = "node-a"
	h.create(sb)

	// b, which never joined, declares node-a down and takes its sandbox.
	if down := h.declareDown(b, 0); !slices.Equal(names(down), []string{"node-a"}) {
		t.Fatalf("DeclareDown = %q, want node-a", names(down))
	}
	mine := h.get(sb.ID)
	wantFenced(t, h.s.UpdateSandbox(ctx, mine.Clone()), "a's update after node-a went down")
	mine.Node = "node-b"
	if err := b.UpdateSandbox(ctx, mine); err != nil {
		t.Fatalf("an unjoined handle's update: %v", err)
	}
	h.join(b, fleetNode("node-b"))
	mine.State = torpor.StatePaused
	if err := b.UpdateSandbox(ctx, mine); err != nil {
		t.Fatalf("node-b's update: %v", err)
	}
	wantFenced(t, h.s.CreateSandbox(ctx, newSandbox("sb_2", "acme", torpor.StateRunning, at(0))), "a's create")
	if got := h.get(sb.ID); got.Node != "node-b" || got.State != torpor.StatePaused {
		t.Errorf("the sandbox is %s on %q, want paused on node-b", got.State, got.Node)
	}
}

// ListNodes counts each node's sandboxes by state, leaving out terminated
// ones and those of no node; the counts follow a sandbox that moves.
func testNodeCounts(t *testing.T, h *harness) {
	for _, n := range []string{"node-a", "node-b", "node-c"} {
		h.join(h.s, fleetNode(n))
	}
	var sbs []*torpor.Sandbox
	for i, c := range []struct {
		node  string
		state torpor.State
	}{
		{"node-a", torpor.StateRunning}, {"node-a", torpor.StateRunning}, {"node-a", torpor.StatePaused},
		{"node-a", torpor.StateTerminated}, {"node-b", torpor.StateHibernated}, {"", torpor.StateHibernated},
	} {
		sb := newSandbox(fmt.Sprintf("sb_%d", i), "acme", c.state, at(time.Duration(i)*time.Second))
		sb.Node = c.node
		h.create(sb)
		sbs = append(sbs, sb)
	}
	want := map[string]map[torpor.State]int{
		"node-a": {torpor.StateRunning: 2, torpor.StatePaused: 1},
		"node-b": {torpor.StateHibernated: 1},
		"node-c": {},
	}
	check := func(what string) {
		t.Helper()
		got := h.listNodes()
		for name, counts := range want {
			if !maps.Equal(got[name].Sandboxes, counts) || got[name].Sandboxes == nil {
				t.Errorf("%s: %s has sandboxes %v, want %v", what, name, got[name].Sandboxes, counts)
			}
		}
	}
	check("ListNodes")
	// node-a's paused sandbox moves to node-c; the one of no node to node-b.
	sbs[2].Node = "node-c"
	h.update(sbs[2])
	sbs[5].Node = "node-b"
	h.update(sbs[5])
	want["node-a"] = map[torpor.State]int{torpor.StateRunning: 2}
	want["node-b"][torpor.StateHibernated] = 2
	want["node-c"] = map[torpor.State]int{torpor.StatePaused: 1}
	check("ListNodes after two moves")
}

// SandboxFilter.Node keeps a node's sandboxes, combines with the other
// filters and follows updates; "" matches every node's and none's.
func testListNode(t *testing.T, h *harness) {
	for i, node := range []string{"node-a", "node-b", "", "node-a"} {
		sb := newSandbox(fmt.Sprintf("sb_%d", i), "acme", torpor.StateRunning, at(time.Duration(i)*time.Second))
		sb.Node = node
		if i == 3 {
			sb.State = torpor.StatePaused
		}
		h.create(sb)
	}
	wantIDs(t, "Node node-a", h.list(torpor.SandboxFilter{Node: "node-a"}), "sb_0", "sb_3")
	wantIDs(t, "Node node-a, running", h.list(torpor.SandboxFilter{Node: "node-a", States: []torpor.State{torpor.StateRunning}}), "sb_0")
	wantIDs(t, "Node node-b, tenant globex", h.list(torpor.SandboxFilter{Node: "node-b", Tenant: "globex"}))
	wantIDs(t, "no Node", h.list(torpor.SandboxFilter{}), "sb_0", "sb_1", "sb_2", "sb_3")
	wantIDs(t, "Node node-z", h.list(torpor.SandboxFilter{Node: "node-z"}))

	sb := h.get("sb_0")
	if sb.Node != "node-a" {
		t.Fatalf("GetSandbox: node %q, want node-a", sb.Node)
	}
	if h.get("sb_2").Durability != "" {
		t.Errorf("a sandbox stored without durability reads back as %q, want \"\"", h.get("sb_2").Durability)
	}
	sb.Node = ""
	h.update(sb)
	wantIDs(t, "Node node-a after sb_0 left it", h.list(torpor.SandboxFilter{Node: "node-a"}), "sb_3")
	s := h.restart()
	if got, err := s.ListSandboxes(t.Context(), torpor.SandboxFilter{Node: "node-b"}); err != nil || len(got) != 1 || got[0].Node != "node-b" {
		t.Errorf("Node node-b after a restart: %v, %v", ids(got), err)
	}
}

// Exclusive runs fn while no other caller holds the lock of that name:
// a second caller meanwhile gets false and does not run; another name is
// free; the lock is free again once fn returns, its error or not.
func testExclusive(t *testing.T, h *harness) {
	ns := h.nodes(h.s)
	ctx := t.Context()
	boom := errors.New("boom")
	ran := false
	ok, err := ns.Exclusive(ctx, "reaper", func(ctx context.Context) error {
		ran = true
		// Another goroutine, as another daemon's caller would be.
		var wg sync.WaitGroup
		wg.Go(func() {
			again, err := ns.Exclusive(ctx, "reaper", func(context.Context) error {
				t.Error("a second holder of the lock ran")
				return nil
			})
			if again || err != nil {
				t.Errorf("Exclusive while held = %v, %v; want false", again, err)
			}
			other, err := ns.Exclusive(ctx, "placer", func(context.Context) error { return nil })
			if !other || err != nil {
				t.Errorf("Exclusive of another name = %v, %v; want true", other, err)
			}
		})
		wg.Wait()
		return boom
	})
	if !ok || !ran || !errors.Is(err, boom) {
		t.Fatalf("Exclusive = %v, %v (ran %v); want true and fn's error", ok, err, ran)
	}
	ok, err = ns.Exclusive(ctx, "reaper", func(context.Context) error { return nil })
	if !ok || err != nil {
		t.Errorf("Exclusive after the holder returned = %v, %v; want true", ok, err)
	}
}

// Writers through a joined handle race a DeclareDown (on a connection of
// its own where the store has several): a write either commits, while the
// node is up, or is fenced and changes nothing. Once one is fenced every
// later one is, and so is every write begun after DeclareDown returned.
// (The SQLite store runs one write at a time, so its race is short.)
func testDeclareDownRace(t *testing.T, h *harness) {
	ctx := t.Context()
	h.join(h.s, fleetNode("node-a"))
	const writers = 4
	type result struct {
		ok, fenced    int
		afterFence    bool // a write succeeded after one was fenced
		lateSuccesses int  // writes begun after DeclareDown returned that succeeded
	}
	results := make([]result, writers)
	var downAt time.Time
	var downMu sync.Mutex
	started := make(chan struct{}, writers)
	var wg sync.WaitGroup
	for w := range writers {
		sb := newSandbox(fmt.Sprintf("sb_w%d", w), "acme", torpor.StateRunning, at(0))
		sb.Node = "node-a"
		h.create(sb)
		wg.Go(func() {
			r := &results[w]
			signalled := false
			signal := func() {
				if !signalled {
					signalled = true
					started <- struct{}{}
				}
			}
			defer signal()
			for i := 0; r.fenced < 3; i++ {
				if i == 100000 {
					t.Errorf("writer %d: 100000 writes and none fenced", w)
					return
				}
				if i == 5 {
					signal()
				}
				begun := time.Now()
				sb.Boots = i + 1
				err := h.s.UpdateSandbox(ctx, sb, event(sb, torpor.EventStateChange, at(0), nil))
				downMu.Lock()
				late := !downAt.IsZero() && begun.After(downAt)
				downMu.Unlock()
				switch {
				case err == nil:
					r.ok++
					r.afterFence = r.afterFence || r.fenced > 0
					if late {
						r.lateSuccesses++
					}
				case torpor.ErrorCodeOf(err) == torpor.EUnavailable:
					wantFenced(t, err, "a racing write")
					r.fenced++
				default:
					t.Errorf("a racing write: %v", err)
					return
				}
			}
		})
	}
	for range writers {
		<-started
	}
	down := h.declareDown(h.s, 0)
	downMu.Lock()
	downAt = time.Now()
	downMu.Unlock()
	wg.Wait()
	if !slices.Equal(names(down), []string{"node-a"}) {
		t.Fatalf("DeclareDown = %q, want node-a", names(down))
	}
	total := 0
	for w, r := range results {
		if r.afterFence || r.lateSuccesses > 0 {
			t.Errorf("writer %d: a write committed after the node was down (after a fenced one: %v; begun after DeclareDown: %d)",
				w, r.afterFence, r.lateSuccesses)
		}
		got := h.get(fmt.Sprintf("sb_w%d", w))
		if got.Version != int64(1+r.ok) || got.Boots != r.ok {
			t.Errorf("writer %d: %d writes succeeded, the record is at version %d with boots %d", w, r.ok, got.Version, got.Boots)
		}
		total += r.ok
	}
	if evs := h.events(torpor.EventFilter{}); len(evs) != total {
		t.Errorf("%d events stored, %d writes succeeded", len(evs), total)
	}
}
