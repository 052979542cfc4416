package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"sort"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor"
)

// BenchmarkProxy: requests per second and latency of a small GET to busybox
// httpd inside a sandbox, through the proxy vs. a direct connection made
// from inside the sandbox's network namespace (what the proxy itself does,
// minus the proxying). Also: how much longer the first request to a paused
// sandbox takes than a request to a running one.
func BenchmarkProxy(b *testing.B) {
	needsB(b)
	d := startDaemon(b, torporBin(b), b.TempDir())
	cl := d.client(b)
	ctx := context.Background()
	sb, err := cl.Create(ctx, torpor.CreateRequest{Template: "base",
		Ports: []torpor.PortSpec{{Port: 8080, Public: true}},
		Runtime: torpor.RuntimeConfig{Setup: []string{"mkdir -p /www && echo ok > /www/index.html"},
			Entrypoint: []string{"httpd", "-f", "-p", "127.0.0.1:8080", "-h", "/www"}}})
	if err != nil {
		b.Fatal(err)
	}
	proxyClient := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64}}
	viaProxy := func() error {
		req, _ := http.NewRequest("GET", "http://"+d.proxy+"/index.html", nil)
		req.Host = "8080-" + sb.ID + ".localhost"
		return fetch(proxyClient, req)
	}
	ns := netnsOf(b, d, sb.ID)
	directClient := &http.Client{Transport: &http.Transport{DisableKeepAlives: true,
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) { return dialInNetns(ctx, ns, addr) }}}
	direct := func() error {
		req, _ := http.NewRequest("GET", "http://127.0.0.1:8080/index.html", nil)
		return fetch(directClient, req)
	}
	for _, c := range []struct {
		name string
		do   func() error
	}{{"direct", direct}, {"proxy", viaProxy}} {
		b.Run(c.name, func(b *testing.B) {
			rps, lat := load(b, c.do, 8, 2000)
			b.ReportMetric(rps, "req/s")
			lat.report(b, "")
		})
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
		running.report(b, "running-")
		paused.report(b, "paused-")
	})
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

// load runs n requests over workers goroutines and returns requests per
// second and each request's latency.
func load(b *testing.B, do func() error, workers, n int) (float64, latencies) {
	var (
		mu  sync.Mutex
		lat latencies
		wg  sync.WaitGroup
	)
	jobs := make(chan struct{}, n)
	for i := 0; i < n; i++ {
		jobs <- struct{}{}
	}
	close(jobs)
	start := time.Now()
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range jobs {
				t0 := time.Now()
				if err := do(); err != nil {
					b.Error(err)
					return
				}
				mu.Lock()
				lat = append(lat, time.Since(t0))
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	return float64(len(lat)) / time.Since(start).Seconds(), lat
}

// netnsOf opens the network namespace of a sandbox's init.
func netnsOf(b *testing.B, d *daemon, id string) *os.File {
	out, err := exec.Command("runc", "--root", filepath.Join(d.dataDir, "runc", "runc"), "state", id).Output()
	if err != nil {
		b.Fatalf("runc state: %v", err)
	}
	var st struct {
		Pid int `json:"pid"`
	}
	json.Unmarshal(out, &st)
	f, err := os.Open(fmt.Sprintf("/proc/%d/ns/net", st.Pid))
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { f.Close() })
	return f
}

// dialInNetns connects to addr from inside ns, as the runtime's dialer does.
func dialInNetns(ctx context.Context, ns *os.File, addr string) (net.Conn, error) {
	type res struct {
		c   net.Conn
		err error
	}
	ch := make(chan res, 1)
	go func() {
		goruntime.LockOSThread()
		home, err := os.Open("/proc/thread-self/ns/net")
		if err != nil {
			ch <- res{nil, err}
			return
		}
		defer home.Close()
		if err := unix.Setns(int(ns.Fd()), unix.CLONE_NEWNET); err != nil {
			ch <- res{nil, err}
			return
		}
		var dl net.Dialer
		c, err := dl.DialContext(ctx, "tcp", addr)
		if unix.Setns(int(home.Fd()), unix.CLONE_NEWNET) == nil {
			goruntime.UnlockOSThread()
		}
		ch <- res{c, err}
	}()
	r := <-ch
	return r.c, r.err
}
