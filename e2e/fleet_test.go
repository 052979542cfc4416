package e2e

import (
	"context"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/client"
)

// The fleet's end-to-end tests (docs/fleet.md): several real nodes on one
// PostgreSQL database and one S3 server (fleet_harness_test.go). Each
// checks that nothing is lost, stuck or billed twice.

// TestFleetPlacementAndForwarding: a create through a full node lands on
// another, and every surface of the node it came to reaches it there:
// exec, files, the port proxy and the E2B REST API.
func TestFleetPlacementAndForwarding(t *testing.T) {
	// n1 lends room for one sandbox of the default 512 MiB; n2 has a
	// label.
	r := newFleetRig(t, fleetOptions{Nodes: 2, Args: map[int][]string{1: {"--capacity-memory-mib", "600"}, 2: {"--node-label", "zone=b"}}})
	a, b := r.node(1), r.node(2)
	ctx := context.Background()

	// A create that asks for a label only n2 has goes there, though n1
	// has room.
	labelled := r.create(a, torpor.CreateRequest{NodeLabels: map[string]string{"zone": "b"}})
	if labelled.Node != "n2" {
		r.fatalf("a create through n1 for node_labels zone=b landed on %q, want n2", labelled.Node)
	}
	first := r.create(a, torpor.CreateRequest{})
	if first.Node != "n1" {
		r.fatalf("the first create through n1, which has room, landed on %q", first.Node)
	}
	web := r.create(a, torpor.CreateRequest{Runtime: torpor.RuntimeConfig{
		Setup:      []string{"mkdir -p /www && echo hello from the sandbox > /www/index.html"},
		Entrypoint: []string{"httpd", "-f", "-p", "127.0.0.1:8080", "-h", "/www"},
	}})
	if web.Node != "n2" || web.NodeEpoch == 0 || web.Durability != torpor.DurabilityNode {
		r.fatalf("a create through the full n1: node %q epoch %d durability %q, want n2", web.Node, web.NodeEpoch, web.Durability)
	}
	if _, err := os.Stat(b.sandboxDirOf(web.ID)); err != nil {
		r.fatalf("n2's runtime holds no sandbox %s: %v", web.ID, err)
	}
	if _, err := os.Stat(a.sandboxDirOf(web.ID)); err == nil {
		r.fatalf("n1's runtime holds sandbox %s, which runs on n2", web.ID)
	}

	// Exec and files through n1.
	if out := r.sh(a, web.ID, "cat /www/index.html"); out != "hello from the sandbox\n" {
		r.fatalf("exec through n1: %q", out)
	}
	if _, err := a.cl().WriteFile(ctx, web.ID, "/data/note", strings.NewReader("written through n1\n"), nil); err != nil {
		r.fatalf("write a file through n1: %v", err)
	}
	for _, via := range []*fleetNode{a, b} {
		rc, err := via.cl().ReadFile(ctx, web.ID, "/data/note")
		if err != nil {
			r.fatalf("read the file through %s: %v", via.name, err)
		}
		got, _ := io.ReadAll(rc)
		rc.Close()
		if string(got) != "written through n1\n" {
			r.fatalf("the file read through %s: %q", via.name, got)
		}
	}
	if out := r.sh(b, web.ID, "cat /data/note"); out != "written through n1\n" {
		r.fatalf("the file written through n1, seen in n2's sandbox: %q", out)
	}

	// The port proxy of n1.
	token := r.get(a, web.ID).TrafficToken
	deadline := time.Now().Add(15 * time.Second)
	for {
		status, body, err := fleetProxyGet(a.d.proxy, web.ID, token)
		if err == nil && status == 200 && body == "hello from the sandbox\n" {
			break
		}
		if time.Now().After(deadline) {
			r.fatalf("through n1's port proxy: %d %q %v", status, body, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if status, _, err := fleetProxyGet(a.d.proxy, web.ID, "wrong"); err != nil || status != 403 {
		r.fatalf("a wrong token through n1's proxy: %d %v, want 403", status, err)
	}

	// The E2B REST API of n1.
	var info struct {
		SandboxID string
		State     string
		EndAt     time.Time
	}
	if code := e2bCall(t, a.d, "GET", "/sandboxes/"+web.ID, "", &info); code != 200 || info.SandboxID != web.ID || info.State != "running" {
		r.fatalf("E2B GET /sandboxes/%s through n1: %d %+v", web.ID, code, info)
	}
	if code := e2bCall(t, a.d, "POST", "/sandboxes/"+web.ID+"/refreshes", `{"duration":600}`, nil); code != 204 {
		r.fatalf("E2B refreshes through n1: %d", code)
	}
	e2bCall(t, a.d, "GET", "/sandboxes/"+web.ID, "", &info)
	if time.Until(info.EndAt) < 500*time.Second {
		r.fatalf("a refresh of 600 s through n1 left the end at %v", info.EndAt)
	}
	var metrics []struct{ MemUsed *int64 }
	if code := e2bCall(t, a.d, "GET", "/sandboxes/"+web.ID+"/metrics", "", &metrics); code != 200 || len(metrics) == 0 || metrics[0].MemUsed == nil {
		r.fatalf("E2B metrics through n1 (read by n2's runtime): %d %+v", code, metrics)
	}

	// A verb through n1 acts on n2: pause and resume.
	if sb, err := a.cl().Pause(ctx, web.ID, ""); err != nil || sb.State != torpor.StatePaused || sb.Node != "n2" {
		r.fatalf("pause through n1: %+v %v", sb, err)
	}
	if sb, err := a.cl().Start(ctx, web.ID); err != nil || sb.State != torpor.StateRunning || sb.Node != "n2" {
		r.fatalf("start through n1: %+v %v", sb, err)
	}

	// The nodes count what each holds.
	if n := r.nodeOf(a, "n1"); n.Sandboxes[torpor.StateRunning] != 1 {
		r.fatalf("n1 holds %v, want 1 running", n.Sandboxes)
	}
	if n := r.nodeOf(a, "n2"); n.Sandboxes[torpor.StateRunning] != 2 {
		r.fatalf("n2 holds %v, want 2 running", n.Sandboxes)
	}

	// Deleted through n1, each is gone from its node, billed once.
	for _, id := range []string{labelled.ID, first.ID, web.ID} {
		if _, err := a.cl().Delete(ctx, id); err != nil {
			r.fatalf("delete %s through n1: %v", id, err)
		}
		r.checkFleetLedger(a, id)
	}
	r.waitGone(b, web.ID, 10*time.Second)
}

// fleetProxyGet sends GET /index.html for port 8080 of sandbox id to the
// port proxy at addr.
func fleetProxyGet(addr, id, token string) (int, string, error) {
	req, _ := http.NewRequest("GET", "http://"+addr+"/index.html", nil)
	req.Host = "8080-" + id + ".localhost"
	req.Header.Set("X-Torpor-Token", token)
	hc := &http.Client{Timeout: 20 * time.Second}
	resp, err := hc.Do(req)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b), nil
}

// waitGone waits until node n's runtime holds nothing of sandbox id.
func (r *fleetRig) waitGone(n *fleetNode, id string, within time.Duration) {
	r.t.Helper()
	deadline := time.Now().Add(within)
	for {
		if _, err := os.Stat(n.sandboxDirOf(id)); os.IsNotExist(err) {
			return
		}
		if time.Now().After(deadline) {
			r.fatalf("%s still holds %s after %v", n.name, n.sandboxDirOf(id), within)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestFleetNodeKilled: a node killed with SIGKILL is declared down after
// node_down_seconds; its running sandbox is lost (failed, code lost, its
// usage closed at the node's last heartbeat), and its hibernated one,
// whose disk is in the object store, starts on another node with its
// files.
func TestFleetNodeKilled(t *testing.T) {
	r := newFleetRig(t, fleetOptions{Nodes: 3})
	a, b := r.node(1), r.node(2)
	ctx := context.Background()

	hib := r.create(b, torpor.CreateRequest{})
	if hib.Node != "n2" {
		r.fatalf("a create through n2 landed on %q", hib.Node)
	}
	r.sh(b, hib.ID, "mkdir -p /data && echo before the crash > /data/f")
	r.hibernateRemote(b, hib.ID)
	run := r.create(b, torpor.CreateRequest{})
	if run.Node != "n2" {
		r.fatalf("a create through n2 landed on %q", run.Node)
	}
	epoch := r.nodeOf(a, "n2").Epoch
	// Heartbeats after its creation, so that it has usage to close.
	time.Sleep(2 * time.Second)

	killed := time.Now()
	b.kill()
	down := r.waitNode(a, "n2", torpor.NodeDown, time.Duration(r.down)*time.Second+4*time.Second)
	t.Logf("n2 was declared down %v after its kill (node_down_seconds %d)", time.Since(killed).Round(time.Millisecond), r.down)
	if down.Epoch <= epoch {
		r.fatalf("n2 was declared down at epoch %d, it had %d: want a new one", down.Epoch, epoch)
	}

	lost := r.waitSandbox(a, run.ID, "failed (lost)", 10*time.Second, func(sb *torpor.Sandbox) bool {
		return sb.State == torpor.StateFailed && sb.Failure != nil && sb.Failure.Code == torpor.FailureLost
	})
	// Its usage ends at the node's last heartbeat: before the kill (or
	// at a settlement just after it), not when the others noticed.
	if lost.StateSince.After(killed.Add(time.Second)) || lost.StateSince.Before(killed.Add(-2*time.Second)) {
		r.fatalf("the lost sandbox failed at %s; n2 was killed at %s", lost.StateSince, killed)
	}
	// Its failure is its last change (a node that reads it may claim it
	// since: a lost sandbox is any live node's to delete).
	evs := sandboxEvents(t, a.cl(), run.ID)
	i := slices.IndexFunc(evs, func(e torpor.Event) bool { return e.Type == torpor.EventFailed })
	if i < 0 || evs[i].Attrs["code"] != torpor.FailureLost || !evs[i].Time.Equal(lost.StateSince) {
		r.fatalf("the lost sandbox's events: %v; want sandbox.failed, code lost, at %s", evs, lost.StateSince)
	}
	for _, e := range evs[i+1:] {
		if e.Type != torpor.EventClaimed {
			r.fatalf("the lost sandbox changed after its failure: %v", eventTypes(evs))
		}
	}
	r.checkFleetLedger(a, run.ID)

	released := r.waitSandbox(a, hib.ID, "released", 10*time.Second, func(sb *torpor.Sandbox) bool { return sb.Node == "" })
	if released.State != torpor.StateHibernated || released.Durability != torpor.DurabilityRemote {
		r.fatalf("the released sandbox: %s durability %s", released.State, released.Durability)
	}
	sb, err := a.cl().Start(ctx, hib.ID)
	if err != nil {
		r.fatalf("start the released sandbox through n1: %v", err)
	}
	if sb.State != torpor.StateRunning || (sb.Node != "n1" && sb.Node != "n3") {
		r.fatalf("the released sandbox started: %s on %q", sb.State, sb.Node)
	}
	if out := r.sh(a, hib.ID, "cat /data/f"); out != "before the crash\n" {
		r.fatalf("the file written before hibernation, after the move to %s: %q", sb.Node, out)
	}
	evs = sandboxEvents(t, a.cl(), hib.ID)
	i = slices.IndexFunc(evs, func(e torpor.Event) bool { return e.Type == torpor.EventReleased })
	if i < 0 || evs[i].Attrs["cause"] != "node_down" {
		r.fatalf("no sandbox.released (cause node_down) among %v", eventTypes(evs))
	}
	if after := evs[i+1:]; countEvents(after, torpor.EventClaimed) != 1 || countEvents(after, torpor.EventStarted) != 1 {
		r.fatalf("after its release: %v, want one claimed and one started", eventTypes(after))
	}
	r.checkFleetLedger(a, hib.ID)
}

// TestFleetNodeRestartBeforeDown: a node killed and restarted before the
// others would declare it down keeps its epoch and its running sandboxes,
// the same processes in them.
func TestFleetNodeRestartBeforeDown(t *testing.T) {
	r := newFleetRig(t, fleetOptions{Nodes: 2, DownSeconds: 30})
	a, b := r.node(1), r.node(2)
	run := r.create(b, torpor.CreateRequest{})
	pid := strings.TrimSpace(r.sh(b, run.ID, "nohup sleep 1000 >/dev/null 2>&1 & echo $!"))
	epoch := r.nodeOf(a, "n2").Epoch

	b.kill()
	b.restart()
	if n := r.waitNode(a, "n2", torpor.NodeUp, 10*time.Second); n.Epoch != epoch {
		r.fatalf("n2, restarted before it was declared down, has epoch %d, had %d", n.Epoch, epoch)
	}
	sb := r.get(b, run.ID)
	if sb.State != torpor.StateRunning || sb.Node != "n2" || sb.NodeEpoch != epoch {
		r.fatalf("the running sandbox after n2's restart: %s on %q epoch %d", sb.State, sb.Node, sb.NodeEpoch)
	}
	r.sh(b, run.ID, "kill -0 "+pid)
	// n1 forwards to n2's new address once it has listed the fleet again
	// (a node's address changes with its restart here: port 0).
	deadline := time.Now().Add(time.Duration(r.down)*time.Second/5 + 5*time.Second)
	started := time.Now()
	for {
		res, err := a.cl().Exec(context.Background(), run.ID, client.ExecRequest{Cmd: []string{"kill", "-0", pid}})
		if err == nil && res.ExitCode == 0 {
			break
		}
		if time.Now().After(deadline) {
			r.fatalf("exec through n1 after n2's restart: %+v %v", res, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Logf("n1 reached the restarted n2 %v after its restart", time.Since(started).Round(time.Millisecond))
	evs := sandboxEvents(t, a.cl(), run.ID)
	if countEvents(evs, torpor.EventFailed) > 0 || countEvents(evs, torpor.EventReleased) > 0 {
		r.fatalf("the sandbox of a node restarted in time: %v", eventTypes(evs))
	}
	r.checkFleetLedger(a, run.ID)
}

// TestFleetFencing: a node that hangs (SIGSTOP) past node_down_seconds is
// declared down and its hibernated sandbox moves; when it continues it
// serves nothing of that sandbox from its old copy, says it was declared
// down, destroys its copy and joins again with a new epoch.
func TestFleetFencing(t *testing.T) {
	r := newFleetRig(t, fleetOptions{Nodes: 2})
	a, b := r.node(1), r.node(2)
	ctx := context.Background()

	sb := r.create(b, torpor.CreateRequest{})
	id := sb.ID
	r.sh(b, id, "mkdir -p /data && echo from n2 > /data/f")
	r.hibernateRemote(b, id)
	if _, err := os.Stat(b.sandboxDirOf(id)); err != nil {
		r.fatalf("n2 keeps no copy of its hibernated sandbox: %v", err)
	}
	// A running one, whose container outlives the hang: it is lost.
	run := r.create(b, torpor.CreateRequest{})
	r.sh(b, run.ID, "echo old copy > /root/alive")
	epoch := r.nodeOf(a, "n2").Epoch
	// Heartbeats after its creation, so that it has usage to close.
	time.Sleep(2 * time.Second)

	b.pause()
	r.waitNode(a, "n2", torpor.NodeDown, time.Duration(r.down)*time.Second+4*time.Second)
	r.waitSandbox(a, id, "released", 10*time.Second, func(sb *torpor.Sandbox) bool { return sb.Node == "" })
	r.waitSandbox(a, run.ID, "failed (lost)", 10*time.Second, func(sb *torpor.Sandbox) bool {
		return sb.State == torpor.StateFailed && sb.Failure != nil && sb.Failure.Code == torpor.FailureLost
	})
	moved, err := a.cl().Start(ctx, id)
	if err != nil || moved.State != torpor.StateRunning || moved.Node != "n1" {
		r.fatalf("start through n1 of n2's sandbox while n2 hangs: %+v %v", moved, err)
	}
	if out := r.sh(a, id, "cat /data/f && echo moved > /data/moved"); out != "from n2\n" {
		r.fatalf("the moved sandbox's file: %q", out)
	}
	boots := r.get(a, id).Boots

	b.cont()
	// From its continuation on, what n2 answers for the sandbox is a
	// refusal or the new owner's answer: never its old copy's, which has
	// no /data/moved.
	deadline := time.Now().Add(15 * time.Second)
	refusals, served := 0, 0
	for time.Now().Before(deadline) && served < 3 {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		res, err := b.cl().Exec(rctx, id, client.ExecRequest{Cmd: []string{"sh", "-c", "cat /data/moved"}})
		cancel()
		switch {
		case err != nil && client.IsUnavailable(err):
			refusals++
			time.Sleep(100 * time.Millisecond)
		case err != nil:
			r.fatalf("exec sent to the fenced n2: %v, want a refusal (unavailable) or the new owner's answer", err)
		case res.ExitCode != 0 || res.Stdout != "moved\n":
			r.fatalf("n2 served the sandbox from its old copy: exit %d %q %q", res.ExitCode, res.Stdout, res.Stderr)
		default:
			served++
		}
	}
	if served == 0 {
		r.fatalf("n2 never forwarded the sandbox's exec to n1 in 15 s (%d refusals)", refusals)
	}
	t.Logf("n2 refused %d requests, then forwarded them", refusals)
	// The lost sandbox's container still ran on n2 when it continued:
	// n2 runs nothing in it, whatever it answers.
	for range 3 {
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		res, err := b.cl().Exec(rctx, run.ID, client.ExecRequest{Cmd: []string{"cat", "/root/alive"}})
		cancel()
		if err == nil {
			r.fatalf("n2 ran an exec in the lost sandbox's old container: exit %d %q %q", res.ExitCode, res.Stdout, res.Stderr)
		}
	}

	n := r.waitNode(a, "n2", torpor.NodeUp, 15*time.Second)
	if n.Epoch <= epoch {
		r.fatalf("n2 joined again with epoch %d, it had %d", n.Epoch, epoch)
	}
	logs := b.logs()
	if !strings.Contains(logs, "declared down") || strings.Count(logs, `msg="joined the fleet"`) < 2 {
		r.fatalf("n2's log says nothing of being declared down and joining again:\n%s", logs)
	}
	r.waitGone(b, id, 10*time.Second)
	r.waitGone(b, run.ID, 10*time.Second)
	if out, _ := exec.Command("runc", "--root", filepath.Join(b.dataDir, "runc", "runc"), "list", "-q").Output(); len(strings.TrimSpace(string(out))) > 0 {
		r.fatalf("n2's runc still runs %q after it joined again", out)
	}
	got := r.get(a, id)
	if got.State != torpor.StateRunning || got.Node != "n1" || got.Boots != boots {
		r.fatalf("after n2's return the sandbox is %s on %q with %d boots, want running on n1 with %d", got.State, got.Node, got.Boots, boots)
	}
	if out := r.sh(a, id, "cat /data/moved"); out != "moved\n" {
		r.fatalf("the moved sandbox lost its file: %q", out)
	}
	r.checkFleetLedger(a, id)
	r.checkFleetLedger(a, run.ID)
}

// TestFleetObjectStoreDown: with the object store down a hibernation
// completes, its disk kept on its node (durability node); once the store
// is back the uploader's retry puts the disk there (durability remote).
func TestFleetObjectStoreDown(t *testing.T) {
	r := newFleetRig(t, fleetOptions{Nodes: 2})
	b := r.node(2)
	ctx := context.Background()
	sb := r.create(b, torpor.CreateRequest{})
	r.sh(b, sb.ID, "mkdir -p /data && echo kept > /data/f")

	r.s3.Down()
	hctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	began := time.Now()
	got, err := b.cl().Hibernate(hctx, sb.ID)
	cancel()
	if err != nil || got.State != torpor.StateHibernated || got.Durability != torpor.DurabilityNode {
		r.fatalf("hibernate with the object store down: %+v %v", got, err)
	}
	t.Logf("the hibernation took %v with the object store down", time.Since(began).Round(time.Millisecond))
	time.Sleep(3 * time.Second)
	if got := r.get(b, sb.ID); got.State != torpor.StateHibernated || got.Durability != torpor.DurabilityNode {
		r.fatalf("with the object store down: %s durability %s", got.State, got.Durability)
	}

	r.s3.Up()
	up := time.Now()
	r.waitSandbox(b, sb.ID, "uploaded (durability remote)", 15*time.Second, func(sb *torpor.Sandbox) bool {
		return sb.Durability == torpor.DurabilityRemote
	})
	t.Logf("durability remote %v after the object store came back", time.Since(up).Round(time.Millisecond))
	found := false
	for _, k := range r.s3.Keys(fleetBucket) {
		if strings.Contains(k, sb.ID) && strings.HasSuffix(k, "manifest.json") {
			found = true
		}
	}
	if !found {
		r.fatalf("the object store holds no manifest of %s: %v", sb.ID, r.s3.Keys(fleetBucket))
	}
	if got := r.get(b, sb.ID); got.State != torpor.StateHibernated || got.Node != "n2" {
		r.fatalf("after the upload: %s on %q", got.State, got.Node)
	}
	r.checkFleetLedger(b, sb.ID)
}

// TestFleetObjectStoreCutMidUpload: the object store cuts the upload of a
// hibernated disk in the middle of its body (a few MiB of data, cut after
// 256 KiB) and every retry at its start: the hibernation completes on its
// node (durability node) and nothing half-written stands in for it; once
// the store takes uploads again the retry lands (durability remote), and
// with its node killed the sandbox starts on another node with its file
// whole.
func TestFleetObjectStoreCutMidUpload(t *testing.T) {
	r := newFleetRig(t, fleetOptions{Nodes: 2})
	a, b := r.node(1), r.node(2)
	ctx := context.Background()
	sb := r.create(b, torpor.CreateRequest{})
	sum := r.sh(b, sb.ID, "mkdir -p /data && dd if=/dev/urandom of=/data/big bs=1048576 count=6 2>/dev/null && sync && md5sum /data/big")

	r.s3.CutUploadsAfter(256 << 10)
	puts := r.s3.Requests()["PUT"]
	got, err := b.cl().Hibernate(ctx, sb.ID)
	if err != nil || got.State != torpor.StateHibernated || got.Durability != torpor.DurabilityNode {
		r.fatalf("hibernate with uploads cut: %+v %v", got, err)
	}
	// The uploader tries, is cut, and tries again.
	deadline := time.Now().Add(60 * time.Second)
	for r.s3.Requests()["PUT"] < puts+2 {
		if time.Now().After(deadline) {
			r.fatalf("the uploader did not try twice with uploads cut: %v requests", r.s3.Requests())
		}
		time.Sleep(100 * time.Millisecond)
	}
	if got := r.get(b, sb.ID); got.State != torpor.StateHibernated || got.Durability != torpor.DurabilityNode || got.Node != "n2" {
		r.fatalf("with its uploads cut: %s durability %s on %q, want hibernated, node, on n2", got.State, got.Durability, got.Node)
	}
	for _, k := range r.s3.Keys(fleetBucket) {
		if strings.Contains(k, sb.ID) {
			r.fatalf("a cut upload left %s in the object store", k)
		}
	}

	r.s3.CutUploadsAfter(-1)
	r.waitSandbox(b, sb.ID, "uploaded (durability remote)", 90*time.Second, func(sb *torpor.Sandbox) bool {
		return sb.Durability == torpor.DurabilityRemote
	})

	b.kill()
	r.waitNode(a, "n2", torpor.NodeDown, time.Duration(r.down)*time.Second+10*time.Second)
	r.waitSandbox(a, sb.ID, "released", 15*time.Second, func(sb *torpor.Sandbox) bool { return sb.Node == "" })
	moved, err := a.cl().Start(ctx, sb.ID)
	if err != nil || moved.State != torpor.StateRunning || moved.Node != "n1" {
		r.fatalf("start of the uploaded sandbox through n1 with n2 down: %+v %v", moved, err)
	}
	if got := r.sh(a, sb.ID, "md5sum /data/big"); got != sum {
		r.fatalf("the file after the move to n1: %q, before: %q", got, sum)
	}
	r.checkFleetLedger(a, sb.ID)
}

// TestFleetPostgresRestart: the database restarted, then away for longer
// than node_down_seconds, under three nodes with running and paused
// sandboxes: afterwards every node is up again at the epoch it had and
// every sandbox is as it was, on its node, nothing lost or billed twice.
func TestFleetPostgresRestart(t *testing.T) {
	r := newFleetRig(t, fleetOptions{Nodes: 3})
	// After the daemons' cleanups are registered, so before they run: a
	// failure while the server is down still lets them delete sandboxes.
	t.Cleanup(func() { _ = r.pg.Start() })
	ctx := context.Background()

	type kept struct {
		id    string
		node  string
		state torpor.State
	}
	var sbs []kept
	for _, n := range r.nodes {
		sb := r.create(n, torpor.CreateRequest{})
		r.sh(n, sb.ID, "mkdir -p /data && echo "+n.name+" > /data/f")
		sbs = append(sbs, kept{sb.ID, n.name, torpor.StateRunning})
	}
	paused := r.create(r.node(3), torpor.CreateRequest{})
	if _, err := r.node(3).cl().Pause(ctx, paused.ID, ""); err != nil {
		r.fatalf("pause: %v", err)
	}
	sbs = append(sbs, kept{paused.ID, "n3", torpor.StatePaused})
	epochs := map[string]int64{}
	for _, n := range r.nodes {
		epochs[n.name] = r.nodeOf(r.node(1), n.name).Epoch
	}

	// check waits until every node has heartbeaten since the database
	// came back at back, then checks that none was declared down and
	// every sandbox is as it was.
	check := func(what string, back time.Time) {
		t.Helper()
		for _, n := range r.nodes {
			deadline := time.Now().Add(30 * time.Second)
			for {
				got := r.waitNode(r.node(1), n.name, torpor.NodeUp, 30*time.Second)
				if got.Epoch != epochs[n.name] {
					r.fatalf("after %s, %s has epoch %d, had %d: it was declared down", what, n.name, got.Epoch, epochs[n.name])
				}
				if got.HeartbeatAt.After(back) {
					break
				}
				if time.Now().After(deadline) {
					r.fatalf("after %s, %s's last heartbeat is at %s, the database came back at %s", what, n.name, got.HeartbeatAt, back)
				}
				time.Sleep(100 * time.Millisecond)
			}
		}
		for _, k := range sbs {
			sb := r.waitSandbox(r.node(1), k.id, "settled", 30*time.Second, func(sb *torpor.Sandbox) bool { return !sb.State.Transitional() })
			if sb.State != k.state || sb.Node != k.node {
				r.fatalf("after %s, sandbox %s is %s on %q, was %s on %s (failure %+v)", what, k.id, sb.State, sb.Node, k.state, k.node, sb.Failure)
			}
			if k.state == torpor.StateRunning {
				if out := r.sh(r.node(1), k.id, "cat /data/f"); out != k.node+"\n" {
					r.fatalf("after %s, sandbox %s's file: %q", what, k.id, out)
				}
			}
		}
	}

	began := time.Now()
	if err := r.pg.Stop(); err != nil {
		t.Fatal(err)
	}
	if err := r.pg.Start(); err != nil {
		t.Fatal(err)
	}
	t.Logf("PostgreSQL restarted in %v", time.Since(began).Round(time.Millisecond))
	check("a restart of PostgreSQL", time.Now())

	if err := r.pg.Stop(); err != nil {
		t.Fatal(err)
	}
	time.Sleep(time.Duration(r.down)*time.Second + 2*time.Second)
	if err := r.pg.Start(); err != nil {
		t.Fatal(err)
	}
	check("PostgreSQL away for longer than node_down_seconds", time.Now())

	for _, k := range sbs {
		r.checkFleetLedger(r.node(1), k.id)
	}
}

// TestFleetConcurrentResume: a hibernated sandbox no node holds (its node
// drained) asked to start on two nodes at once starts once: both answer
// running, and its events show one claim and one start.
func TestFleetConcurrentResume(t *testing.T) {
	r := newFleetRig(t, fleetOptions{Nodes: 3})
	ctx := context.Background()
	c := r.node(3)
	sb := r.create(c, torpor.CreateRequest{})
	r.sh(c, sb.ID, "mkdir -p /data && echo resumed once > /data/f")
	r.hibernateRemote(c, sb.ID)
	if _, err := r.node(1).cl().DrainNode(ctx, "n3"); err != nil {
		r.fatalf("drain n3: %v", err)
	}
	r.waitSandbox(r.node(1), sb.ID, "released", 20*time.Second, func(sb *torpor.Sandbox) bool {
		return sb.Node == "" && sb.State == torpor.StateHibernated
	})
	// Nothing reads it through a route now: a GET, or its events, would
	// have the node that answers take it before the starts.

	var wg sync.WaitGroup
	results := make([]*torpor.Sandbox, 2)
	errs := make([]error, 2)
	gate := make(chan struct{})
	for i, n := range []*fleetNode{r.node(1), r.node(2)} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			cl := n.cl()
			<-gate
			sctx, cancel := context.WithTimeout(ctx, 60*time.Second)
			defer cancel()
			results[i], errs[i] = cl.Start(sctx, sb.ID)
		}()
	}
	close(gate)
	wg.Wait()
	for i, name := range []string{"n1", "n2"} {
		if errs[i] != nil || results[i].State != torpor.StateRunning {
			r.fatalf("start through %s, at once with the other: %v (state %v)", name, errs[i], stateOf(results[i]))
		}
	}
	owner := r.get(r.node(1), sb.ID).Node
	if owner != "n1" && owner != "n2" {
		r.fatalf("the sandbox started on %q", owner)
	}
	evs := sandboxEvents(t, r.node(1).cl(), sb.ID)
	rel := slices.IndexFunc(evs, func(e torpor.Event) bool { return e.Type == torpor.EventReleased })
	if rel < 0 {
		r.fatalf("the drained sandbox's events: %v, want a sandbox.released", eventTypes(evs))
	}
	if after := evs[rel+1:]; countEvents(after, torpor.EventClaimed) != 1 || countEvents(after, torpor.EventStarted) != 1 {
		r.fatalf("after two starts at once: %v, want one claimed and one started", eventTypes(after))
	}
	if out := r.sh(r.node(1), sb.ID, "cat /data/f"); out != "resumed once\n" {
		r.fatalf("the file after the start on %s: %q", owner, out)
	}
	r.checkFleetLedger(r.node(1), sb.ID)
}

// TestFleetDrain: `torpor nodes drain` empties a node: its running sandbox
// runs on another node with its files, its paused and hibernated ones are
// hibernated with their disks in the object store, released for any node.
func TestFleetDrain(t *testing.T) {
	r := newFleetRig(t, fleetOptions{Nodes: 3})
	a, b := r.node(1), r.node(2)
	ctx := context.Background()
	ids := map[string]string{}
	for _, what := range []string{"running", "paused", "hibernated"} {
		sb := r.create(b, torpor.CreateRequest{Metadata: map[string]string{"was": what}})
		r.sh(b, sb.ID, "mkdir -p /data && echo "+what+" > /data/f")
		ids[what] = sb.ID
	}
	if _, err := b.cl().Pause(ctx, ids["paused"], ""); err != nil {
		r.fatalf("pause: %v", err)
	}
	if _, err := b.cl().Hibernate(ctx, ids["hibernated"]); err != nil {
		r.fatalf("hibernate: %v", err)
	}

	out, errs, code := r.cli(a, 90*time.Second, "nodes", "drain", "n2")
	if code != 0 {
		r.fatalf("torpor nodes drain n2: exit %d\n%s%s", code, out, errs)
	}
	n := r.nodeOf(a, "n2")
	if n.Held() != 0 || n.State != torpor.NodeDraining {
		r.fatalf("after the drain n2 is %s and holds %v", n.State, n.Sandboxes)
	}

	run := r.waitSandbox(a, ids["running"], "running on another node", 30*time.Second, func(sb *torpor.Sandbox) bool {
		return sb.State == torpor.StateRunning && sb.Node != "" && sb.Node != "n2"
	})
	if got := r.sh(a, run.ID, "cat /data/f"); got != "running\n" {
		r.fatalf("the moved running sandbox's file on %s: %q", run.Node, got)
	}
	for _, what := range []string{"paused", "hibernated"} {
		sb, err := r.peek(a, ids[what])
		if err != nil {
			r.fatalf("%v", err)
		}
		if sb.State != torpor.StateHibernated || sb.Durability != torpor.DurabilityRemote || sb.Node != "" {
			r.fatalf("the %s sandbox after the drain: %s durability %s node %q, want hibernated, remote, released",
				what, sb.State, sb.Durability, sb.Node)
		}
	}
	for _, id := range ids {
		r.waitGone(b, id, 10*time.Second)
		r.checkFleetLedger(a, id)
	}
	// A sandbox the drain released starts anywhere, with its files.
	sb, err := a.cl().Start(ctx, ids["paused"])
	if err != nil || sb.State != torpor.StateRunning || sb.Node == "n2" {
		r.fatalf("start of the drained paused sandbox through n1: %+v %v", sb, err)
	}
	if got := r.sh(a, sb.ID, "cat /data/f"); got != "paused\n" {
		r.fatalf("the drained paused sandbox's file on %s: %q", sb.Node, got)
	}
	r.checkFleetLedger(a, sb.ID)
}

// cli runs the torpor CLI against node via with its admin key, for at
// most within, and returns stdout, stderr and the exit code.
func (r *fleetRig) cli(via *fleetNode, within time.Duration, args ...string) (string, string, int) {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	cmd := exec.CommandContext(ctx, r.bin, args...)
	cmd.Env = append(os.Environ(), "TORPOR_URL=http://"+via.d.addr, "TORPOR_API_KEY="+via.d.key)
	var out, errb strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	if ctx.Err() != nil {
		r.fatalf("torpor %s: no end in %v\n%s%s", strings.Join(args, " "), within, out.String(), errb.String())
	}
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		r.t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

// stateOf is sb's state, "" for none.
func stateOf(sb *torpor.Sandbox) torpor.State {
	if sb == nil {
		return ""
	}
	return sb.State
}

// TestFleetGPUPlacement: a node with a (simulated) GPU host says its GPUs;
// a create that asks for a GPU lease through a node without GPUs lands on
// the one with them, whose heartbeat then shows the slice held; another
// slice that does not fit in what is left is a capacity conflict, and
// `torpor nodes` shows each node's GPUs.
func TestFleetGPUPlacement(t *testing.T) {
	r := newFleetRig(t, fleetOptions{Nodes: 2, Args: map[int][]string{2: {"--gpu-sim"}}})
	a := r.node(1)
	ctx := context.Background()
	if g := r.nodeOf(a, "n2").GPUs; g.Count != 1 || g.Model == "" || g.VRAMMiB <= 16384 {
		r.fatalf("n2, on a simulated GPU host, lists GPUs %+v", g)
	}
	if g := r.nodeOf(a, "n1").GPUs; g.Count != 0 {
		r.fatalf("n1, without a GPU host, lists GPUs %+v", g)
	}
	slice := int64(16384)
	sb := r.create(a, torpor.CreateRequest{Accel: &torpor.AccelRequest{VRAMMiB: slice}})
	if sb.Node != "n2" || sb.State != torpor.StateRunning {
		r.fatalf("a GPU create through n1 is %s on %q, want running on n2", sb.State, sb.Node)
	}
	deadline := time.Now().Add(time.Duration(r.down)*time.Second + 5*time.Second)
	for r.nodeOf(a, "n2").GPUs.UsedVRAMMiB != slice {
		if time.Now().After(deadline) {
			r.fatalf("n2's heartbeat never showed its slice held: %+v", r.nodeOf(a, "n2").GPUs)
		}
		time.Sleep(100 * time.Millisecond)
	}
	r.settle()
	_, err := a.cl().Create(ctx, torpor.CreateRequest{Template: "base", Accel: &torpor.AccelRequest{VRAMMiB: slice}})
	if !torpor.IsCode(err, torpor.EConflict) {
		r.fatalf("a second %d MiB slice with n2's VRAM taken: %v, want a capacity conflict", slice, err)
	}
	out, errs, code := r.cli(a, 30*time.Second, "nodes")
	if code != 0 || !strings.Contains(out, "GPUS") || !strings.Contains(out, "(16384/") {
		r.fatalf("torpor nodes (exit %d):\n%s%s", code, out, errs)
	}
}
