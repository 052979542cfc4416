package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

// BenchmarkProxy: requests per second and p99 latency of a small GET to a
// Go server inside a sandbox (testdata/sandboxsrv), driven by wrk in one
// run: straight to the sandbox's address ("direct", the baseline), through
// torpor's proxy, and through nginx as a reverse proxy to the same
// address. Also: how much longer the first request to a paused sandbox
// takes than a request to a running one.
//
// Needs wrk (and nginx for its row): scripts/bench-proxy.sh installs them.
// The three take turns for TORPOR_BENCH_ROUNDS rounds (default 5) of
// TORPOR_BENCH_SECONDS each (default 4) with TORPOR_BENCH_CONNS
// connections (default 32); medians are reported, and the ratios to
// direct and to nginx are medians of ratios taken within a round.
func BenchmarkProxy(b *testing.B) {
	needsB(b)
	if _, err := exec.LookPath("wrk"); err != nil {
		b.Skip("needs wrk (apt-get install wrk, or scripts/bench-proxy.sh)")
	}
	d := startDaemon(b, torporBin(b), b.TempDir())
	cl := d.client(b)
	ctx := context.Background()
	sb, err := cl.Create(ctx, torpor.CreateRequest{Template: "base", Ports: []torpor.PortSpec{{Port: 8080, Public: true}}})
	if err != nil {
		b.Fatal(err)
	}
	startServer(b, d, sb.ID, ":8080")
	addr := sandboxAddr(b, d, sb.ID)
	secs, conns := envInt("TORPOR_BENCH_SECONDS", 4), envInt("TORPOR_BENCH_CONNS", 32)
	rounds := envInt("TORPOR_BENCH_ROUNDS", 5)

	type target struct {
		name, url, host string
	}
	targets := []target{
		{"direct", "http://" + addr.String() + ":8080/", ""},
		{"proxy", "http://" + d.proxy + "/", "8080-" + sb.ID + ".localhost"},
	}
	if nginxAddr, ok := startNginx(b, addr.String()+":8080"); ok {
		targets = append(targets, target{"nginx", "http://" + nginxAddr + "/", ""})
	}
	// The targets take turns, round after round, so that what else the
	// machine does meanwhile weighs on each alike; each ratio is taken
	// within a round, and the medians are reported.
	type result struct{ rps, p50, p99 float64 }
	results := map[string][]result{}
	for round := 0; round < rounds; round++ {
		for _, tg := range targets {
			args := []string{"-t", "2", "-c", strconv.Itoa(conns), "-d", strconv.Itoa(secs) + "s", "--latency"}
			if tg.host != "" {
				args = append(args, "-H", "Host: "+tg.host)
			}
			args = append(args, tg.url)
			out, err := exec.Command("wrk", args...).CombinedOutput()
			if err != nil {
				b.Fatalf("wrk %s: %v\n%s", strings.Join(args, " "), err, out)
			}
			rps, p50, p99, errs := parseWrk(string(out))
			if rps == 0 || errs != "" {
				b.Fatalf("wrk %s:\n%s", strings.Join(args, " "), out)
			}
			b.Logf("round %d: wrk %s: %.0f req/s, p50 %.3f ms, p99 %.3f ms", round+1, strings.Join(args, " "), rps, p50, p99)
			results[tg.name] = append(results[tg.name], result{rps, p50, p99})
		}
	}
	median := func(f func(i int) float64) float64 {
		v := make([]float64, rounds)
		for i := range v {
			v[i] = f(i)
		}
		sort.Float64s(v)
		return v[rounds/2]
	}
	for _, tg := range targets {
		b.Run(tg.name, func(b *testing.B) {
			r := results[tg.name]
			b.ReportMetric(median(func(i int) float64 { return r[i].rps }), "req/s")
			b.ReportMetric(median(func(i int) float64 { return r[i].p50 }), "p50-ms")
			b.ReportMetric(median(func(i int) float64 { return r[i].p99 }), "p99-ms")
			if tg.name != "direct" {
				b.ReportMetric(median(func(i int) float64 { return r[i].rps / results["direct"][i].rps }), "x-direct")
			}
			if n := results["nginx"]; tg.name == "proxy" && n != nil {
				b.ReportMetric(median(func(i int) float64 { return r[i].rps / n[i].rps }), "x-nginx")
			}
		})
	}

	viaProxy := func() error {
		req, _ := http.NewRequest("GET", "http://"+d.proxy+"/", nil)
		req.Host = "8080-" + sb.ID + ".localhost"
		return fetch(http.DefaultClient, req)
	}
	b.Run("wake-from-paused", func(b *testing.B) {
		var running, paused latencies
		for i := 0; i < 30; i++ {
			t0 := time.Now()
			if err := viaProxy(); err != nil {
				b.Fatal(err)
			}
			running = append(running, time.Since(t0))
			if _, err := cl.Pause(ctx, sb.ID, ""); err != nil {
				b.Fatal(err)
			}
			t0 = time.Now()
			if err := viaProxy(); err != nil {
				b.Fatal(err)
			}
			paused = append(paused, time.Since(t0))
		}
		sort.Slice(running, func(i, j int) bool { return running[i] < running[j] })
		sort.Slice(paused, func(i, j int) bool { return paused[i] < paused[j] })
		running.report(b, "running-")
		paused.report(b, "paused-")
	})
}

func envInt(name string, def int) int {
	if n, err := strconv.Atoi(os.Getenv(name)); err == nil && n > 0 {
		return n
	}
	return def
}

var (
	wrkRPS = regexp.MustCompile(`Requests/sec:\s+([0-9.]+)`)
	wrkPct = regexp.MustCompile(`(?m)^\s+(50|99)%\s+([0-9.]+)(us|ms|s)\s*$`)
	wrkErr = regexp.MustCompile(`(?m)^\s+(Socket errors:.*|Non-2xx or 3xx responses:.*)$`)
)

// parseWrk reads requests/s, p50 and p99 (ms) and any errors from wrk's
// output.
func parseWrk(out string) (rps, p50, p99 float64, errs string) {
	if m := wrkRPS.FindStringSubmatch(out); m != nil {
		rps, _ = strconv.ParseFloat(m[1], 64)
	}
	for _, m := range wrkPct.FindAllStringSubmatch(out, -1) {
		v, _ := strconv.ParseFloat(m[2], 64)
		switch m[3] {
		case "us":
			v /= 1000
		case "s":
			v *= 1000
		}
		if m[1] == "50" {
			p50 = v
		} else {
			p99 = v
		}
	}
	if m := wrkErr.FindAllString(out, -1); m != nil {
		errs = strings.Join(m, "; ")
	}
	return rps, p50, p99, errs
}

// startNginx runs nginx as a reverse proxy to upstream (keep-alive
// connections, two workers like the two cores) on a free port of
// 127.0.0.1, stopped when the benchmark ends; ok is false (and the
// benchmark says so) when nginx is not installed.
func startNginx(b *testing.B, upstream string) (string, bool) {
	nginx, err := exec.LookPath("nginx")
	if err != nil {
		b.Log("no nginx (apt-get install nginx, or scripts/bench-proxy.sh): its row is left out")
		return "", false
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	dir := b.TempDir()
	conf := fmt.Sprintf(`worker_processes 2;
daemon off;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log;
events { worker_connections 4096; }
http {
  access_log off;
  client_body_temp_path %[1]s/body;
  proxy_temp_path %[1]s/proxy;
  fastcgi_temp_path %[1]s/fastcgi;
  uwsgi_temp_path %[1]s/uwsgi;
  scgi_temp_path %[1]s/scgi;
  upstream sandbox { server %[2]s; keepalive 64; }
  server {
    listen %[3]s;
    location / {
      proxy_pass http://sandbox;
      proxy_http_version 1.1;
      proxy_set_header Connection "";
      proxy_set_header Host $host;
    }
  }
}
`, dir, upstream, addr)
	if err := os.WriteFile(filepath.Join(dir, "nginx.conf"), []byte(conf), 0o644); err != nil {
		b.Fatal(err)
	}
	cmd := exec.Command(nginx, "-p", dir, "-c", filepath.Join(dir, "nginx.conf"))
	var logs strings.Builder
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	b.Cleanup(func() {
		cmd.Process.Signal(os.Interrupt)
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return addr, true
		}
		select {
		case <-done:
			b.Fatalf("nginx exited: %s", logs.String())
		default:
		}
		if time.Now().After(deadline) {
			b.Fatalf("nginx did not listen: %s", logs.String())
		}
	}
}

func fetch(c *http.Client, req *http.Request) error {
	resp, err := c.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	io.Copy(io.Discard, resp.Body)
	if resp.StatusCode != 200 {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	return nil
}
