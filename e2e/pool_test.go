package e2e

import (
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/client"
)

// pool returns the status of template's pool on d (zero when none).
func pool(t testing.TB, cl *client.Client, template string) torpor.PoolStatus {
	t.Helper()
	pools, err := cl.Pools(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range pools {
		if p.Template == template {
			return p
		}
	}
	return torpor.PoolStatus{}
}

// waitPool waits until template's pool has ready members and matches ok.
// The refill runs in the background: this waits for it, it times nothing.
func waitPool(t testing.TB, d *daemon, cl *client.Client, template string, ok func(torpor.PoolStatus) bool) torpor.PoolStatus {
	t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for {
		p := pool(t, cl, template)
		if ok(p) {
			return p
		}
		if time.Now().After(deadline) {
			t.Fatalf("pool %s: %+v\ndaemon log:\n%s", template, p, d.logs.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func readyIs(n int) func(torpor.PoolStatus) bool {
	return func(p torpor.PoolStatus) bool { return p.Ready == n && p.Size == n }
}

// drainPools turns every pool of d off and waits until no container of d
// is left, so that no frozen member outlives the test (a clean stop keeps
// the members for the next start, docs/pools.md). It runs before the
// daemon's own shutdown, which removes the tenants' sandboxes.
func drainPools(t testing.TB, d *daemon) {
	t.Helper()
	t.Cleanup(func() {
		select {
		case <-d.exited:
			return
		default:
		}
		cl := d.client(t)
		ctx := context.Background()
		pools, _ := cl.Pools(ctx)
		for _, p := range pools {
			_, _ = cl.SetPool(ctx, p.Template, 0)
		}
		sbs, _ := cl.List(ctx, client.ListOptions{})
		for _, sb := range sbs {
			_, _ = cl.Delete(ctx, sb.ID)
		}
		root := filepath.Join(d.dataDir, "runc", "runc")
		deadline := time.Now().Add(60 * time.Second)
		for {
			out, err := exec.Command("runc", "--root", root, "list", "-q").Output()
			if err == nil && strings.TrimSpace(string(out)) == "" {
				return
			}
			if time.Now().After(deadline) {
				t.Errorf("containers left after the pools were drained: %s %v", out, err)
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
	})
}

// TestWarmPool drives a pool through the real daemon: --warm-pool fills
// it; a matching create (the Go client, the CLI, E2B) claims a member that
// runs at once under the claimant's id, hostname, env and metadata, and
// that holds nothing of an earlier claimant; the pool refills; a create
// with a setup of its own boots cold; the members are invisible to every
// tenant; `torpor pools` lists and sets; a restart keeps the pool.
func TestWarmPool(t *testing.T) {
	needs(t)
	bin, dataDir := torporBin(t), t.TempDir()
	args := []string{"--warm-pool", "base=2"}
	d := startDaemonArgs(t, bin, dataDir, args)
	drainPools(t, d)
	cl := d.client(t)
	ctx := context.Background()
	waitPool(t, d, cl, "base", readyIs(2))
	if sbs, err := cl.List(ctx, client.ListOptions{}); err != nil || len(sbs) != 0 {
		t.Fatalf("the pool's members are listed: %v %v", sbs, err)
	}

	first, err := cl.Create(ctx, torpor.CreateRequest{Template: "base",
		Env: map[string]string{"GREETING": "hello"}, Metadata: map[string]string{"team": "ml"}})
	if err != nil {
		t.Fatal(err)
	}
	if !first.FromPool || first.State != torpor.StateRunning || first.Metadata["team"] != "ml" {
		t.Fatalf("the first create: %+v", first)
	}
	res, err := cl.Exec(ctx, first.ID, client.ExecRequest{Cmd: []string{"sh", "-c", "hostname; echo $GREETING; echo secret > /root/mine"}})
	if err != nil || res.Stdout != first.ID+"\nhello\n" || res.ExitCode != 0 {
		t.Fatalf("exec in the claimed sandbox: %+v %v", res, err)
	}
	// A background process gets the claimant's env too.
	p, err := cl.StartProcess(ctx, first.ID, client.ProcessRequest{Cmd: []string{"sh", "-c", "echo $GREETING"}})
	if err != nil {
		t.Fatal(err)
	}
	var pout strings.Builder
	if _, err := cl.FollowProcessOutput(ctx, first.ID, p.ID, 0, &pout); err != nil || pout.String() != "hello\n" {
		t.Fatalf("a process of the claimed sandbox wrote %q: %v", pout.String(), err)
	}

	// The CLI's create claims the other member, which has nothing of the
	// first claimant's.
	var second torpor.Sandbox
	if err := json.Unmarshal([]byte(d.ok("create", "--json")), &second); err != nil {
		t.Fatal(err)
	}
	if !second.FromPool || second.ID == first.ID {
		t.Fatalf("the second create: %+v", second)
	}
	out2 := d.ok("exec", second.ID, "--", "sh", "-c", "hostname; ls /root; echo \"[$GREETING]\"")
	if out2 != second.ID+"\n[]\n" {
		t.Fatalf("the second claimant sees %q", out2)
	}
	if got := d.get(second.ID); !got.FromPool {
		t.Fatalf("torpor get of a claimed sandbox: from_pool %v", got.FromPool)
	}

	// Another tenant sees only its own claim, nothing of the pool.
	key := strings.TrimSpace(d.ok("keys", "create", "--tenant", "other"))
	other, err := client.New("http://"+d.addr, key)
	if err != nil {
		t.Fatal(err)
	}
	waitPool(t, d, cl, "base", readyIs(2))
	theirs, err := other.Create(ctx, torpor.CreateRequest{Template: "base"})
	if err != nil || !theirs.FromPool {
		t.Fatalf("another tenant's create: %+v %v", theirs, err)
	}
	if sbs, err := other.List(ctx, client.ListOptions{}); err != nil || len(sbs) != 1 || sbs[0].ID != theirs.ID {
		t.Fatalf("another tenant lists %v %v", sbs, err)
	}
	if _, err := other.Get(ctx, first.ID); !client.IsNotFound(err) {
		t.Fatalf("another tenant gets the first claimant's sandbox: %v", err)
	}
	if _, err := other.SetPool(ctx, "base", 1); err == nil {
		t.Fatal("a tenant key set a pool")
	}

	// A create with a setup of its own boots cold and is no miss.
	cold, err := cl.Create(ctx, torpor.CreateRequest{Template: "base", Runtime: torpor.RuntimeConfig{Setup: []string{"true"}}})
	if err != nil || cold.FromPool {
		t.Fatalf("a create with its own setup: %+v %v", cold, err)
	}
	st := waitPool(t, d, cl, "base", readyIs(2))
	if st.Hits != 3 || st.Misses != 0 {
		t.Fatalf("pool counters: %+v, want 3 hits, no miss", st)
	}

	// torpor pools lists and sets; the size set is kept over a restart
	// although the flag says otherwise.
	if out := d.ok("pools"); !strings.Contains(out, "base") || !strings.Contains(out, "TEMPLATE") {
		t.Fatalf("torpor pools:\n%s", out)
	}
	d.ok("pools", "set", "base", "1")
	waitPool(t, d, cl, "base", readyIs(1))
	if _, errs, code := d.cli("pools", "set", "base", "lots"); code == 0 || !strings.Contains(errs, "size") {
		t.Fatalf("torpor pools set with a bad size: %d %s", code, errs)
	}
	for _, sb := range []*torpor.Sandbox{first, &second, cold} {
		if _, err := cl.Delete(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := other.Delete(ctx, theirs.ID); err != nil {
		t.Fatal(err)
	}
	d.stop()
	// E2B's template "tiny" stands for torpor's base (e2b_templates).
	d = startDaemonArgs(t, bin, dataDir, args, "TORPOR_E2B_TEMPLATES=tiny=base")
	drainPools(t, d)
	cl = d.client(t)
	waitPool(t, d, cl, "base", readyIs(1))
	after, err := cl.Create(ctx, torpor.CreateRequest{Template: "base"})
	if err != nil || !after.FromPool {
		t.Fatalf("a create after the restart: %+v %v", after, err)
	}
	if out := d.ok("exec", after.ID, "--", "hostname"); strings.TrimSpace(out) != after.ID {
		t.Fatalf("hostname after the restart: %q", out)
	}
	// The member claimed is the one the restart adopted frozen, not one
	// booted since.
	if !strings.Contains(d.logs.String(), "msg=reconciling sandbox="+after.ID+" state=paused instance=frozen") {
		t.Fatalf("the claim after the restart took %s, which the restart did not adopt:\n%s", after.ID, d.logs.String())
	}

	// E2B's creates ask for the internet (this daemon has a network): a
	// pool booted with it serves them.
	if _, err := cl.SetPoolInternet(ctx, "base", 1, true); err != nil {
		t.Fatal(err)
	}
	waitPool(t, d, cl, "base", func(p torpor.PoolStatus) bool { return p.AllowInternet && p.Ready == 1 })
	var made struct{ SandboxID string }
	if code := e2bCall(t, d, "POST", "/sandboxes", `{"templateID":"tiny","timeout":120,"envVars":{"GREETING":"e2b"}}`, &made); code != 201 {
		t.Fatalf("E2B create: %d", code)
	}
	sb, err := cl.Get(ctx, made.SandboxID)
	if err != nil || !sb.FromPool || !sb.AllowInternet {
		t.Fatalf("the E2B create did not claim: %+v %v", sb, err)
	}
	res, err = cl.Exec(ctx, sb.ID, client.ExecRequest{Cmd: []string{"sh", "-c", "echo $GREETING"}})
	if err != nil || res.Stdout != "e2b\n" {
		t.Fatalf("exec in the E2B claim: %+v %v", res, err)
	}
}

// warm_pools in the config file, and TORPOR_WARM_POOLS over it for the
// templates it names, start the pools as the flag does.
func TestWarmPoolFromConfigAndEnv(t *testing.T) {
	needs(t)
	dataDir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dataDir, "torpor.toml"), []byte("warm_pools = [\"base=2:internet\"]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	d := startDaemon(t, torporBin(t), dataDir, "TORPOR_WARM_POOLS=base=1")
	drainPools(t, d)
	cl := d.client(t)
	p := waitPool(t, d, cl, "base", readyIs(1))
	if p.AllowInternet {
		t.Fatalf("the environment's base=1 did not replace the file's base=2:internet: %+v", p)
	}
	sb, err := cl.Create(context.Background(), torpor.CreateRequest{Template: "base"})
	if err != nil || !sb.FromPool {
		t.Fatalf("a create on a pool from the environment: %+v %v", sb, err)
	}
}
