package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/wire"
	"github.com/torpor-dev/torpor/client"
)

// TestNodes drives the fleet's nodes surface on one real daemon (a fleet
// of one on its store): `torpor nodes` and the Go client list exactly
// that node, up and self, with the capacity it was given and its labels;
// a create is counted on it and shows it as its node; node labels are
// checked and sent; a drain of an unknown node is the API's error; a
// drain of the node waits, showing what it still holds, until its last
// sandbox is gone, and a draining node takes no new sandbox; undrain
// lets it take them again; a tenant key sees no nodes.
func TestNodes(t *testing.T) {
	needs(t)
	bin, dataDir := torporBin(t), t.TempDir()
	d := startDaemonArgs(t, bin, dataDir, []string{"--node-name", "solo", "--node-label", "zone=eu-1",
		"--capacity-vcpus", "6", "--capacity-memory-mib", "3000"})
	cl := d.client(t)
	ctx := context.Background()

	nodes, err := cl.Nodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 1 {
		t.Fatalf("one daemon lists %d nodes: %+v", len(nodes), nodes)
	}
	n := nodes[0]
	if n.Name != "solo" || !n.Self || n.State != torpor.NodeUp || n.Labels["zone"] != "eu-1" || n.Epoch == 0 ||
		n.Capacity.VCPUs != 6 || n.Capacity.MemoryMiB != 3000 || n.Free.VCPUs != 6 || n.HeartbeatAt.IsZero() {
		t.Fatalf("the daemon's node: %+v", n)
	}
	if !strings.Contains(strings.Join(n.Runtimes, ","), "runc") {
		t.Fatalf("the node runs %v, want runc among them", n.Runtimes)
	}
	out := d.ok("nodes")
	if !nodeRow(out, "solo", "up", "0/6", "0/0/0") {
		t.Fatalf("torpor nodes on a fresh daemon:\n%s", out)
	}
	var listed []wire.Node
	if err := json.Unmarshal([]byte(d.ok("nodes", "--json")), &listed); err != nil || len(listed) != 1 || listed[0].Name != "solo" || !listed[0].Self {
		t.Fatalf("torpor nodes --json: %+v %v", listed, err)
	}

	// A create lands on the node, is counted there and names it.
	id := strings.TrimSpace(d.ok("create", "--node-label", "zone=eu-1"))
	nodes, err = cl.Nodes(ctx)
	if err != nil || len(nodes) != 1 || nodes[0].Sandboxes[torpor.StateRunning] != 1 || nodes[0].Used.VCPUs != 1 || nodes[0].Free.VCPUs != 5 {
		t.Fatalf("the node after a create: %+v %v", nodes, err)
	}
	if out := d.ok("nodes"); !nodeRow(out, "solo", "up", "1/6", "1/0/0") {
		t.Fatalf("torpor nodes after a create:\n%s", out)
	}
	sb := d.get(id)
	if sb.Node != "solo" || sb.NodeEpoch != nodes[0].Epoch || sb.Durability != torpor.DurabilityNode {
		t.Fatalf("the sandbox's node: %q epoch %d durability %q", sb.Node, sb.NodeEpoch, sb.Durability)
	}
	got := d.ok("get", id)
	if !regexp.MustCompile(`(?m)^Node:\s+solo \(epoch \d+\)$`).MatchString(got) || !regexp.MustCompile(`(?m)^Durability:\s+node$`).MatchString(got) {
		t.Fatalf("torpor get shows no node or durability:\n%s", got)
	}

	// Node labels: a bad one is refused before anything is made, one no
	// node has is refused too.
	for _, label := range []string{"bad key=x", "zone=nowhere"} {
		if made, errs, code := d.cli("create", "--node-label", label); code == 0 || !strings.Contains(errs, "node_labels") {
			t.Errorf("torpor create --node-label %q: exit %d, stderr %q; want an error naming node_labels", label, code, errs)
			if code == 0 {
				_, _ = cl.Delete(ctx, strings.TrimSpace(made))
			}
		}
	}

	// The nodes are the admin's.
	key := strings.TrimSpace(d.ok("keys", "create", "--tenant", "acme"))
	if _, errs, code := d.cliEnv([]string{"TORPOR_API_KEY=" + key}, "nodes"); code == 0 || !strings.Contains(errs, "forbidden") {
		t.Errorf("torpor nodes with a tenant key: exit %d, stderr %q", code, errs)
	}
	if _, errs, code := d.cli("nodes", "frob"); code == 0 || !strings.Contains(errs, "unknown command") {
		t.Errorf("torpor nodes frob: exit %d, stderr %q", code, errs)
	}

	// A drain of a node the fleet does not have is the API's error.
	if _, errs, code := d.cli("nodes", "drain", "nosuch"); code == 0 || !strings.Contains(errs, "not_found") {
		t.Errorf("torpor nodes drain nosuch: exit %d, stderr %q; want the API's not_found", code, errs)
	}

	// A drain without waiting answers the node, draining; the sandbox
	// stays (no object store to move it to) and the node takes no new one.
	if out := d.ok("nodes", "drain", "solo", "--wait=false"); !nodeRow(out, "solo", "draining", "1/6", "1/0/0") {
		t.Fatalf("torpor nodes drain --wait=false:\n%s", out)
	}
	once := cl.WithRetry(client.RetryPolicy{Attempts: 1})
	if made, err := once.Create(ctx, torpor.CreateRequest{Template: "base"}); !client.IsConflict(err) {
		t.Errorf("a create on a draining node: %v, want 409", err)
		if made != nil {
			_, _ = cl.Delete(ctx, made.ID)
		}
	}
	if sb := d.get(id); sb.State != torpor.StateRunning || sb.Node != "solo" {
		t.Fatalf("a sandbox of a node drained without an object store: %s on %q", sb.State, sb.Node)
	}

	// A waiting drain shows what the node holds until its last sandbox
	// is gone.
	cmd := exec.Command(bin, "nodes", "drain", "solo")
	cmd.Env = append(os.Environ(), "TORPOR_URL=http://"+d.addr, "TORPOR_API_KEY="+d.key)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stdout strings.Builder
	cmd.Stdout = &stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	lines := make(chan string, 100)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
	}()
	exited := make(chan error, 1)
	var progress []string
	waitLine := func(want string) {
		t.Helper()
		deadline := time.After(30 * time.Second)
		for {
			select {
			case l, ok := <-lines:
				if !ok {
					t.Fatalf("torpor nodes drain ended before %q; it said %q", want, progress)
				}
				progress = append(progress, l)
				if l == want {
					return
				}
			case <-deadline:
				_ = cmd.Process.Kill()
				t.Fatalf("torpor nodes drain did not say %q in 30 s; it said %q", want, progress)
			}
		}
	}
	waitLine("Draining solo: 1 running left")
	if _, err := cl.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	waitLine("Draining solo: no sandboxes left")
	for range lines {
	}
	go func() { exited <- cmd.Wait() }()
	select {
	case err := <-exited:
		if err != nil {
			t.Fatalf("torpor nodes drain: %v; stderr %q", err, progress)
		}
	case <-time.After(30 * time.Second):
		_ = cmd.Process.Kill()
		t.Fatalf("torpor nodes drain did not end once the node held nothing: %q", progress)
	}
	if !nodeRow(stdout.String(), "solo", "draining", "0/6", "0/0/0") {
		t.Fatalf("torpor nodes drain printed:\n%s", stdout.String())
	}

	// Undrain: the node is up and takes sandboxes again.
	if out := d.ok("nodes", "undrain", "solo"); !nodeRow(out, "solo", "up", "", "") {
		t.Fatalf("torpor nodes undrain:\n%s", out)
	}
	again, err := once.Create(ctx, torpor.CreateRequest{Template: "base"})
	if err != nil || again.Node != "solo" {
		t.Fatalf("a create after the undrain: %+v %v", again, err)
	}
}

// nodeRow tells whether the table of torpor nodes has a row for the
// node name marked as the answering one, in state, with cpu (used/
// capacity) and sandboxes (running/paused/hibernated); an empty cpu or
// sandboxes matches any.
func nodeRow(table, name, state, cpu, sandboxes string) bool {
	lines := strings.Split(strings.TrimSpace(table), "\n")
	if len(lines) < 2 || !strings.HasPrefix(lines[0], "NAME") {
		return false
	}
	for _, l := range lines[1:] {
		f := strings.Fields(l)
		// NAME * STATE ADDRESS CPU MEM SANDBOXES HEARTBEAT...
		if len(f) < 7 || f[0] != name || f[1] != "*" || f[2] != state {
			continue
		}
		if (cpu == "" || f[4] == cpu) && (sandboxes == "" || f[6] == sandboxes) {
			return true
		}
	}
	return false
}
