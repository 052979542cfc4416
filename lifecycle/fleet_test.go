package lifecycle_test

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/gpu"
	"github.com/torpor-dev/torpor/gpu/sim"
	"github.com/torpor-dev/torpor/lifecycle"
	"github.com/torpor-dev/torpor/objstore"
	"github.com/torpor-dev/torpor/runtime/fake"
	"github.com/torpor-dev/torpor/store/postgres"
	"github.com/torpor-dev/torpor/store/postgres/pgtest"
)

// TestMain stops the PostgreSQL server the fleet tests start.
func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// fleetEnv is a fleet of engines in one test: nodes with a fake host
// each, on one PostgreSQL database and one object store directory.
type fleetEnv struct {
	t       *testing.T
	url     string
	keyDir  string
	objects torpor.ObjectStore
	down    time.Duration
	// labels are the nodes' labels, by name (none when absent).
	labels map[string]map[string]string
	// settle is the nodes' SettleEvery (0: the default).
	settle time.Duration
	// gpus are the nodes' simulated GPU hosts, by name (none when absent).
	gpus map[string]*sim.Host
}

type fleetNode struct {
	name string
	st   *postgres.Store
	host *fake.Host
	eng  *lifecycle.Engine
	cap  lifecycle.Capacity
}

func newFleetEnv(t *testing.T) *fleetEnv {
	t.Helper()
	url := pgtest.NewDatabase(t)
	dir := t.TempDir()
	obj := filepath.Join(dir, "objects")
	if err := os.Mkdir(obj, 0o700); err != nil {
		t.Fatal(err)
	}
	objects, err := objstore.Open(ctx, "file://"+obj)
	if err != nil {
		t.Fatal(err)
	}
	return &fleetEnv{t: t, url: url, keyDir: dir, objects: objects, down: 2 * time.Second}
}

// start runs node name (on a host of its own, or host when given).
func (f *fleetEnv) start(name string, cp lifecycle.Capacity, host *fake.Host) *fleetNode {
	return f.startWith(name, cp, host, nil)
}

func (f *fleetEnv) startWith(name string, cp lifecycle.Capacity, host *fake.Host, startOn func(context.Context, torpor.Node, string, string) error) *fleetNode {
	f.t.Helper()
	st, err := postgres.Open(ctx, postgres.Options{URL: f.url, KeyDir: f.keyDir, Node: name})
	if err != nil {
		f.t.Fatal(err)
	}
	if err := st.PutTemplate(ctx, torpor.Template{Name: "base", RootFS: "/nonexistent", CreatedAt: time.Now()}); err != nil {
		f.t.Fatal(err)
	}
	if host == nil {
		host = fake.NewHost()
		host.FilesDir = f.t.TempDir()
	}
	cfg := lifecycle.Config{
		Store:    st,
		Runtimes: []torpor.Runtime{fake.New(host)},
		Capacity: cp,
		Logger:   fleetLog(name),
		Fleet: &lifecycle.FleetConfig{Nodes: st, Self: torpor.Node{Name: name, Address: name + ":7070", Labels: f.labels[name]},
			DownAfter: f.down, Objects: f.objects, StartOn: startOn},
		SettleEvery: f.settle,
	}
	if gh := f.gpus[name]; gh != nil {
		mgr, err := gpu.NewManager(gpu.Options{Host: gh, Worker: gh, Clock: torpor.SystemClock{}, Store: st, Flagger: st})
		if err != nil {
			f.t.Fatal(err)
		}
		cfg.GPU = mgr
		cfg.GPUAttach = func(ctx context.Context, sb *torpor.Sandbox) (string, int, []int, error) {
			group := "sandbox:" + sb.ID
			return group, gh.StartWorker(group, 0, 300), []int{0}, nil
		}
	}
	eng, err := lifecycle.New(cfg)
	if err != nil {
		f.t.Fatal(err)
	}
	if err := eng.Recover(ctx); err != nil {
		f.t.Fatal(err)
	}
	n := &fleetNode{name: name, st: st, host: host, eng: eng, cap: cp}
	f.t.Cleanup(n.stop)
	return n
}

// stop ends the node's engine and store handle, as a kill would: its
// heartbeats stop, its host keeps what it had.
func (n *fleetNode) stop() {
	if n.eng != nil {
		n.eng.Close()
		n.st.Close()
		n.eng = nil
	}
}

func (f *fleetEnv) eventually(what string, cond func() bool) {
	f.t.Helper()
	deadline := time.Now().Add(5*f.down + 10*time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			f.t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func (n *fleetNode) get(t *testing.T, id string) *torpor.Sandbox {
	t.Helper()
	sb, err := n.eng.Get(ctx, "acme", id)
	if err != nil {
		t.Fatal(err)
	}
	return sb
}

func nodeState(t *testing.T, n *fleetNode, name string) torpor.NodeState {
	t.Helper()
	nodes, err := n.eng.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range nodes {
		if x.Name == name {
			return x.State
		}
	}
	return ""
}

// TestFleetDownNodeLosesInRAMAndReleasesRemote: when a node stops
// heartbeating, another declares it down; its running sandbox is lost,
// billed up to its last heartbeat, and its hibernated one, whose disk was
// uploaded, starts on the other node with its files.
func TestFleetDownNodeLosesInRAMAndReleasesRemote(t *testing.T) {
	f := newFleetEnv(t)
	a := f.start("a", lifecycle.Capacity{}, nil)
	b := f.start("b", lifecycle.Capacity{}, nil)

	running, err := a.eng.Create(ctx, "acme", torpor.CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	kept, err := a.eng.Create(ctx, "acme", torpor.CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	if running.Node != "a" || running.Durability != torpor.DurabilityNode {
		t.Fatalf("a new sandbox is on %q with durability %q, want a and node", running.Node, running.Durability)
	}
	if err := os.MkdirAll(filepath.Join(a.host.FilesDir, kept.ID), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(a.host.FilesDir, kept.ID, "notes.txt"), []byte("kept\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	must(a.eng.Hibernate(ctx, "acme", kept.ID))
	f.eventually("the hibernated disk's upload", func() bool { return a.get(t, kept.ID).Durability == torpor.DurabilityRemote })

	// A request on b for a's sandboxes goes to a while it is up.
	if r, err := b.eng.Route(ctx, "acme", running.ID); err != nil || r.Local || r.Node.Name != "a" {
		t.Fatalf("b routes a's sandbox to %+v (%v), want node a", r, err)
	}
	a.stop()
	f.eventually("node a declared down", func() bool { return nodeState(t, b, "a") == torpor.NodeDown })
	f.eventually("a's running sandbox lost", func() bool { return b.get(t, running.ID).State == torpor.StateFailed })
	lost := b.get(t, running.ID)
	if lost.Failure == nil || lost.Failure.Code != torpor.FailureLost || lost.Node != "" {
		t.Fatalf("a's running sandbox is %+v on %q, want failed with %s on no node", lost.Failure, lost.Node, torpor.FailureLost)
	}
	f.eventually("a's hibernated sandbox released", func() bool { return b.get(t, kept.ID).Node == "" })

	// The next request takes it on b, which starts it on its disk.
	if r, err := b.eng.Route(ctx, "acme", kept.ID); err != nil || !r.Local {
		t.Fatalf("b routes a released sandbox to %+v (%v), want here", r, err)
	}
	moved, err := b.eng.Start(ctx, "acme", kept.ID)
	if err != nil {
		t.Fatal(err)
	}
	if moved.State != torpor.StateRunning || moved.Node != "b" || moved.Durability != torpor.DurabilityNode {
		t.Fatalf("the moved sandbox is %s on %q (%s), want running on b (node)", moved.State, moved.Node, moved.Durability)
	}
	got, err := os.ReadFile(filepath.Join(b.host.FilesDir, kept.ID, "notes.txt"))
	if err != nil || string(got) != "kept\n" {
		t.Fatalf("the moved sandbox's file reads %q (%v)", got, err)
	}

	// The lost one was billed up to a's last heartbeat, once.
	rows, err := b.st.ListUsage(ctx, torpor.UsageFilter{SandboxID: running.ID})
	if err != nil {
		t.Fatal(err)
	}
	var last time.Time
	for _, r := range rows {
		if r.Start.Before(last) {
			t.Fatalf("usage rows overlap: %+v", rows)
		}
		last = r.End
	}
	if last.After(lost.StateSince) {
		t.Fatalf("the lost sandbox is billed to %s, after it was lost at %s", last, lost.StateSince)
	}
	// A lost sandbox can be deleted from any node.
	if _, err := b.eng.Delete(ctx, "acme", running.ID); err != nil {
		t.Fatalf("deleting a lost sandbox: %v", err)
	}
}

// TestFleetReleasedKeepsItsNodeLabels: a hibernated sandbox created with
// node labels, released when its node went down, is sent to a node that
// has them, never taken by one that does not.
func TestFleetReleasedKeepsItsNodeLabels(t *testing.T) {
	f := newFleetEnv(t)
	f.labels = map[string]map[string]string{"a": {"disk": "ssd"}, "c": {"disk": "ssd"}}
	a := f.start("a", lifecycle.Capacity{}, nil)
	b := f.start("b", lifecycle.Capacity{}, nil)
	sb, err := a.eng.Create(ctx, "acme", torpor.CreateRequest{Template: "base", NodeLabels: map[string]string{"disk": "ssd"}})
	if err != nil {
		t.Fatal(err)
	}
	must(a.eng.Hibernate(ctx, "acme", sb.ID))
	f.eventually("the hibernated disk's upload", func() bool { return a.get(t, sb.ID).Durability == torpor.DurabilityRemote })
	a.stop()
	f.eventually("a's hibernated sandbox released", func() bool { return b.get(t, sb.ID).Node == "" })
	if got := b.get(t, sb.ID).NodeLabels; got["disk"] != "ssd" {
		t.Fatalf("the released sandbox's node labels are %v", got)
	}

	// No up node has the labels: b does not take it.
	if r, err := b.eng.Route(ctx, "acme", sb.ID); err == nil {
		t.Fatalf("b, without the labels, routes the sandbox to %+v", r)
	}
	if _, err := b.eng.Start(ctx, "acme", sb.ID); err == nil {
		t.Fatal("b, without the labels, started the sandbox")
	}
	// c has them: b sends the request there, and c takes it.
	c := f.start("c", lifecycle.Capacity{}, nil)
	f.eventually("b routing the sandbox to c", func() bool {
		r, err := b.eng.Route(ctx, "acme", sb.ID)
		if err == nil && (r.Local || r.Node.Name != "c") {
			t.Fatalf("b routes the sandbox to %+v, want node c", r)
		}
		return err == nil
	})
	moved, err := c.eng.Start(ctx, "acme", sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if moved.Node != "c" || moved.State != torpor.StateRunning {
		t.Fatalf("the sandbox is %s on %q, want running on c", moved.State, moved.Node)
	}
}

// TestFleetFencedNodeDestroysItsCopies: a node declared down while it
// still runs (as after a long stop) finds out at its next heartbeat,
// destroys what it holds, and joins again with a new epoch; it acts on
// none of its old sandboxes.
func TestFleetFencedNodeDestroysItsCopies(t *testing.T) {
	f := newFleetEnv(t)
	a := f.start("a", lifecycle.Capacity{}, nil)
	b := f.start("b", lifecycle.Capacity{}, nil)
	sb, err := a.eng.Create(ctx, "acme", torpor.CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	epoch := a.eng.Epoch()
	// Declared down behind its back.
	if _, err := b.st.DeclareDown(ctx, 0); err != nil {
		t.Fatal(err)
	}
	f.eventually("a joined again", func() bool { return a.eng.Epoch() > epoch })
	f.eventually("a's copy destroyed", func() bool { return a.host.State(sb.ID) == torpor.InstanceMissing })
	f.eventually("a's sandbox settled", func() bool {
		got, err := b.eng.Get(ctx, "acme", sb.ID)
		return err == nil && got.State == torpor.StateFailed
	})
	if _, err := a.eng.Exec(ctx, "acme", sb.ID, torpor.ExecRequest{Cmd: []string{"true"}}); err == nil {
		t.Fatal("the fenced node ran a command in a sandbox it lost")
	}
	// It takes new work again.
	if _, err := a.eng.Create(ctx, "acme", torpor.CreateRequest{Template: "base"}); err != nil {
		t.Fatalf("a create on the node that joined again: %v", err)
	}
}

// TestFleetOneClaimWins: two nodes asked at once to start a released
// sandbox: one takes it, the other is told it moved.
func TestFleetOneClaimWins(t *testing.T) {
	f := newFleetEnv(t)
	a := f.start("a", lifecycle.Capacity{}, nil)
	b := f.start("b", lifecycle.Capacity{}, nil)
	c := f.start("c", lifecycle.Capacity{}, nil)
	sb, err := a.eng.Create(ctx, "acme", torpor.CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	must(a.eng.Hibernate(ctx, "acme", sb.ID))
	f.eventually("upload", func() bool { return a.get(t, sb.ID).Durability == torpor.DurabilityRemote })
	a.stop()
	f.eventually("release", func() bool { return b.get(t, sb.ID).Node == "" })

	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, n := range []*fleetNode{b, c} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, errs[i] = n.eng.Start(ctx, "acme", sb.ID)
		}()
	}
	wg.Wait()
	won := 0
	for _, err := range errs {
		var te *torpor.Error
		switch {
		case err == nil:
			won++
		case errors.As(err, &te) && te.Reason == torpor.ReasonMoved:
		default:
			t.Fatalf("a start on a released sandbox: %v", err)
		}
	}
	if won != 1 {
		t.Fatalf("%d nodes started the sandbox, want 1 (%v)", won, errs)
	}
	evs, err := b.eng.Events(ctx, "acme", torpor.EventFilter{SandboxID: sb.ID})
	if err != nil {
		t.Fatal(err)
	}
	claims := 0
	for _, ev := range evs {
		if ev.Type == torpor.EventClaimed {
			claims++
		}
	}
	if claims != 1 {
		t.Fatalf("%d claims, want 1", claims)
	}
}

// TestFleetPlacement: a create goes where there is room and the labels
// match; nowhere is a capacity conflict.
func TestFleetPlacement(t *testing.T) {
	f := newFleetEnv(t)
	a := f.start("a", lifecycle.Capacity{VCPUs: 1, MemoryMiB: 600}, nil)
	b := f.start("b", lifecycle.Capacity{VCPUs: 4, MemoryMiB: 4096}, nil)
	if _, err := a.eng.Create(ctx, "acme", torpor.CreateRequest{Template: "base"}); err != nil {
		t.Fatal(err)
	}
	f.eventually("a's heartbeat shows its use", func() bool {
		nodes, _ := b.eng.Nodes(ctx)
		for _, n := range nodes {
			if n.Name == "a" && n.Used.MemoryMiB > 0 {
				return true
			}
		}
		return false
	})
	r, err := a.eng.PlaceCreate(ctx, torpor.CreateRequest{Template: "base"})
	if err != nil || r.Local || r.Node.Name != "b" {
		t.Fatalf("a full node places a create at %+v (%v), want b", r, err)
	}
	if _, err := a.eng.PlaceCreate(ctx, torpor.CreateRequest{Template: "base", NodeLabels: map[string]string{"gpu": "h100"}}); !torpor.IsCode(err, torpor.EInvalid) {
		t.Fatalf("labels no node has: %v, want invalid_argument", err)
	}
	_ = b
}

// nodeNamed is what n lists of node name.
func nodeNamed(t *testing.T, n *fleetNode, name string) torpor.Node {
	t.Helper()
	nodes, err := n.eng.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range nodes {
		if x.Name == name {
			return x
		}
	}
	return torpor.Node{}
}

// TestFleetGPUPlacement: each node says its GPUs (count, model, VRAM) and,
// with its heartbeat, what its GPU leases hold of them; a create that asks
// for a GPU lease goes only to a node with GPUs that has its VRAM slice
// free, never to one without GPUs; when every GPU node is full it is a
// retriable capacity conflict, and more GPUs than any node has is
// invalid. A lease that ends (hibernate) frees its slice for the next.
func TestFleetGPUPlacement(t *testing.T) {
	f := newFleetEnv(t)
	f.gpus = map[string]*sim.Host{"b": sim.New(sim.Options{DeviceMiB: []int64{16384}, Model: "L4"})}
	a := f.start("a", lifecycle.Capacity{}, nil)
	b := f.start("b", lifecycle.Capacity{}, nil)
	f.eventually("a knows b", func() bool { return nodeState(t, a, "b") == torpor.NodeUp })
	if g := nodeNamed(t, a, "b").GPUs; g != (torpor.NodeGPUs{Count: 1, Model: "L4", VRAMMiB: 16384}) {
		t.Fatalf("b lists its GPUs as %+v, want one L4 of 16384 MiB, none used", g)
	}
	if g := nodeNamed(t, b, "a").GPUs; g != (torpor.NodeGPUs{}) {
		t.Fatalf("a, which has no GPU host, lists GPUs %+v", g)
	}
	gpuReq := torpor.CreateRequest{Template: "base", Accel: &torpor.AccelRequest{VRAMMiB: 12288}}
	f.eventually("a's listing of b", func() bool {
		r, err := a.eng.PlaceCreate(ctx, gpuReq)
		return err == nil && !r.Local && r.Node.Name == "b"
	})
	// A create without accel stays on the node asked.
	if r, err := a.eng.PlaceCreate(ctx, torpor.CreateRequest{Template: "base"}); err != nil || !r.Local {
		t.Fatalf("a plain create through a goes to %+v (%v), want a", r, err)
	}
	sb, err := b.eng.Create(ctx, "acme", gpuReq)
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != torpor.StateRunning || sb.GPU == nil {
		t.Fatalf("the GPU sandbox on b is %s with lease %v", sb.State, sb.GPU)
	}
	f.eventually("b's heartbeat shows its held VRAM", func() bool { return nodeNamed(t, a, "b").GPUs.UsedVRAMMiB == 12288 })

	// b has 4 GiB left: another 12 GiB slice fits nowhere, whoever asks.
	for _, n := range []*fleetNode{a, b} {
		f.eventually(n.name+"'s listing of b's use", func() bool {
			_, err := n.eng.PlaceCreate(ctx, gpuReq)
			return err != nil
		})
		_, err := n.eng.PlaceCreate(ctx, gpuReq)
		var te *torpor.Error
		if !errors.As(err, &te) || te.Code != torpor.EConflict || te.Reason != "capacity" || te.RetryAfter <= 0 {
			t.Fatalf("a GPU create through %s with every GPU full: %v, want a capacity conflict with Retry-After", n.name, err)
		}
	}
	// b itself refuses one sent to it (another front's stale figures).
	if _, err := b.eng.Create(ctx, "acme", gpuReq); !torpor.IsCode(err, torpor.EConflict) {
		t.Fatalf("a GPU create on b with its VRAM taken: %v, want a capacity conflict", err)
	}
	// A small slice still fits on b.
	small := torpor.CreateRequest{Template: "base", Accel: &torpor.AccelRequest{VRAMMiB: 2048}}
	f.eventually("a 2 GiB slice placed on b", func() bool {
		r, err := a.eng.PlaceCreate(ctx, small)
		return err == nil && r.Node.Name == "b"
	})
	two := torpor.CreateRequest{Template: "base", Accel: &torpor.AccelRequest{GPUs: 2, VRAMMiB: 1024}}
	if _, err := a.eng.PlaceCreate(ctx, two); !torpor.IsCode(err, torpor.EInvalid) {
		t.Fatalf("two GPUs, which no node has: %v, want invalid_argument", err)
	}

	// Hibernating the GPU sandbox ends its lease: its slice is free again.
	must(b.eng.Hibernate(ctx, "acme", sb.ID))
	f.eventually("b's heartbeat shows its VRAM free", func() bool { return nodeNamed(t, a, "b").GPUs.UsedVRAMMiB == 0 })
	f.eventually("a places a GPU create on b again", func() bool {
		r, err := a.eng.PlaceCreate(ctx, gpuReq)
		return err == nil && r.Node.Name == "b"
	})
}

// TestFleetDrain: a draining node hibernates, uploads and lets go of its
// sandboxes; the running one starts on another node, with its files.
func TestFleetDrain(t *testing.T) {
	f := newFleetEnv(t)
	nodes := map[string]*fleetNode{}
	startOn := func(ctx context.Context, n torpor.Node, tenant, id string) error {
		_, err := nodes[n.Name].eng.Start(ctx, tenant, id)
		return err
	}
	a := f.startWith("a", lifecycle.Capacity{}, nil, startOn)
	b := f.startWith("b", lifecycle.Capacity{}, nil, startOn)
	nodes["a"], nodes["b"] = a, b
	var ids []string
	for range 3 {
		sb, err := a.eng.Create(ctx, "acme", torpor.CreateRequest{Template: "base"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, sb.ID)
	}
	run, paused, hib := ids[0], ids[1], ids[2]
	if err := os.MkdirAll(filepath.Join(a.host.FilesDir, run), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(a.host.FilesDir, run, "work.txt"), []byte("w"), 0o644); err != nil {
		t.Fatal(err)
	}
	must(a.eng.Pause(ctx, "acme", paused, ""))
	must(a.eng.Hibernate(ctx, "acme", hib))
	if _, err := b.eng.DrainNode(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	f.eventually("a drained", func() bool {
		for _, id := range ids {
			if b.get(t, id).Node == "a" {
				return false
			}
		}
		return true
	})
	f.eventually("the running one running on b", func() bool {
		sb := b.get(t, run)
		return sb.Node == "b" && sb.State == torpor.StateRunning
	})
	if got, err := os.ReadFile(filepath.Join(b.host.FilesDir, run, "work.txt")); err != nil || string(got) != "w" {
		t.Fatalf("the moved sandbox's file reads %q (%v)", got, err)
	}
	for _, id := range []string{paused, hib} {
		sb := b.get(t, id)
		if sb.State != torpor.StateHibernated || sb.Durability != torpor.DurabilityRemote || sb.Node != "" {
			t.Fatalf("a drained %s sandbox is %s (%s) on %q, want hibernated, remote, on no node", id, sb.State, sb.Durability, sb.Node)
		}
	}
	if a.host.State(run) != torpor.InstanceMissing || a.host.HasDisk(hib) {
		t.Fatal("the drained node kept a copy of what it moved")
	}
	// A create through the draining node goes elsewhere.
	if r, err := a.eng.PlaceCreate(ctx, torpor.CreateRequest{Template: "base"}); err != nil || r.Local {
		t.Fatalf("a draining node places a create at %+v (%v), want another node", r, err)
	}
}

// TestFleetRouteFollowsTheOwner: a node that routed a request to another
// node's sandbox (and remembers where it went) never routes another
// tenant's request by what it remembers, and follows the sandbox when it
// moves (here a drain) and when it ends.
func TestFleetRouteFollowsTheOwner(t *testing.T) {
	f := newFleetEnv(t)
	nodes := map[string]*fleetNode{}
	startOn := func(ctx context.Context, n torpor.Node, tenant, id string) error {
		_, err := nodes[n.Name].eng.Start(ctx, tenant, id)
		return err
	}
	a := f.startWith("a", lifecycle.Capacity{}, nil, startOn)
	b := f.startWith("b", lifecycle.Capacity{}, nil, startOn)
	c := f.startWith("c", lifecycle.Capacity{}, nil, startOn)
	nodes["a"], nodes["b"], nodes["c"] = a, b, c
	sb, err := a.eng.Create(ctx, "acme", torpor.CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	for range 3 {
		if r, err := c.eng.Route(ctx, "acme", sb.ID); err != nil || r.Local || r.Node.Name != "a" {
			t.Fatalf("c routes a's sandbox to %+v (%v), want node a", r, err)
		}
	}
	// Another tenant's request stays on c, which answers as for any
	// sandbox it cannot see: not found.
	if r, err := c.eng.Route(ctx, "other", sb.ID); err != nil || !r.Local {
		t.Fatalf("c routes another tenant's request to %+v (%v), want here", r, err)
	}
	if _, err := c.eng.Get(ctx, "other", sb.ID); !torpor.IsCode(err, torpor.ENotFound) {
		t.Fatalf("another tenant gets a's sandbox through c: %v, want not_found", err)
	}

	if _, err := c.eng.DrainNode(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	// The drain starts it on b or on c: c's route follows it there.
	var owner string
	f.eventually("c routes the drained sandbox where it runs", func() bool {
		now := c.get(t, sb.ID)
		if now.State != torpor.StateRunning || (now.Node != "b" && now.Node != "c") {
			return false
		}
		owner = now.Node
		r, err := c.eng.Route(ctx, "acme", sb.ID)
		return err == nil && r.Local == (owner == "c") && (r.Local || r.Node.Name == owner)
	})
	if _, err := nodes[owner].eng.Delete(ctx, "acme", sb.ID); err != nil {
		t.Fatal(err)
	}
	f.eventually("c routes the deleted sandbox here", func() bool {
		r, err := c.eng.Route(ctx, "acme", sb.ID)
		return err == nil && r.Local
	})
}

// flakyObjects is an object store that can be down.
type flakyObjects struct {
	torpor.ObjectStore
	down atomic.Bool
}

func (o *flakyObjects) Put(ctx context.Context, key string, r io.Reader, size int64) error {
	if o.down.Load() {
		_, _ = io.Copy(io.Discard, io.LimitReader(r, 1<<10))
		return errors.New("the object store is down")
	}
	return o.ObjectStore.Put(ctx, key, r, size)
}

// TestFleetUploadRetriesUntilTheStoreIsBack: a hibernation completes with
// the object store down, durability stays node, and the upload is made
// once the store is back.
func TestFleetUploadRetriesUntilTheStoreIsBack(t *testing.T) {
	f := newFleetEnv(t)
	flaky := &flakyObjects{ObjectStore: f.objects}
	flaky.down.Store(true)
	f.objects = flaky
	a := f.start("a", lifecycle.Capacity{}, nil)
	sb, err := a.eng.Create(ctx, "acme", torpor.CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	if got := must2(a.eng.Hibernate(ctx, "acme", sb.ID)); got.State != torpor.StateHibernated {
		t.Fatalf("hibernate with the object store down: %s", got.State)
	}
	time.Sleep(2 * time.Second)
	if got := a.get(t, sb.ID); got.Durability != torpor.DurabilityNode {
		t.Fatalf("durability %s with the object store down, want node", got.Durability)
	}
	flaky.down.Store(false)
	f.eventually("the upload after the store came back", func() bool { return a.get(t, sb.ID).Durability == torpor.DurabilityRemote })
}

// fleetLog is node name's log: on stderr with TORPOR_TEST_LOG=1.
func fleetLog(name string) *slog.Logger {
	if os.Getenv("TORPOR_TEST_LOG") == "" {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelDebug})).With("node", name)
}
