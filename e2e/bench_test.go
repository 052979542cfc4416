package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/client"
)

// The benchmarks compare torpor with the bare mechanism it stands on, in the
// same run: BENCHMARKS.md has the figures and the command. Each reports the
// median and the 99th percentile of its iterations (run with -benchtime=Nx).

// latencies collects per-iteration durations and reports percentiles.
type latencies []time.Duration

func (l latencies) report(b *testing.B, prefix string) {
	if len(l) == 0 {
		return
	}
	b.ReportMetric(l.pct(0.5), prefix+"p50-ms")
	b.ReportMetric(l.pct(0.99), prefix+"p99-ms")
}

// pct is the p-th quantile (0 to 1) of l, in milliseconds.
func (l latencies) pct(p float64) float64 {
	s := append(latencies(nil), l...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return float64(s[int(p*float64(len(s)-1))].Microseconds()) / 1000
}

func benchDaemon(b *testing.B) (*daemon, *client.Client) {
	b.Helper()
	needsB(b)
	d := startDaemon(b, torporBin(b), b.TempDir())
	return d, d.client(b)
}

func needsB(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("needs root (runc containers)")
	}
	if _, err := exec.LookPath("runc"); err != nil {
		b.Skip("needs runc (apt-get install runc)")
	}
}

// BenchmarkCreate: create-to-running of a base sandbox through the API,
// on a daemon with the sandbox network and on one without, against `runc
// run -d` of the bundle torpor writes, with the same network made by ip
// and nft commands and without one (create_baseline_test.go). The four
// take turns, iteration by iteration, so that the load of a noisy machine
// falls on all alike; each reports its p50 and p99, and the ratios are
// torpor's over its baseline's. The daemons' debug lines break torpor's
// creates down by step (logged; BENCHMARKS.md, "Create breakdown").
func BenchmarkCreate(b *testing.B) {
	needsB(b)
	for _, tool := range []string{"ip", "nft"} {
		if _, err := exec.LookPath(tool); err != nil {
			b.Skipf("needs %s for the network baseline (apt-get install iproute2 nftables)", tool)
		}
	}
	netd := startDaemon(b, torporBin(b), b.TempDir())
	plainDir := b.TempDir()
	if err := os.WriteFile(filepath.Join(plainDir, "torpor.toml"), []byte("network_bridge = \"\"\n"), 0o600); err != nil {
		b.Fatal(err)
	}
	plaind := startDaemon(b, torporBin(b), plainDir)
	rb := newRuncBaseline(b, plaind)
	rb.withNetwork()
	ctx := context.Background()
	type variant struct {
		name string
		run  func() time.Duration
		lat  latencies
	}
	create := func(d *daemon, ids map[string]bool) func() time.Duration {
		cl := d.client(b)
		return func() time.Duration {
			start := time.Now()
			sb, err := cl.Create(ctx, torpor.CreateRequest{Template: "base"})
			took := time.Since(start)
			if err != nil || sb.State != torpor.StateRunning {
				b.Fatalf("create: %v %v", sb, err)
			}
			ids[sb.ID] = true
			if _, err := cl.Delete(ctx, sb.ID); err != nil {
				b.Fatal(err)
			}
			return took
		}
	}
	netIDs, plainIDs := map[string]bool{}, map[string]bool{}
	vs := []*variant{
		{name: "torpor-net-", run: create(netd, netIDs)},
		{name: "runc-net-", run: func() time.Duration { return rb.run(true) }},
		{name: "torpor-", run: create(plaind, plainIDs)},
		{name: "runc-", run: func() time.Duration { return rb.run(false) }},
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		for j := range vs {
			v := vs[(i+j)%len(vs)]
			v.lat = append(v.lat, v.run())
		}
	}
	b.StopTimer()
	for _, v := range vs {
		v.lat.report(b, v.name)
	}
	ratio := func(a, base latencies, p float64) float64 { return a.pct(p) / base.pct(p) }
	b.ReportMetric(ratio(vs[0].lat, vs[1].lat, 0.5), "net-p50-x")
	b.ReportMetric(ratio(vs[0].lat, vs[1].lat, 0.99), "net-p99-x")
	b.ReportMetric(ratio(vs[2].lat, vs[3].lat, 0.5), "nonet-p50-x")
	b.ReportMetric(ratio(vs[2].lat, vs[3].lat, 0.99), "nonet-p99-x")
	if b.N >= 10 {
		printBreakdown("torpor with the sandbox network", createSteps(netd.logs.String(), netIDs))
		printBreakdown("torpor without a network", createSteps(plaind.logs.String(), plainIDs))
	}
}

// freezerState finds a sandbox's freezer state file (cgroup v1) or
// cgroup.freeze (v2).
func freezerFile(b *testing.B, id string) (path string, v2 bool) {
	for _, pattern := range []string{"/sys/fs/cgroup/freezer/*/" + id, "/sys/fs/cgroup/freezer/*/*/" + id} {
		if m, _ := filepath.Glob(pattern + "/freezer.state"); len(m) == 1 {
			return m[0], false
		}
	}
	for _, pattern := range []string{"/sys/fs/cgroup/*/" + id, "/sys/fs/cgroup/*/*/" + id} {
		if m, _ := filepath.Glob(pattern + "/cgroup.freeze"); len(m) == 1 {
			return m[0], true
		}
	}
	b.Fatalf("no freezer for %s", id)
	return "", false
}

// BenchmarkPauseResume: one pause and one resume through the API vs. a
// direct write to the freezer's state file (waiting until it reads FROZEN).
func BenchmarkPauseResume(b *testing.B) {
	b.Run("torpor", func(b *testing.B) {
		_, cl := benchDaemon(b)
		ctx := context.Background()
		sb, err := cl.Create(ctx, torpor.CreateRequest{Template: "base"})
		if err != nil {
			b.Fatal(err)
		}
		var pause, resume latencies
		for i := 0; i < b.N; i++ {
			t0 := time.Now()
			if _, err := cl.Pause(ctx, sb.ID, ""); err != nil {
				b.Fatal(err)
			}
			t1 := time.Now()
			if _, err := cl.Start(ctx, sb.ID); err != nil {
				b.Fatal(err)
			}
			pause, resume = append(pause, t1.Sub(t0)), append(resume, time.Since(t1))
		}
		pause.report(b, "pause-")
		resume.report(b, "resume-")
	})
	b.Run("freezer-write", func(b *testing.B) {
		_, cl := benchDaemon(b)
		ctx := context.Background()
		sb, err := cl.Create(ctx, torpor.CreateRequest{Template: "base"})
		if err != nil {
			b.Fatal(err)
		}
		path, v2 := freezerFile(b, sb.ID)
		freeze, thaw, want := "FROZEN", "THAWED", "FROZEN"
		if v2 {
			freeze, thaw, want = "1", "0", "1"
		}
		var pause, resume latencies
		for i := 0; i < b.N; i++ {
			t0 := time.Now()
			os.WriteFile(path, []byte(freeze), 0)
			for {
				data, _ := os.ReadFile(path)
				if strings.TrimSpace(string(data)) == want {
					break
				}
			}
			t1 := time.Now()
			os.WriteFile(path, []byte(thaw), 0)
			pause, resume = append(pause, t1.Sub(t0)), append(resume, time.Since(t1))
		}
		pause.report(b, "pause-")
		resume.report(b, "resume-")
	})
}

// BenchmarkExec: `true` through the API vs. a bare `runc exec`.
func BenchmarkExec(b *testing.B) {
	d, cl := benchDaemon(b)
	ctx := context.Background()
	sb, err := cl.Create(ctx, torpor.CreateRequest{Template: "base"})
	if err != nil {
		b.Fatal(err)
	}
	b.Run("torpor", func(b *testing.B) {
		var lat latencies
		for i := 0; i < b.N; i++ {
			t0 := time.Now()
			res, err := cl.Exec(ctx, sb.ID, client.ExecRequest{Cmd: []string{"true"}})
			lat = append(lat, time.Since(t0))
			if err != nil || res.ExitCode != 0 {
				b.Fatal(res, err)
			}
		}
		lat.report(b, "")
	})
	b.Run("runc-exec", func(b *testing.B) {
		root := filepath.Join(d.dataDir, "runc", "runc")
		var lat latencies
		for i := 0; i < b.N; i++ {
			t0 := time.Now()
			if out, err := exec.Command("runc", "--root", root, "exec", sb.ID, "true").CombinedOutput(); err != nil {
				b.Fatalf("runc exec: %v %s", err, out)
			}
			lat = append(lat, time.Since(t0))
		}
		lat.report(b, "")
	})
}

// BenchmarkIdleMemory: the daemon's resident memory per idle running
// sandbox, with 200 of them (b.N is ignored beyond the first round).
func BenchmarkIdleMemory(b *testing.B) {
	const n = 200
	d, cl := benchDaemon(b)
	ctx := context.Background()
	rss := func() float64 {
		data, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", d.cmd.Process.Pid))
		for _, line := range strings.Split(string(data), "\n") {
			if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
				kb, _ := strconv.ParseFloat(f[1], 64)
				return kb / 1024
			}
		}
		return 0
	}
	// Warm up the daemon's paths with one sandbox before the baseline.
	warm, err := cl.Create(ctx, torpor.CreateRequest{Template: "base", Resources: &torpor.Resources{VCPUs: 0.02, MemoryMiB: 64}})
	if err != nil {
		b.Fatal(err)
	}
	cl.Delete(ctx, warm.ID)
	time.Sleep(500 * time.Millisecond)
	before := rss()
	var ids []string
	for i := 0; i < n; i++ {
		sb, err := cl.Create(ctx, torpor.CreateRequest{Template: "base", Resources: &torpor.Resources{VCPUs: 0.02, MemoryMiB: 64}})
		if err != nil {
			b.Fatal(err)
		}
		ids = append(ids, sb.ID)
	}
	time.Sleep(2 * time.Second)
	after := rss()
	b.ReportMetric(before, "rss-before-MiB")
	b.ReportMetric(after, "rss-after-MiB")
	b.ReportMetric((after-before)/n, "MiB/sandbox")
	for _, id := range ids {
		cl.Delete(ctx, id)
	}
}
