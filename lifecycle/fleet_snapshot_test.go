package lifecycle_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/lifecycle"
	"github.com/torpor-dev/torpor/runtime/fake"
)

// snapshotHost is a fake host whose snapshots restore on hosts of the
// same name only.
func snapshotHost(t *testing.T, name string) *fake.Host {
	h := fake.NewHost()
	h.FilesDir = t.TempDir()
	h.SnapshotHost = name
	return h
}

// lastEvent is the type of sandbox id's newest event.
func lastEvent(t *testing.T, n *fleetNode, id string) string {
	t.Helper()
	evs, err := n.eng.Events(ctx, "acme", torpor.EventFilter{SandboxID: id})
	if err != nil || len(evs) == 0 {
		t.Fatalf("events of %s: %v (%d)", id, err, len(evs))
	}
	return evs[len(evs)-1].Type
}

// manifests lists the manifests in the fleet's object store.
func (f *fleetEnv) manifests(t *testing.T) []string {
	t.Helper()
	var found []string
	err := filepath.WalkDir(filepath.Join(f.keyDir, "objects"), func(p string, d os.DirEntry, err error) error {
		if errors.Is(err, fs.ErrNotExist) {
			return nil // an uploader removed it as the walk came by
		}
		if err == nil && strings.HasSuffix(p, "manifest.json") {
			found = append(found, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return found
}

// TestFleetSnapshotResumesOnItsHost: a snapshot-paused sandbox's state
// (disk and memory) is uploaded and the sandbox is durability remote;
// when its node goes down it is released, still paused, never lost. A
// node of another host neither takes it nor has one to send it to (503
// with Retry-After); once a node of its host is up, the request goes
// there, which resumes it from the snapshot.
func TestFleetSnapshotResumesOnItsHost(t *testing.T) {
	f := newFleetEnv(t)
	a := f.start("a", lifecycle.Capacity{}, snapshotHost(t, "h1"))
	b := f.start("b", lifecycle.Capacity{}, snapshotHost(t, "h2"))
	sb, err := a.eng.Create(ctx, "acme", torpor.CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	must(a.eng.Pause(ctx, "acme", sb.ID, torpor.PauseSnapshot))
	f.eventually("the snapshot's upload", func() bool { return a.get(t, sb.ID).Durability == torpor.DurabilityRemote })
	if got := a.get(t, sb.ID); got.State != torpor.StatePaused || got.PauseMode != torpor.PauseSnapshot {
		t.Fatalf("the uploaded sandbox is %s (%s), want paused by snapshot", got.State, got.PauseMode)
	}
	nodes, err := b.eng.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		if want := "fake: h" + map[string]string{"a": "1", "b": "2"}[n.Name]; n.Host != want {
			t.Errorf("node %s says its host is %q, want %q", n.Name, n.Host, want)
		}
	}

	a.stop()
	f.eventually("a's paused sandbox released", func() bool { return b.get(t, sb.ID).Node == "" })
	if got := b.get(t, sb.ID); got.State != torpor.StatePaused || got.Durability != torpor.DurabilityRemote {
		t.Fatalf("the released sandbox is %s (%s), want paused and remote", got.State, got.Durability)
	}
	// b is of another host, and no node of a's is up.
	r, err := b.eng.Route(ctx, "acme", sb.ID)
	var te *torpor.Error
	if !errors.As(err, &te) || te.Code != torpor.EUnavailable || te.RetryAfter <= 0 {
		t.Fatalf("b routes a snapshot of another host to %+v (%v), want unavailable with Retry-After", r, err)
	}
	if _, err := b.eng.Start(ctx, "acme", sb.ID); !torpor.IsCode(err, torpor.EUnavailable) {
		t.Fatalf("b, of another host, resumes the snapshot: %v", err)
	}
	if b.host.HasSnapshot(sb.ID) || b.get(t, sb.ID).Node != "" {
		t.Fatal("b took a snapshot of another host")
	}

	cHost := snapshotHost(t, "h1")
	c := f.start("c", lifecycle.Capacity{}, cHost)
	f.eventually("b routing the sandbox to c", func() bool {
		r, err := b.eng.Route(ctx, "acme", sb.ID)
		if err == nil && (r.Local || r.Node.Name != "c") {
			t.Fatalf("b routes the sandbox to %+v, want node c", r)
		}
		return err == nil
	})
	// c takes it when the request reaches it, and keeps it paused across
	// a restart before its resume (its state is still only remote).
	if r, err := c.eng.Route(ctx, "acme", sb.ID); err != nil || !r.Local {
		t.Fatalf("c routes the sandbox to %+v (%v), want here", r, err)
	}
	if got := c.get(t, sb.ID); got.Node != "c" || got.State != torpor.StatePaused {
		t.Fatalf("the taken sandbox is %s on %q, want paused on c", got.State, got.Node)
	}
	c.stop()
	c = f.start("c", lifecycle.Capacity{}, cHost)
	if got := c.get(t, sb.ID); got.State != torpor.StatePaused || got.Durability != torpor.DurabilityRemote {
		t.Fatalf("after c's restart the sandbox is %s (%s), want paused and remote", got.State, got.Durability)
	}
	moved, err := c.eng.Start(ctx, "acme", sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if moved.State != torpor.StateRunning || moved.Node != "c" || moved.Durability != torpor.DurabilityNode {
		t.Fatalf("the moved sandbox is %s on %q (%s), want running on c (node)", moved.State, moved.Node, moved.Durability)
	}
	if ev := lastEvent(t, c, sb.ID); ev != torpor.EventResumed {
		t.Fatalf("the moved sandbox's last event is %s, want %s (a resume, not a boot)", ev, torpor.EventResumed)
	}
	if c.host.State(sb.ID) != torpor.InstanceRunning || c.host.HasSnapshot(sb.ID) {
		t.Fatalf("c's instance is %s (snapshot left: %v), want the restored one running", c.host.State(sb.ID), c.host.HasSnapshot(sb.ID))
	}
}

// manifestKind reads the kind of manifest file p.
func manifestKind(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return "" // replaced since it was listed: the caller looks again
	}
	if err != nil {
		t.Fatal(err)
	}
	var m struct {
		Kind string `json:"kind"`
	}
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m.Kind
}

// TestFleetSnapshotUploadFollowsTheSandbox: a resume makes a snapshot's
// upload old (durability node), the next snapshot pause uploads again
// and replaces it, and a hibernation uploads the disk in its place: the
// store keeps one manifest throughout.
func TestFleetSnapshotUploadFollowsTheSandbox(t *testing.T) {
	f := newFleetEnv(t)
	a := f.start("a", lifecycle.Capacity{}, snapshotHost(t, "h1"))
	sb, err := a.eng.Create(ctx, "acme", torpor.CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	must(a.eng.Pause(ctx, "acme", sb.ID, torpor.PauseSnapshot))
	f.eventually("the snapshot's upload", func() bool { return a.get(t, sb.ID).Durability == torpor.DurabilityRemote })
	if got, err := a.eng.Start(ctx, "acme", sb.ID); err != nil || got.Durability != torpor.DurabilityNode {
		t.Fatalf("a resumed uploaded sandbox is %v (%v), want durability node", got, err)
	}
	must(a.eng.Pause(ctx, "acme", sb.ID, torpor.PauseSnapshot))
	f.eventually("the second snapshot's upload", func() bool { return a.get(t, sb.ID).Durability == torpor.DurabilityRemote })
	if m := f.manifests(t); len(m) != 1 {
		t.Fatalf("the object store has manifests %v, want the newest only", m)
	}
	must(a.eng.Hibernate(ctx, "acme", sb.ID))
	f.eventually("the disk's upload", func() bool {
		m := f.manifests(t)
		return a.get(t, sb.ID).Durability == torpor.DurabilityRemote && len(m) == 1 &&
			manifestKind(t, m[0]) == "disk"
	})
	// Frozen sandboxes stay where they are.
	fr, err := a.eng.Create(ctx, "acme", torpor.CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	must(a.eng.Pause(ctx, "acme", fr.ID, torpor.PauseFreeze))
	if got := a.get(t, fr.ID); got.Durability != torpor.DurabilityNode {
		t.Fatalf("a frozen sandbox is %s", got.Durability)
	}
}

// TestFleetDrainMovesSnapshots: a draining node uploads and releases a
// snapshot-paused sandbox, still paused, when another node of its host is
// up (which resumes it); with none, the sandbox is hibernated, as any.
func TestFleetDrainMovesSnapshots(t *testing.T) {
	f := newFleetEnv(t)
	nodes := map[string]*fleetNode{}
	startOn := func(ctx context.Context, n torpor.Node, tenant, id string) error {
		_, err := nodes[n.Name].eng.Start(ctx, tenant, id)
		return err
	}
	a := f.startWith("a", lifecycle.Capacity{}, snapshotHost(t, "h1"), startOn)
	b := f.startWith("b", lifecycle.Capacity{}, snapshotHost(t, "h1"), startOn)
	nodes["a"], nodes["b"] = a, b
	sb, err := a.eng.Create(ctx, "acme", torpor.CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	must(a.eng.Pause(ctx, "acme", sb.ID, torpor.PauseSnapshot))
	if _, err := b.eng.DrainNode(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	f.eventually("a drained", func() bool { return b.get(t, sb.ID).Node == "" })
	if got := b.get(t, sb.ID); got.State != torpor.StatePaused || got.Durability != torpor.DurabilityRemote {
		t.Fatalf("the drained sandbox is %s (%s), want paused and remote", got.State, got.Durability)
	}
	if a.host.HasSnapshot(sb.ID) || a.host.HasDisk(sb.ID) {
		t.Fatal("the drained node kept a copy of what it moved")
	}
	moved, err := b.eng.Start(ctx, "acme", sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if moved.Node != "b" || moved.State != torpor.StateRunning || lastEvent(t, b, sb.ID) != torpor.EventResumed {
		t.Fatalf("the moved sandbox is %s on %q, want resumed on b", moved.State, moved.Node)
	}

	// b's host has no other node: its snapshot cannot move, so it is
	// hibernated and its disk moves.
	if _, err := b.eng.UndrainNode(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	must(b.eng.Pause(ctx, "acme", sb.ID, torpor.PauseSnapshot))
	c := f.startWith("c", lifecycle.Capacity{}, snapshotHost(t, "h2"), startOn)
	nodes["c"] = c
	a.stop()
	f.eventually("node a declared down", func() bool { return nodeState(t, b, "a") == torpor.NodeDown })
	if _, err := c.eng.DrainNode(ctx, "b"); err != nil {
		t.Fatal(err)
	}
	f.eventually("b drained", func() bool { return c.get(t, sb.ID).Node == "" })
	if got := c.get(t, sb.ID); got.State != torpor.StateHibernated || got.Durability != torpor.DurabilityRemote {
		t.Fatalf("a snapshot drained where no node shares its host is %s (%s), want hibernated and remote", got.State, got.Durability)
	}
}

// slowObjects is an object store whose Put of a sandbox's snapshot or
// disk takes at least wait.
type slowObjects struct {
	torpor.ObjectStore
	wait time.Duration
}

func (s slowObjects) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	if !strings.HasSuffix(key, "manifest.json") {
		time.Sleep(s.wait)
	}
	return s.ObjectStore.Put(ctx, key, r, size)
}

// TestFleetUploadOutlastsSettlement: an upload that takes longer than
// the settlement of the usage ledger (which writes the sandbox's record)
// still lands, for a snapshot and for a disk.
func TestFleetUploadOutlastsSettlement(t *testing.T) {
	f := newFleetEnv(t)
	f.settle = time.Second
	f.objects = slowObjects{ObjectStore: f.objects, wait: 2500 * time.Millisecond}
	a := f.start("a", lifecycle.Capacity{}, snapshotHost(t, "h1"))
	paused, err := a.eng.Create(ctx, "acme", torpor.CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	hib, err := a.eng.Create(ctx, "acme", torpor.CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	must(a.eng.Pause(ctx, "acme", paused.ID, torpor.PauseSnapshot))
	must(a.eng.Hibernate(ctx, "acme", hib.ID))
	f.eventually("the slow uploads", func() bool {
		return a.get(t, paused.ID).Durability == torpor.DurabilityRemote && a.get(t, hib.ID).Durability == torpor.DurabilityRemote
	})
}
