package e2e

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/client"
	"github.com/torpor-dev/torpor/store/postgres"
)

// The fleet's benchmarks (BENCHMARKS.md, "Fleet"): what a second node in
// the path costs, what a resume that has to fetch its disk from the
// object store costs, and where a burst of creates sent to one node goes.
// Each measures against a baseline in the same run and prints its table
// with t.Logf. They run real fleets (fleet_harness_test.go) and take
// minutes, so they run only with TORPOR_FLEET_BENCH=1:
//
//	TORPOR_FLEET_BENCH=1 go test ./e2e -run TestFleetBench -v -timeout 30m

// fleetBench skips unless the fleet benchmarks were asked for.
func fleetBench(t *testing.T) {
	t.Helper()
	if os.Getenv("TORPOR_FLEET_BENCH") != "1" {
		t.Skip("set TORPOR_FLEET_BENCH=1 to run the fleet benchmarks (they start fleets of real nodes; the placement one creates 1,000 sandboxes)")
	}
}

// benchDownSeconds is node_down_seconds of the benchmarks' fleets: the
// default of `torpor serve`, not the harness's 3, so that a node slowed by
// the benchmark's own load is never declared down in the middle of it.
const benchDownSeconds = 10

// fleetHTTP is an HTTP client of its own, with its own keep-alive pool
// (room for conns idle connections to each address), so that the two
// sides of a comparison never share or steal connections.
func fleetHTTP(conns int) *http.Client {
	return &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{
		MaxIdleConns: 4 * conns, MaxIdleConnsPerHost: conns, IdleConnTimeout: 90 * time.Second, DisableCompression: true}}
}

// fleetClient is an API client of address addr with key and its own
// connection pool; it does not retry.
func fleetClient(t *testing.T, addr, key string, conns int) *client.Client {
	t.Helper()
	cl, err := client.New("http://"+addr, key)
	if err != nil {
		t.Fatal(err)
	}
	return cl.WithHTTPClient(fleetHTTP(conns)).WithRetry(client.RetryPolicy{Attempts: 1})
}

// loopbackPinger is a raw TCP ping-pong over loopback: one byte there and
// back on a kept connection, the floor of any request between two
// processes of this machine.
type loopbackPinger struct {
	conn net.Conn
	buf  [1]byte
}

func newLoopbackPinger(t *testing.T) *loopbackPinger {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return &loopbackPinger{conn: c}
}

func (p *loopbackPinger) ping(t *testing.T) time.Duration {
	t0 := time.Now()
	if _, err := p.conn.Write(p.buf[:]); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(p.conn, p.buf[:]); err != nil {
		t.Fatal(err)
	}
	return time.Since(t0)
}

// TestFleetBenchForwarding: a request that reaches a node that does not
// own its sandbox, which forwards it to the owner, against the same
// request sent to the owner itself: GET /v1/sandboxes/{id}, an exec of
// `true` and a GET through the port proxy to a server in the sandbox. The
// goal (docs/fleet.md): through another node at most 1.2× the owner's time
// plus one network round trip between the nodes; here the nodes share
// loopback, whose round trip a raw TCP ping-pong measures in the same loop.
//
// Two more figures, in the same loop, say where the extra goes: the same
// request through a bare reverse proxy in the test process
// (httputil.ReverseProxy, kept connections) in front of the owner — what
// one more HTTP hop costs without any work of the front's — and the two
// store reads a front makes before it forwards (the key by its hash, the
// sandbox's record to find its owner), made from the test process on the
// fleet's PostgreSQL. The sides take turns in a rotating order.
func TestFleetBenchForwarding(t *testing.T) {
	fleetBench(t)
	r := newFleetRig(t, fleetOptions{Nodes: 2, DownSeconds: benchDownSeconds})
	front, owner := r.node(1), r.node(2)
	ctx := context.Background()
	sb := r.create(owner, torpor.CreateRequest{Resources: &torpor.Resources{MemoryMiB: 64}})
	if sb.Node != owner.name {
		r.fatalf("a create through %s landed on %q", owner.name, sb.Node)
	}
	startServer(t, owner.d, sb.ID, ":8080")
	token := r.get(owner, sb.ID).TrafficToken

	// The bare hop: one reverse proxy for the API, one for the port
	// proxy, each to the owner, the Host header kept (the port proxy
	// routes by it).
	bare := func(to string) string {
		target := &url.URL{Scheme: "http", Host: to}
		rp := &httputil.ReverseProxy{
			Rewrite:       func(pr *httputil.ProxyRequest) { pr.SetURL(target); pr.Out.Host = pr.In.Host },
			Transport:     fleetHTTP(4).Transport,
			FlushInterval: -1,
		}
		srv := httptest.NewServer(rp)
		t.Cleanup(srv.Close)
		return srv.Listener.Addr().String()
	}
	bareAPI, bareProxy := bare(owner.d.addr), bare(owner.d.proxy)

	// One admin key for every side (every node's admin key is valid on
	// all), so that each checks the same key.
	key := front.d.key
	type side struct {
		name  string
		api   *client.Client
		proxy *http.Client
		addr  string // the port proxy's
	}
	sides := []side{
		{"owner " + owner.name, fleetClient(t, owner.d.addr, key, 2), fleetHTTP(2), owner.d.proxy},
		{"via " + front.name, fleetClient(t, front.d.addr, key, 2), fleetHTTP(2), front.d.proxy},
		{"bare proxy", fleetClient(t, bareAPI, key, 2), fleetHTTP(2), bareProxy},
	}
	proxyGet := func(s side) error {
		req, _ := http.NewRequest("GET", "http://"+s.addr+"/", nil)
		req.Host = "8080-" + sb.ID + ".localhost"
		req.Header.Set("X-Torpor-Token", token)
		resp, err := s.proxy.Do(req)
		if err != nil {
			return err
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 || string(body) != "ok" {
			return fmt.Errorf("GET through %s's port proxy: %d %q %v", s.name, resp.StatusCode, body, err)
		}
		return nil
	}
	type op struct {
		name string
		do   func(s side) error
	}
	ops := []op{
		{"GET /v1/sandboxes/{id}", func(s side) error {
			got, err := s.api.Get(ctx, sb.ID)
			if err == nil && got.ID != sb.ID {
				err = fmt.Errorf("GET answered %s", got.ID)
			}
			return err
		}},
		{"POST /v1/sandboxes/{id}/exec `true`", func(s side) error {
			res, err := s.api.Exec(ctx, sb.ID, client.ExecRequest{Cmd: []string{"true"}})
			if err == nil && res.ExitCode != 0 {
				err = fmt.Errorf("exec true: exit %d", res.ExitCode)
			}
			return err
		}},
		{"GET / through the port proxy", proxyGet},
	}
	pinger := newLoopbackPinger(t)
	st, err := postgres.Open(ctx, postgres.Options{URL: r.db, KeyDir: front.dataDir, MaxConns: 2})
	if err != nil {
		t.Fatalf("open the fleet's database: %v", err)
	}
	defer st.Close()
	hash := torpor.HashKey(key)

	n := envInt("TORPOR_FLEET_BENCH_ITER", 300)
	const warm = 20
	lat := make([][]latencies, len(ops))
	for k := range lat {
		lat[k] = make([]latencies, len(sides))
	}
	var rtt, keyRead, sbRead latencies
	for i := -warm; i < n; i++ {
		for k, o := range ops {
			for j := range sides {
				s := (i + j) % len(sides)
				if i < 0 {
					s = j
				}
				t0 := time.Now()
				if err := o.do(sides[s]); err != nil {
					r.fatalf("%s through %s: %v", o.name, sides[s].name, err)
				}
				if i >= 0 {
					lat[k][s] = append(lat[k][s], time.Since(t0))
				}
			}
		}
		d := pinger.ping(t)
		t0 := time.Now()
		if _, err := st.APIKeyByHash(ctx, hash); err != nil {
			t.Fatal(err)
		}
		t1 := time.Now()
		if _, err := st.GetSandbox(ctx, sb.ID); err != nil {
			t.Fatal(err)
		}
		if i >= 0 {
			rtt, keyRead, sbRead = append(rtt, d), append(keyRead, t1.Sub(t0)), append(sbRead, time.Since(t1))
		}
	}

	rttP50 := rtt.pct(0.5)
	var b strings.Builder
	fmt.Fprintf(&b, "forwarding through a node that does not own the sandbox (%d rounds, sides in turn; loopback TCP round trip p50 %.3f ms, p99 %.3f ms;\n", n, rttP50, rtt.pct(0.99))
	fmt.Fprintf(&b, "the front's store reads from the test process, p50 / p99: the key %.3f / %.3f ms, the sandbox %.3f / %.3f ms):\n",
		keyRead.pct(0.5), keyRead.pct(0.99), sbRead.pct(0.5), sbRead.pct(0.99))
	fmt.Fprintf(&b, "%-36s | %-18s | %-18s | %-15s | %-17s | %-11s | %-7s | %s\n", "what", "owner p50 / p99", "via "+front.name+" p50 / p99",
		"ratio p50 / p99", "extra p50 / p99", "bound (p50)", "goal", "bare proxy: p50, extra, ratio")
	for k, o := range ops {
		ow, via, bp := lat[k][0], lat[k][1], lat[k][2]
		bound := 1.2*ow.pct(0.5) + rttP50
		met := "met"
		if via.pct(0.5) > bound {
			met = "not met"
		}
		fmt.Fprintf(&b, "%-36s | %7.3f / %7.3f ms | %7.3f / %7.3f ms | %5.2f× / %5.2f× | %+.3f / %+.3f ms | %8.3f ms | %-7s | %.3f ms, %+.3f ms, %.2f×\n", o.name,
			ow.pct(0.5), ow.pct(0.99), via.pct(0.5), via.pct(0.99),
			via.pct(0.5)/ow.pct(0.5), via.pct(0.99)/ow.pct(0.99),
			via.pct(0.5)-ow.pct(0.5), via.pct(0.99)-ow.pct(0.99), bound, met,
			bp.pct(0.5), bp.pct(0.5)-ow.pct(0.5), bp.pct(0.5)/ow.pct(0.5))
	}
	fmt.Fprintf(&b, "(bound: 1.2 × the owner's p50 + one loopback round trip; on a LAN the hop's round trip is the LAN's, and the extra must stay within 0.2 × the owner's time + that round trip)")
	t.Log(b.String())
}

// downloadedRe matches a node's log line for a disk it fetched from the
// object store (lifecycle.Engine.fetchDisk).
var downloadedRe = regexp.MustCompile(`msg="fleet: disk downloaded" sandbox=(\S+) bytes=(\d+) took=(\S+)`)

// TestFleetBenchResume: POST /v1/sandboxes/{id}/start of a hibernated
// sandbox on its own node, whose disk is there (the baseline), against the
// start through another node of a hibernated sandbox that no node holds
// (its node was drained), whose disk that node downloads from the object
// store first. Each sandbox has TORPOR_FLEET_BENCH_DATA_MIB (20) MiB of
// random data on its disk, which no compression shrinks; the two kinds
// take turns, TORPOR_FLEET_BENCH_RESUMES (10) of each.
func TestFleetBenchResume(t *testing.T) {
	fleetBench(t)
	r := newFleetRig(t, fleetOptions{Nodes: 2, DownSeconds: benchDownSeconds})
	a, b := r.node(1), r.node(2)
	ctx := context.Background()
	k := envInt("TORPOR_FLEET_BENCH_RESUMES", 10)
	mib := envInt("TORPOR_FLEET_BENCH_DATA_MIB", 20)

	// prepare makes a sandbox on n with the data on its disk, hibernated
	// with its disk uploaded (so that the local ones' upload is not under
	// way while they start).
	prepare := func(n *fleetNode) string {
		sb := r.create(n, torpor.CreateRequest{Resources: &torpor.Resources{MemoryMiB: 64}})
		if sb.Node != n.name {
			r.fatalf("a create through %s landed on %q", n.name, sb.Node)
		}
		r.sh(n, sb.ID, fmt.Sprintf("mkdir -p /data && dd if=/dev/urandom of=/data/blob bs=1048576 count=%d 2>/dev/null && sync", mib))
		r.hibernateRemote(n, sb.ID)
		return sb.ID
	}
	local, remote := make([]string, k), make([]string, k)
	for i := range k {
		local[i], remote[i] = prepare(a), prepare(b)
	}
	drained := time.Now()
	if _, err := a.cl().DrainNode(ctx, b.name); err != nil {
		r.fatalf("drain %s: %v", b.name, err)
	}
	for _, id := range remote {
		r.waitSandbox(a, id, "released with its disk in the object store", 60*time.Second, func(sb *torpor.Sandbox) bool {
			return sb.Node == "" && sb.State == torpor.StateHibernated && sb.Durability == torpor.DurabilityRemote
		})
	}
	t.Logf("the drain of %s released its %d hibernated sandboxes in %v", b.name, k, time.Since(drained).Round(time.Millisecond))
	if _, err := a.cl().UndrainNode(ctx, b.name); err != nil {
		r.fatalf("undrain %s: %v", b.name, err)
	}
	r.waitNode(a, b.name, torpor.NodeUp, 20*time.Second)
	r.settle()

	cl := fleetClient(t, a.d.addr, a.d.key, 2)
	start := func(id string) time.Duration {
		t0 := time.Now()
		sb, err := cl.Start(ctx, id)
		took := time.Since(t0)
		if err != nil || sb.State != torpor.StateRunning || sb.Node != a.name {
			r.fatalf("start %s through %s: %v (state %s, node %q)", id, a.name, err, stateOf(sb), nodeOfSandbox(sb))
		}
		return took
	}
	// check makes sure the data came along, and gives the remote one's
	// uploaded stream's size (the sandbox.uploaded event of the upload the
	// drain found); then both go, so that the node holds one pair at a
	// time (each started sandbox takes a vCPU of its 8).
	want := strconv.Itoa(mib << 20)
	var streamBytes []int64
	check := func(l, rm string) {
		for _, id := range []string{l, rm} {
			if got := strings.TrimSpace(r.sh(a, id, "wc -c < /data/blob")); got != want {
				r.fatalf("sandbox %s's /data/blob after its start has %s bytes, want %s", id, got, want)
			}
		}
		var last int64
		for _, e := range sandboxEvents(t, a.cl(), rm) {
			if e.Type == torpor.EventUploaded {
				last, _ = strconv.ParseInt(e.Attrs["bytes"], 10, 64)
			}
		}
		streamBytes = append(streamBytes, last)
		for _, id := range []string{l, rm} {
			if _, err := a.cl().Delete(ctx, id); err != nil {
				r.fatalf("delete %s: %v", id, err)
			}
		}
		// What a boot and a delete leave to the background (the next
		// spare disk, the removal) is done before the next pair.
		time.Sleep(time.Second)
	}
	var localLat, remoteLat latencies
	// The daemon's debug lines of the starts break them down by step.
	mark := len(a.d.logs.String())
	for i := range k {
		if i%2 == 0 {
			localLat = append(localLat, start(local[i]))
			remoteLat = append(remoteLat, start(remote[i]))
		} else {
			remoteLat = append(remoteLat, start(remote[i]))
			localLat = append(localLat, start(local[i]))
		}
		check(local[i], remote[i])
	}

	// The download's time, from the node's log.
	startLogs := a.d.logs.String()[mark:]
	downloads := map[string]time.Duration{}
	for _, m := range downloadedRe.FindAllStringSubmatch(startLogs, -1) {
		if d, err := time.ParseDuration(m[3]); err == nil {
			downloads[m[1]] = d
		}
	}
	var dl latencies
	for _, id := range remote {
		d, ok := downloads[id]
		if !ok {
			r.fatalf("%s's log has no download of %s's disk", a.name, id)
		}
		dl = append(dl, d)
	}
	sort.Slice(streamBytes, func(i, j int) bool { return streamBytes[i] < streamBytes[j] })
	medBytes := streamBytes[len(streamBytes)/2]

	var sb strings.Builder
	fmt.Fprintf(&sb, "start of a hibernated sandbox through %s (%d of each, taking turns; disk image 64 MiB with %d MiB of random data, uploaded stream %.1f MiB p50):\n", a.name, k, mib, float64(medBytes)/(1<<20))
	fmt.Fprintf(&sb, "%-52s | %-10s | %-10s | %-10s\n", "what", "p50", "p99 (max)", "min")
	row := func(what string, l latencies) {
		fmt.Fprintf(&sb, "%-52s | %7.1f ms | %7.1f ms | %7.1f ms\n", what, l.pct(0.5), l.pct(0.99), l.pct(0))
	}
	row("local: its own node, disk there", localLat)
	row("remote: released, disk downloaded from the store", remoteLat)
	row("  of which the download and import (node's log)", dl)
	fmt.Fprintf(&sb, "ratio remote / local at p50: %.2f× (+%.1f ms; download %.1f ms p50 = %.0f MiB/s of stream)",
		remoteLat.pct(0.5)/localLat.pct(0.5), remoteLat.pct(0.5)-localLat.pct(0.5), dl.pct(0.5), float64(medBytes)/(1<<20)/(dl.pct(0.5)/1000))
	t.Log(sb.String())
	set := func(ids []string) map[string]bool {
		m := map[string]bool{}
		for _, id := range ids {
			m[id] = true
		}
		return m
	}
	printBreakdown("the runtime's boot at the start of a local hibernated sandbox", createSteps(startLogs, set(local)))
	printBreakdown("the runtime's boot at the start of a remote one, after its disk's import", createSteps(startLogs, set(remote)))
}

// nodeOfSandbox is sb's node, "" for none.
func nodeOfSandbox(sb *torpor.Sandbox) string {
	if sb == nil {
		return ""
	}
	return sb.Node
}

// placementRun is what one run of TestFleetBenchPlacement measured on one
// fleet.
type placementRun struct {
	nodes    int
	created  time.Duration // wall time of the creates
	lat      latencies     // each create's
	perNode  map[string]int
	listed   map[string]int // what GET /v1/nodes says each holds after them
	deleted  time.Duration
	retries  atomic.Int64
	firstErr error
}

// TestFleetBenchPlacement: TORPOR_FLEET_BENCH_N (1,000) creates, all sent
// to n1 by TORPOR_FLEET_BENCH_CONC (8) clients at once, on a fleet of
// three nodes: where they land (sandboxes per node) and how many a second
// are made; then the same creates on a fleet of one node, the throughput
// baseline. Every node lends memory for twice the whole burst (64 MiB
// sandboxes), so that placement decides the spread, never fullness, and
// the one node can hold it all. The sandboxes are deleted after each,
// concurrently.
func TestFleetBenchPlacement(t *testing.T) {
	fleetBench(t)
	n := envInt("TORPOR_FLEET_BENCH_N", 1000)
	conc := envInt("TORPOR_FLEET_BENCH_CONC", 8)
	const memMiB, diskMiB = 64, 64
	// A /20 of its own for each node (the harness gives a /24, 253
	// addresses): later flags win, so these replace the harness's.
	var tag [1]byte
	rand.Read(tag[:])
	second := 232 + int(tag[0])%8
	nodeArgs := func(k int) []string {
		return []string{"--network-cidr", fmt.Sprintf("10.%d.%d.0/20", second, 16*k),
			"--capacity-memory-mib", strconv.Itoa(2 * memMiB * n), "--capacity-vcpus", strconv.Itoa(n + 16),
			// The default: the harness's one second writes every open
			// usage interval each second, a load that grows with the
			// sandboxes and is no part of a create.
			"--settle-seconds", "3600"}
	}

	measure := func(t *testing.T, nodes int, first int) *placementRun {
		args := map[int][]string{}
		for k := 1; k <= nodes; k++ {
			args[k] = nodeArgs(first + k - 1)
		}
		r := newFleetRig(t, fleetOptions{Nodes: nodes, DownSeconds: benchDownSeconds, Args: args})
		front := r.node(1)
		res := &placementRun{nodes: nodes, perNode: map[string]int{}, listed: map[string]int{}}
		cl := fleetClient(t, front.d.addr, front.d.key, conc).WithRetry(client.RetryPolicy{Attempts: 6, MaxWait: 5 * time.Second,
			OnRetry: func(error, int, time.Duration) { res.retries.Add(1) }})
		ctx := context.Background()
		// One warm create, so that neither fleet's figure has a first
		// boot's cold caches in it.
		warm := r.create(front, torpor.CreateRequest{Resources: &torpor.Resources{VCPUs: 1, MemoryMiB: memMiB, DiskMiB: diskMiB}})
		if _, err := front.cl().Delete(ctx, warm.ID); err != nil {
			r.fatalf("delete the warm-up sandbox: %v", err)
		}

		ids := make([]string, n)
		lat := make([]time.Duration, n)
		var next atomic.Int64
		var mu sync.Mutex
		var wg sync.WaitGroup
		began := time.Now()
		for range conc {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := int(next.Add(1)) - 1
					if i >= n {
						return
					}
					t0 := time.Now()
					sb, err := cl.Create(ctx, torpor.CreateRequest{Template: "base",
						Resources: &torpor.Resources{VCPUs: 1, MemoryMiB: memMiB, DiskMiB: diskMiB},
						Metadata:  map[string]string{"bench": "placement"}})
					lat[i] = time.Since(t0)
					mu.Lock()
					if err != nil && res.firstErr == nil {
						res.firstErr = fmt.Errorf("create %d: %w", i, err)
					}
					if err == nil {
						ids[i] = sb.ID
						res.perNode[sb.Node]++
					}
					mu.Unlock()
					if err != nil {
						return
					}
				}
			}()
		}
		wg.Wait()
		res.created = time.Since(began)
		res.lat = lat
		if res.firstErr != nil {
			r.fatalf("%v (after %d creates)", res.firstErr, next.Load())
		}
		// What the nodes say they hold, once each has heartbeaten.
		r.settle()
		nodesNow, err := r.listNodes(front)
		if err != nil {
			r.fatalf("GET /v1/nodes: %v", err)
		}
		for _, nd := range nodesNow {
			res.listed[nd.Name] = nd.Held()
		}

		next.Store(0)
		var failed atomic.Value
		began = time.Now()
		for range conc {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for {
					i := int(next.Add(1)) - 1
					if i >= n {
						return
					}
					if _, err := cl.Delete(ctx, ids[i]); err != nil {
						failed.Store(fmt.Errorf("delete %s: %w", ids[i], err))
						return
					}
				}
			}()
		}
		wg.Wait()
		res.deleted = time.Since(began)
		if err, _ := failed.Load().(error); err != nil {
			r.fatalf("%v", err)
		}
		return res
	}

	var runs []*placementRun
	t.Run("3-nodes", func(t *testing.T) { runs = append(runs, measure(t, 3, 1)) })
	t.Run("1-node", func(t *testing.T) { runs = append(runs, measure(t, 1, 4)) })
	if len(runs) != 2 {
		t.Fatal("a fleet's run failed")
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%d creates (64 MiB, 1 vCPU, 64 MiB disk) sent to n1 by %d clients at once; capacity %d MiB per node:\n", n, conc, 2*memMiB*n)
	fmt.Fprintf(&b, "%-9s | %-22s | %-22s | %-16s | %-19s | %-10s | %s\n", "fleet", "sandboxes per node", "GET /v1/nodes after", "creates/s", "create p50 / p99", "deletes/s", "capacity retries")
	for _, run := range runs {
		fmt.Fprintf(&b, "%-9s | %-22s | %-22s | %6.1f (%5.1f s) | %6.1f / %6.1f ms | %10.1f | %d\n", fmt.Sprintf("%d node(s)", run.nodes),
			spread(run.perNode), spread(run.listed), float64(n)/run.created.Seconds(), run.created.Seconds(),
			run.lat.pct(0.5), run.lat.pct(0.99), float64(n)/run.deleted.Seconds(), run.retries.Load())
	}
	fmt.Fprintf(&b, "throughput of the 3-node fleet / the 1-node fleet: %.2f×; create p50 %.2f×",
		runs[1].created.Seconds()/runs[0].created.Seconds(), runs[0].lat.pct(0.5)/runs[1].lat.pct(0.5))
	t.Log(b.String())
}

// spread writes a count per node as n1=…/n2=…, by name.
func spread(m map[string]int) string {
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	sort.Strings(names)
	parts := make([]string, len(names))
	for i, k := range names {
		parts[i] = fmt.Sprintf("%s=%d", k, m[k])
	}
	return strings.Join(parts, " ")
}
