package e2e

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/wire"
	"github.com/torpor-dev/torpor/client"
	"github.com/torpor-dev/torpor/network"
	"github.com/torpor-dev/torpor/objstore/s3test"
	"github.com/torpor-dev/torpor/store/postgres/pgtest"
)

// A fleet rig is several `torpor serve` processes on this machine, the
// nodes n1, n2, ... of one fleet (docs/fleet.md): one PostgreSQL server of
// the test's own holds their one database, one S3 server in the test
// process their object store, and a secret file their node-to-node
// authentication. Each node has a data dir, a sandbox bridge and a /24 of
// its own, as separate hosts would.

// fleetBucket is the object store's bucket of every rig.
const fleetBucket = "torpor-fleet"

// fleetRig is one test's fleet.
type fleetRig struct {
	t       *testing.T
	bin     string
	root    string
	pg      *pgtest.Server
	db      string
	s3      *s3test.Server
	objects string
	secret  string
	down    int
	nodes   []*fleetNode
}

// fleetNode is one node of a rig: its settings and its daemon of now.
type fleetNode struct {
	rig     *fleetRig
	name    string
	dataDir string
	bridge  string
	cidr    string
	extra   []string
	d       *daemon
	stopped bool // SIGSTOPped and not yet continued
	// past holds the logs of the node's earlier daemons in the test.
	past []string
}

// fleetOptions shape a rig.
type fleetOptions struct {
	// Nodes is how many nodes it starts.
	Nodes int
	// DownSeconds is node_down_seconds of every node (3 when 0).
	DownSeconds int
	// Args holds more `torpor serve` flags for some nodes, by number (1
	// for n1).
	Args map[int][]string
}

// newFleetRig starts a fleet and waits until every node is up and has
// seen the others. It skips without root, runc or PostgreSQL 15.
func newFleetRig(t *testing.T, o fleetOptions) *fleetRig {
	t.Helper()
	needs(t)
	// The temporary folder first, so that it is removed last: after the
	// sweep of what killed nodes left mounted in it.
	root := t.TempDir()
	r := &fleetRig{t: t, bin: torporBin(t), root: root, down: o.DownSeconds}
	if r.down == 0 {
		r.down = 3
	}
	r.pg = pgtest.New(t)
	r.db = r.pg.NewDatabase(t)
	r.s3 = s3test.Start(t)
	r.objects = r.s3.URL(fleetBucket)

	var sec [32]byte
	rand.Read(sec[:])
	r.secret = filepath.Join(root, "fleet.secret")
	if err := os.WriteFile(r.secret, []byte(hex.EncodeToString(sec[:])+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}

	var tag [2]byte
	rand.Read(tag[:])
	base := int(tag[0]) % 200
	for k := 1; k <= o.Nodes; k++ {
		n := &fleetNode{rig: r, name: fmt.Sprintf("n%d", k), dataDir: filepath.Join(root, fmt.Sprintf("n%d", k)),
			bridge: fmt.Sprintf("tfl%s%d", hex.EncodeToString(tag[:]), k), cidr: fmt.Sprintf("10.231.%d.0/24", base+k),
			extra: o.Args[k]}
		if err := os.MkdirAll(n.dataDir, 0o700); err != nil {
			t.Fatal(err)
		}
		r.nodes = append(r.nodes, n)
	}
	// Registered before any daemon starts, so that it runs after their
	// shutdowns (later cleanups run earlier), and before the folder's
	// removal.
	t.Cleanup(r.sweep)

	for i, n := range r.nodes {
		if i > 0 {
			// Webhook secrets are sealed with one key for the whole
			// database: every node has n1's.
			key, err := os.ReadFile(filepath.Join(r.nodes[0].dataDir, "webhook.key"))
			if err == nil {
				if err := os.WriteFile(filepath.Join(n.dataDir, "webhook.key"), key, 0o600); err != nil {
					t.Fatal(err)
				}
			}
		}
		n.start()
	}
	for _, n := range r.nodes {
		r.waitNode(r.nodes[0], n.name, torpor.NodeUp, 20*time.Second)
	}
	r.settle()
	return r
}

// settle waits for every node to have heartbeaten, and so listed the
// fleet, since the last change: a node routes by its last listing.
func (r *fleetRig) settle() {
	time.Sleep(time.Duration(r.down)*time.Second/5 + 300*time.Millisecond)
}

// node returns node k (1: n1).
func (r *fleetRig) node(k int) *fleetNode { return r.nodes[k-1] }

// start starts the node's daemon on its data dir.
func (n *fleetNode) start() {
	r := n.rig
	r.t.Helper()
	args := []string{"--node-name", n.name, "--store", r.db, "--fleet-secret-file", r.secret,
		"--object-store", r.objects, "--node-down-seconds", strconv.Itoa(r.down),
		"--network-bridge", n.bridge, "--network-cidr", n.cidr,
		// Small disks upload in a moment; settling each second lets the
		// ledger show any second billed twice across nodes.
		"--default-disk-mib", "64", "--settle-seconds", "1"}
	if n.d != nil {
		n.past = append(n.past, n.d.logs.String())
	}
	n.d = startDaemonArgs(r.t, r.bin, n.dataDir, append(args, n.extra...), r.s3.Env()...)
	n.stopped = false
}

// restart starts the node again on its data dir (after kill).
func (n *fleetNode) restart() { n.start() }

// kill ends the node's daemon with SIGKILL, as a crash of its host's
// daemon would: its sandboxes' containers stay.
func (n *fleetNode) kill() {
	n.rig.t.Helper()
	n.cont()
	if err := n.d.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		n.rig.t.Fatalf("kill %s: %v", n.name, err)
	}
	<-n.d.exited
}

// pause stops the node's daemon (SIGSTOP), as a host that hangs.
func (n *fleetNode) pause() {
	n.rig.t.Helper()
	if err := n.d.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		n.rig.t.Fatalf("SIGSTOP %s: %v", n.name, err)
	}
	n.stopped = true
	// Before the daemon's shutdown, which asks it to delete sandboxes.
	n.rig.t.Cleanup(n.cont)
}

// cont continues a node stopped with pause.
func (n *fleetNode) cont() {
	if n.stopped && n.d != nil {
		_ = n.d.cmd.Process.Signal(syscall.SIGCONT)
		n.stopped = false
	}
}

// cl is a client of the node's API with its admin key (every node's admin
// key is valid on all: they share the database). It does not retry.
func (n *fleetNode) cl() *client.Client {
	return n.d.client(n.rig.t).WithRetry(client.RetryPolicy{Attempts: 1})
}

// logs is what the node's daemons of the test wrote so far, the current
// one's last.
func (n *fleetNode) logs() string {
	return strings.Join(append(slices.Clone(n.past), n.d.logs.String()), "\n----- restarted -----\n")
}

// allLogs is every node's log, for a failure's message.
func (r *fleetRig) allLogs() string {
	var b strings.Builder
	for _, n := range r.nodes {
		if n.d != nil {
			fmt.Fprintf(&b, "\n===== %s =====\n%s", n.name, n.logs())
		}
	}
	return b.String()
}

// fatalf fails the test with every node's log.
func (r *fleetRig) fatalf(format string, args ...any) {
	r.t.Helper()
	r.t.Fatalf(format+"\nlogs:%s", append(args, r.allLogs())...)
}

// nodes lists the fleet's nodes as node via sees them.
func (r *fleetRig) listNodes(via *fleetNode) ([]wire.Node, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return via.cl().Nodes(ctx)
}

// waitNode waits until GET /v1/nodes through via shows node name in state
// st, and returns it as shown.
func (r *fleetRig) waitNode(via *fleetNode, name string, st torpor.NodeState, within time.Duration) wire.Node {
	r.t.Helper()
	deadline := time.Now().Add(within)
	var last string
	for {
		nodes, err := r.listNodes(via)
		if err != nil {
			last = err.Error()
		} else {
			last = fmt.Sprintf("%+v", nodes)
			for _, n := range nodes {
				if n.Name == name && n.State == st {
					return n
				}
			}
		}
		if time.Now().After(deadline) {
			r.fatalf("node %s is not %s after %v, as %s lists them: %s", name, st, within, via.name, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// nodeOf returns node name as via lists it.
func (r *fleetRig) nodeOf(via *fleetNode, name string) wire.Node {
	r.t.Helper()
	nodes, err := r.listNodes(via)
	if err != nil {
		r.fatalf("GET /v1/nodes on %s: %v", via.name, err)
	}
	for _, n := range nodes {
		if n.Name == name {
			return n
		}
	}
	r.fatalf("%s lists no node %s: %+v", via.name, name, nodes)
	return wire.Node{}
}

// get reads sandbox id through node via.
func (r *fleetRig) get(via *fleetNode, id string) *torpor.Sandbox {
	r.t.Helper()
	sb, err := via.cl().Get(context.Background(), id)
	if err != nil {
		r.fatalf("get %s through %s: %v", id, via.name, err)
	}
	return sb
}

// peek reads sandbox id through via from the sandbox list, which no node
// routes: a GET of a sandbox that no live node holds has the node that
// answers take it (lifecycle.Engine.Route), which a test waiting for it to
// be released must not do.
func (r *fleetRig) peek(via *fleetNode, id string) (*torpor.Sandbox, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sbs, err := via.cl().List(ctx, client.ListOptions{All: true})
	if err != nil {
		return nil, err
	}
	for _, sb := range sbs {
		if sb.ID == id {
			return sb, nil
		}
	}
	return nil, fmt.Errorf("%s lists no sandbox %s", via.name, id)
}

// waitSandbox waits until sandbox id, read through via (peek), satisfies
// ok.
func (r *fleetRig) waitSandbox(via *fleetNode, id, what string, within time.Duration, ok func(*torpor.Sandbox) bool) *torpor.Sandbox {
	r.t.Helper()
	deadline := time.Now().Add(within)
	var last string
	for {
		sb, err := r.peek(via, id)
		if err == nil && ok(sb) {
			return sb
		}
		if err != nil {
			last = err.Error()
		} else {
			last = fmt.Sprintf("state %s node %q epoch %d durability %s failure %+v", sb.State, sb.Node, sb.NodeEpoch, sb.Durability, sb.Failure)
		}
		if time.Now().After(deadline) {
			r.fatalf("sandbox %s is not %s after %v (through %s): %s", id, what, within, via.name, last)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// create makes a sandbox through node via.
func (r *fleetRig) create(via *fleetNode, req torpor.CreateRequest) *torpor.Sandbox {
	r.t.Helper()
	if req.Template == "" {
		req.Template = "base"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	sb, err := via.cl().Create(ctx, req)
	if err != nil {
		r.fatalf("create through %s: %v", via.name, err)
	}
	return sb
}

// sh runs a shell command in sandbox id through via and returns its
// stdout, failing unless it exits 0.
func (r *fleetRig) sh(via *fleetNode, id, script string) string {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	res, err := via.cl().Exec(ctx, id, client.ExecRequest{Cmd: []string{"sh", "-c", script}})
	if err != nil {
		r.fatalf("exec %q in %s through %s: %v", script, id, via.name, err)
	}
	if res.ExitCode != 0 {
		r.fatalf("exec %q in %s through %s: exit %d: %s%s", script, id, via.name, res.ExitCode, res.Stdout, res.Stderr)
	}
	return res.Stdout
}

// hibernateRemote hibernates sandbox id through via and waits until its
// disk is in the object store.
func (r *fleetRig) hibernateRemote(via *fleetNode, id string) *torpor.Sandbox {
	r.t.Helper()
	if _, err := via.cl().Hibernate(context.Background(), id); err != nil {
		r.fatalf("hibernate %s through %s: %v", id, via.name, err)
	}
	return r.waitSandbox(via, id, "hibernated with durability remote", 20*time.Second, func(sb *torpor.Sandbox) bool {
		return sb.State == torpor.StateHibernated && sb.Durability == torpor.DurabilityRemote
	})
}

// eventTypes is the types of evs.
func eventTypes(evs []torpor.Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = e.Type
	}
	return out
}

// countEvents counts the events of type typ in evs.
func countEvents(evs []torpor.Event, typ string) int {
	n := 0
	for _, e := range evs {
		if e.Type == typ {
			n++
		}
	}
	return n
}

// checkFleetLedger checks that sandbox id's usage rows, read through via
// (its open interval included), cover its life since its creation once
// each, no gap and no overlap (no second billed twice, by two nodes or
// one), as its event log says it was.
func (r *fleetRig) checkFleetLedger(via *fleetNode, id string) {
	r.t.Helper()
	ctx := context.Background()
	cl := via.cl()
	sb := r.get(via, id)
	rep, err := cl.Usage(ctx, client.UsageQuery{Sandbox: id, Tenant: sb.Tenant})
	if err != nil {
		r.fatalf("usage of %s through %s: %v", id, via.name, err)
	}
	rows := rep.Rows
	if rep.Truncated {
		r.fatalf("the ledger of %s is truncated (%d rows)", id, len(rows))
	}
	slices.SortFunc(rows, func(a, b torpor.UsageRecord) int { return a.Start.Compare(b.Start) })
	spans, err := torpor.SpansOfRows(rows)
	if err != nil {
		r.fatalf("the ledger of %s: %v\nrows: %+v", id, err, rows)
	}
	evs := sandboxEvents(r.t, cl, id)
	end := time.Now()
	if len(rows) > 0 {
		end = rows[len(rows)-1].End
	}
	// A life of no length bills nothing: a sandbox created after its
	// node's last heartbeat and lost with it.
	want := slices.DeleteFunc(torpor.SpansOfEvents(evs, end), func(s torpor.UsageSpan) bool { return !s.End.After(s.Start) })
	if len(rows) == 0 && len(want) == 0 {
		return
	}
	if len(spans) == 0 || !spans[0].Start.Equal(sb.CreatedAt) {
		r.fatalf("the ledger of %s, created at %s: %v (events %v)", id, sb.CreatedAt, spans, eventTypes(evs))
	}
	if !slices.Equal(spans, want) {
		r.fatalf("the ledger of %s\n%v\ndiffers from its event log\n%v\nevents: %+v", id, spans, want, evs)
	}
}

// sandboxDirOf is where node n's runc runtime keeps sandbox id.
func (n *fleetNode) sandboxDirOf(id string) string {
	return filepath.Join(n.dataDir, "runc", "sandboxes", id)
}

// sweep removes what the rig's nodes left on the host once their daemons
// are gone: the containers of a node killed and never restarted (runc
// delete), the mounts in its data dir, its bridge and firewall tables.
func (r *fleetRig) sweep() {
	for _, n := range r.nodes {
		if n.d != nil {
			select {
			case <-n.d.exited:
			default:
				_ = n.d.cmd.Process.Signal(syscall.SIGCONT)
				n.d.stop()
			}
		}
		runcRoot := filepath.Join(n.dataDir, "runc", "runc")
		if out, err := exec.Command("runc", "--root", runcRoot, "list", "-q").Output(); err == nil {
			for _, id := range strings.Fields(string(out)) {
				_ = exec.Command("runc", "--root", runcRoot, "delete", "--force", id).Run()
			}
		}
		unmountUnder(n.dataDir)
		// The runtime's cgroup parent (runc's defaultCgroupParent), empty
		// once its containers are gone.
		sum := sha256.Sum256([]byte(filepath.Join(n.dataDir, "runc")))
		parents, _ := filepath.Glob("/sys/fs/cgroup/*/torpor/" + hex.EncodeToString(sum[:4]))
		more, _ := filepath.Glob("/sys/fs/cgroup/torpor/" + hex.EncodeToString(sum[:4]))
		for _, p := range append(parents, more...) {
			_ = unix.Rmdir(p)
		}
		_ = exec.Command("ip", "link", "delete", n.bridge).Run()
		if c, err := nftables.New(); err == nil {
			c.DelTable(&nftables.Table{Name: n.bridge, Family: nftables.TableFamilyINet})
			c.DelTable(&nftables.Table{Name: n.bridge, Family: nftables.TableFamilyBridge})
			_ = c.Flush()
		}
		_ = os.RemoveAll(filepath.Join(network.DefaultStateDir, n.bridge))
	}
}

// unmountUnder detaches every mount below dir, deepest first.
func unmountUnder(dir string) {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return
	}
	defer f.Close()
	var points []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 4 && strings.HasPrefix(fields[4], dir+"/") {
			points = append(points, fields[4])
		}
	}
	slices.SortFunc(points, func(a, b string) int { return len(b) - len(a) })
	for _, p := range points {
		_ = unix.Unmount(p, unix.MNT_DETACH)
	}
}
