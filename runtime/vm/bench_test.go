package vm

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

// BenchmarkSnapshot measures the snapshot pause (Snapshot: flush, stop,
// write the state, end QEMU) and the restore to the first exec (Restore,
// then `true` run by the agent) of guests of 256 MiB and 1 GiB, with half
// of their memory holding random data, eager and lazy; and, in the same
// run and on the same disk, the floor: dd writing the snapshot's bytes
// (with fdatasync) and reading them back.
//
//	go test ./runtime/vm/ -run '^$' -bench Snapshot -benchtime 3x
func BenchmarkSnapshot(b *testing.B) {
	needHost(b)
	tmpl := baseTemplate(b)
	for _, mib := range []int64{256, 1024} {
		for _, lazy := range []bool{false, true} {
			mode := "eager"
			if lazy {
				mode = "lazy"
			}
			b.Run(fmt.Sprintf("%dMiB/%s", mib, mode), func(b *testing.B) {
				cfg := testConfig(b)
				cfg.LazyMemory = lazy
				benchSnapshot(b, cfg, tmpl, mib)
			})
		}
	}
}

func benchSnapshot(b *testing.B, cfg Config, tmpl torpor.Template, mib int64) {
	rt := newRuntime(b, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	spec := torpor.BootSpec{SandboxID: torpor.NewID("rt_", 12), Template: tmpl,
		Resources: torpor.Resources{VCPUs: 1, MemoryMiB: mib}}
	h, err := rt.Boot(ctx, spec)
	if err != nil {
		b.Fatal(err)
	}
	ref := torpor.InstanceRef{SandboxID: spec.SandboxID, Handle: h}
	run := func(script string) {
		res, err := rt.Exec(ctx, ref, torpor.ExecRequest{Cmd: []string{"/bin/sh", "-c", script}})
		if err != nil || res.ExitCode != 0 {
			b.Fatalf("%s: %+v, %v", script, res, err)
		}
	}
	run(fmt.Sprintf("mount -o remount,size=%dM /dev/shm; dd if=/dev/urandom of=/dev/shm/fill bs=1M count=%d 2>/dev/null", mib, mib/2))

	var pause, restore, ddWrite, ddRead time.Duration
	var bytes int64
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		t0 := time.Now()
		info, err := rt.Snapshot(ctx, ref)
		if err != nil {
			b.Fatal(err)
		}
		pause += time.Since(t0)
		bytes = info.SizeBytes

		t1 := time.Now()
		if ref.Handle, err = rt.Restore(ctx, ref); err != nil {
			b.Fatal(err)
		}
		if _, err := rt.Exec(ctx, ref, torpor.ExecRequest{Cmd: []string{"true"}}); err != nil {
			b.Fatal(err)
		}
		restore += time.Since(t1)

		b.StopTimer()
		w, r := ddFloor(b, rt.sandboxDir(ref.SandboxID), bytes)
		ddWrite += w
		ddRead += r
		b.StartTimer()
	}
	b.StopTimer()
	n := time.Duration(b.N)
	b.ReportMetric(float64(bytes)/(1<<20), "snapshot-MiB")
	b.ReportMetric(ms(pause/n), "pause-ms")
	b.ReportMetric(ms(restore/n), "restore-ms")
	b.ReportMetric(ms(ddWrite/n), "dd-write-ms")
	b.ReportMetric(ms(ddRead/n), "dd-read-ms")
	b.ReportMetric(float64(pause)/float64(max(ddWrite, time.Millisecond)), "pause/dd-write")
	b.ReportMetric(float64(restore)/float64(max(ddRead, time.Millisecond)), "restore/dd-read")
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// ddFloor times dd writing n bytes of random data to a file in dir (with
// fdatasync, as the snapshot is flushed) and reading them back.
func ddFloor(b *testing.B, dir string, n int64) (write, read time.Duration) {
	src := filepath.Join(dir, "dd-src")
	dst := filepath.Join(dir, "dd-floor")
	defer os.Remove(src)
	defer os.Remove(dst)
	mib := max((n+(1<<20)-1)>>20, 1)
	if out, err := exec.Command("dd", "if=/dev/urandom", "of="+src, "bs=1M", "count="+strconv.FormatInt(mib, 10)).CombinedOutput(); err != nil {
		b.Fatalf("dd: %v: %s", err, out)
	}
	t0 := time.Now()
	if out, err := exec.Command("dd", "if="+src, "of="+dst, "bs=1M", "conv=fdatasync").CombinedOutput(); err != nil {
		b.Fatalf("dd: %v: %s", err, out)
	}
	write = time.Since(t0)
	t1 := time.Now()
	if out, err := exec.Command("dd", "if="+dst, "of=/dev/null", "bs=1M").CombinedOutput(); err != nil {
		b.Fatalf("dd: %v: %s", err, out)
	}
	return write, time.Since(t1)
}

// BenchmarkGuestHTTP compares the two ways from the host to a server in
// a VM on the sandbox network: the runtime's dialer (the agent dials the
// guest's loopback and relays the bytes over its virtio-serial port,
// what the proxy and HTTP hooks use) and the VM's address (virtio-net,
// the tap, the bridge). busybox httpd closes each connection, so every
// request is a new connection on either way.
//
//	go test ./runtime/vm/ -run '^$' -bench GuestHTTP -benchtime 50x
func BenchmarkGuestHTTP(b *testing.B) {
	needHost(b)
	ncfg := testNetwork(b)
	cfg := testConfig(b)
	r := newNetRuntime(b, cfg, ncfg)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	spec := torpor.BootSpec{SandboxID: torpor.NewID("rt_", 12), Template: baseTemplate(b),
		Resources:  torpor.Resources{VCPUs: 1, MemoryMiB: 256},
		Setup:      []string{"mkdir -p /www && echo hi > /www/small && dd if=/dev/urandom of=/www/big bs=1M count=1 2>/dev/null"},
		Entrypoint: []string{"httpd", "-f", "-p", "8080", "-h", "/www"}}
	h, err := r.Boot(ctx, spec)
	if err != nil {
		b.Fatal(err)
	}
	ref := torpor.InstanceRef{SandboxID: spec.SandboxID, Handle: h}
	addr, _ := r.Address(ctx, ref)
	ways := []struct {
		name string
		host string
		dial func(ctx context.Context, network, addr string) (net.Conn, error)
	}{
		{"agent", "127.0.0.1:8080", func(ctx context.Context, network, a string) (net.Conn, error) {
			return r.DialContext(ctx, ref, network, a)
		}},
		{"address", net.JoinHostPort(addr.String(), "8080"), (&net.Dialer{}).DialContext},
	}
	for _, file := range []struct {
		name string
		size int64
	}{{"small", 3}, {"big", 1 << 20}} {
		for _, w := range ways {
			b.Run(file.name+"/"+w.name, func(b *testing.B) {
				hc := &http.Client{Timeout: time.Minute, Transport: &http.Transport{DialContext: w.dial, DisableKeepAlives: true}}
				get := func() {
					resp, err := hc.Get("http://" + w.host + "/" + file.name)
					if err != nil {
						b.Fatal(err)
					}
					n, err := io.Copy(io.Discard, resp.Body)
					resp.Body.Close()
					if err != nil || n != file.size {
						b.Fatalf("%d bytes, %v", n, err)
					}
				}
				get() // the server listens
				b.SetBytes(file.size)
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					get()
				}
			})
		}
	}
}
