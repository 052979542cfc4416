package vm

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/network"
	"github.com/torpor-dev/torpor/network/networktest"
	"github.com/torpor-dev/torpor/runtime/runtimetest"
)

// testNetwork makes a sandbox network on a bridge and a /24 of its own
// (runtimetest.Network).
func testNetwork(t testing.TB) network.Config { return runtimetest.Network(t, "tpv", 216) }

// newNetRuntime returns a runtime on the sandbox network; what is left
// when the test ends is destroyed with it, so that addresses and
// namespaces go too.
func newNetRuntime(t testing.TB, cfg Config, ncfg network.Config) *Runtime {
	t.Helper()
	r := restartedRuntime(t, cfg, ncfg)
	t.Cleanup(func() {
		ctx := context.Background()
		ids, _ := r.List(ctx)
		for _, id := range ids {
			if err := r.Destroy(ctx, torpor.InstanceRef{SandboxID: id}); err != nil {
				t.Errorf("cleanup: destroy %s: %v", id, err)
			}
		}
	})
	return r
}

// restartedRuntime returns a runtime over the same configs as another,
// as a restarted daemon's.
func restartedRuntime(t testing.TB, cfg Config, ncfg network.Config) *Runtime {
	t.Helper()
	n, err := network.New(context.Background(), ncfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Network = n
	return newRuntime(t, cfg)
}

// webSpec is a VM serving its sandbox id on port 8080 of every address.
func webSpec(tmpl torpor.Template, internet bool) torpor.BootSpec {
	id := torpor.NewID("rt_", 12)
	return torpor.BootSpec{SandboxID: id, Template: tmpl,
		Resources:     torpor.Resources{VCPUs: 1, MemoryMiB: 192},
		Setup:         []string{"mkdir -p /www && echo " + id + " > /www/index.html"},
		Entrypoint:    []string{"httpd", "-f", "-p", "8080", "-h", "/www"},
		AllowInternet: internet}
}

// TestVMNetwork: a VM gets an address of its own on the sandbox network
// that the host reaches; VMs reach neither each other nor the host's
// services, and beyond the host only with AllowInternet (masqueraded);
// the address outlives a snapshot and its restore by a restarted
// runtime, and a stop and boot; Destroy gives it back. The VM allowed the
// internet has the runtime's resolv.conf, in place of the dangling
// symlink of its template, which the other keeps.
func TestVMNetwork(t *testing.T) {
	needHost(t)
	ncfg := testNetwork(t)
	cfg := testConfig(t)
	cfg.ResolvConf = testResolvConf
	tmpl := baseTemplate(t)
	if err := os.Symlink(stubResolvConf, filepath.Join(tmpl.RootFS, "etc/resolv.conf")); err != nil {
		t.Fatal(err)
	}
	r := newNetRuntime(t, cfg, ncfg)
	ctx := testCtx(t)

	specs := []torpor.BootSpec{webSpec(tmpl, false), webSpec(tmpl, true)}
	refs := make([]torpor.InstanceRef, len(specs))
	errs := make([]error, len(specs))
	var wg sync.WaitGroup
	for i := range specs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			h, err := r.Boot(ctx, specs[i])
			refs[i], errs[i] = torpor.InstanceRef{SandboxID: specs[i].SandboxID, Handle: h}, err
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		t.Fatal(err)
	}
	closed, open := refs[0], refs[1]
	addrC, okC := r.Address(ctx, closed)
	addrO, okO := r.Address(ctx, open)
	if !okC || !okO || addrC == addrO || !ncfg.Prefix.Contains(addrC) || !ncfg.Prefix.Contains(addrO) {
		t.Fatalf("addresses %s %v, %s %v", addrC, okC, addrO, okO)
	}
	hc := &http.Client{Timeout: 20 * time.Second}

	t.Run("GuestHasTheAddress", func(t *testing.T) {
		if out := sh(t, r, closed, "ip -4 -o addr show eth0; ip route"); !strings.Contains(out, addrC.String()+"/32") ||
			!strings.Contains(out, "default via "+gatewayOf(ncfg)) {
			t.Fatalf("the guest's network:\n%s", out)
		}
		if out := sh(t, r, closed, "ls /sys/class/net"); strings.Join(strings.Fields(out), " ") != "eth0 lo" {
			t.Errorf("the guest's interfaces: %q", out)
		}
	})

	resolvConf := func(t *testing.T, r *Runtime) {
		t.Helper()
		if got := sh(t, r, open, "test ! -L /etc/resolv.conf && cat /etc/resolv.conf"); got != testResolvConf {
			t.Errorf("/etc/resolv.conf of the VM allowed the internet: %q, want %q", got, testResolvConf)
		}
		if got := sh(t, r, closed, "readlink /etc/resolv.conf"); got != stubResolvConf+"\n" {
			t.Errorf("/etc/resolv.conf of the VM without the internet links to %q, want the template's %q", got, stubResolvConf)
		}
	}
	t.Run("ResolvConfOnlyWithInternet", func(t *testing.T) { resolvConf(t, r) })

	t.Run("HostReachesGuest", func(t *testing.T) {
		for _, a := range []netip.Addr{addrC, addrO} {
			serving(t, hc, a, map[netip.Addr]string{addrC: closed.SandboxID, addrO: open.SandboxID}[a])
		}
	})

	t.Run("NoWayToOtherSandboxesOrTheHost", func(t *testing.T) {
		hostSrv := serveHost(t)
		for _, c := range []struct {
			from torpor.InstanceRef
			to   string
		}{
			{closed, net.JoinHostPort(addrO.String(), "8080")},
			{open, net.JoinHostPort(addrC.String(), "8080")},
			{closed, net.JoinHostPort(gatewayOf(ncfg), port(hostSrv))},
			{open, net.JoinHostPort(gatewayOf(ncfg), port(hostSrv))},
		} {
			if out, code := fetchIn(t, r, c.from, c.to); code == 0 || strings.Contains(out, "200 OK") {
				t.Errorf("a VM reached %s: %q", c.to, out)
			}
		}
	})

	outside := networktest.NewOutside(t)
	ln := outside.Listen(t)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
			answer(c, host)
		}
	}()
	internet := func(t *testing.T, r *Runtime) {
		t.Helper()
		if got, code := fetchIn(t, r, closed, ln.Addr().String()); code == 0 || strings.Contains(got, "200 OK") {
			t.Errorf("a VM without allow_internet reached an outside address: %q", got)
		}
		if got, code := fetchIn(t, r, open, ln.Addr().String()); code != 0 || !strings.HasSuffix(got, "\n"+outside.Host.String()+"\n") {
			t.Errorf("the outside answered %q (exit %d), want it to see the host's address %s", got, code, outside.Host)
		}
	}
	t.Run("InternetOnlyWhenAllowed", func(t *testing.T) { internet(t, r) })

	t.Run("SnapshotAndRestoreKeepTheAddress", func(t *testing.T) {
		if _, err := r.Snapshot(ctx, open); err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(r.netnsPath(open.SandboxID)); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("a snapshotted VM keeps its namespace: %v", err)
		}
		// A restarted daemon restores it: the same address, the same
		// server (it ran on through the snapshot), the same rules.
		r2 := restartedRuntime(t, cfg, ncfg)
		if got, _ := r2.Address(ctx, open); got != addrO {
			t.Fatalf("address of the snapshotted VM: %s, want %s", got, addrO)
		}
		if got, _ := r2.Address(ctx, closed); got != addrC {
			t.Fatalf("address of the running VM after a restart: %s, want %s", got, addrC)
		}
		h, err := r2.Restore(ctx, open)
		if err != nil {
			t.Fatal(err)
		}
		open.Handle = h
		if got, _ := r2.Address(ctx, open); got != addrO {
			t.Fatalf("address after restore: %s, want %s", got, addrO)
		}
		if body, err := get(hc, "http://"+addrO.String()+":8080/"); err != nil || body != open.SandboxID {
			t.Fatalf("host to the restored VM: %q %v", body, err)
		}
		internet(t, r2)
		resolvConf(t, r2)
	})

	t.Run("StopAndBootKeepTheAddress", func(t *testing.T) {
		if err := r.Stop(ctx, closed); err != nil {
			t.Fatal(err)
		}
		h, err := r.Boot(ctx, specs[0])
		if err != nil {
			t.Fatal(err)
		}
		closed.Handle = h
		if got, _ := r.Address(ctx, closed); got != addrC {
			t.Fatalf("address after stop and boot: %s, want %s", got, addrC)
		}
		serving(t, hc, addrC, closed.SandboxID)
	})

	// Root in a VM can change its card's MAC and IPv4 addresses, which a
	// container cannot: taking another VM's does not draw that VM's
	// traffic (the host's port of a VM forwards only its own MAC address
	// and learns none; its rules drop what comes from another address).
	t.Run("RootCannotTakeAnothersPlace", func(t *testing.T) {
		sh(t, r, closed, "ip link set eth0 down && ip link set eth0 address "+network.GuestMAC(addrO).String()+
			" && ip link set eth0 up && ip addr add "+addrO.String()+"/32 dev eth0 && ip route add "+gatewayOf(ncfg)+" dev eth0 && "+
			"(arping -c 2 -U -s "+addrO.String()+" -I eth0 "+addrO.String()+"; ping -c 2 -W 1 "+gatewayOf(ncfg)+"; true) >/dev/null 2>&1")
		if body, err := get(hc, "http://"+addrO.String()+":8080/"); err != nil || body != open.SandboxID {
			t.Fatalf("host to %s: %q %v, want the VM that holds it (%s)", addrO, body, err, open.SandboxID)
		}
	})

	t.Run("DestroyReleasesTheAddress", func(t *testing.T) {
		for _, ref := range []torpor.InstanceRef{closed, open} {
			a, _ := r.Address(ctx, ref)
			if err := r.Destroy(ctx, ref); err != nil {
				t.Fatal(err)
			}
			if _, ok := r.Address(ctx, ref); ok {
				t.Error("a destroyed VM kept its address")
			}
			if _, err := os.Stat(filepath.Join(ncfg.StateDir, ncfg.Bridge, "leases", a.String())); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("the lease of a destroyed VM is kept: %v", err)
			}
			if left := qemuHolds(r.sandboxDir(ref.SandboxID)); len(left) > 0 {
				t.Errorf("processes still hold the VM's files: %v", left)
			}
		}
	})
}

// What TestVMNetwork's runtime writes to /etc/resolv.conf, and where its
// template's /etc/resolv.conf points (nowhere: as in a systemd image).
const (
	testResolvConf = "# test\nnameserver 192.0.2.53\nsearch example.test\noptions ndots:1\n"
	stubResolvConf = "/run/systemd/resolve/stub-resolv.conf"
)

// A VM cannot have the internet on a runtime without a sandbox network.
func TestVMInternetNeedsNetwork(t *testing.T) {
	needHost(t)
	r := newRuntime(t, testConfig(t))
	spec := webSpec(torpor.Template{Name: "x", RootFS: t.TempDir()}, true)
	_, err := r.Boot(testCtx(t), spec)
	var te *torpor.Error
	if !errors.As(err, &te) || te.Code != torpor.EInvalid || te.Param != "allow_internet" {
		t.Fatalf("boot with allow_internet and no network: %v", err)
	}
}

func gatewayOf(c network.Config) string { return c.Prefix.Masked().Addr().Next().String() }

func port(a string) string { _, p, _ := net.SplitHostPort(a); return p }

// serving waits until the VM at addr serves its id (want, when given) on
// port 8080 to the host (its entrypoint may not listen yet when Boot
// returns).
func serving(t *testing.T, hc *http.Client, addr netip.Addr, want string) {
	t.Helper()
	var body string
	var err error
	waitFor(t, "the VM's server at "+addr.String(), func() bool {
		body, err = get(hc, "http://"+addr.String()+":8080/")
		return err == nil
	})
	if body == "" || (want != "" && body != want) {
		t.Fatalf("host to %s: %q, want %q", addr, body, want)
	}
}

func get(c *http.Client, url string) (string, error) {
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return strings.TrimSpace(string(b)), err
}

// serveHost serves HTTP on every address of the host for the test.
func serveHost(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp4", "0.0.0.0:0")
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
			answer(c, "host")
		}
	}()
	return ln.Addr().String()
}

// answer reads an HTTP request's head from c and answers body: a server
// that closed with the request unread would reset the connection, and
// the client might lose the answer.
func answer(c net.Conn, body string) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	br := bufio.NewReader(c)
	for {
		line, err := br.ReadString('\n')
		if err != nil || strings.TrimSpace(line) == "" {
			break
		}
	}
	io.WriteString(c, "HTTP/1.0 200 OK\r\n\r\n"+body+"\n")
}

// fetchIn sends an HTTP/1.0 GET to addr from inside the VM with busybox
// nc and returns the answer and nc's exit code.
func fetchIn(t *testing.T, r *Runtime, ref torpor.InstanceRef, addr string) (string, int) {
	t.Helper()
	host, p, _ := net.SplitHostPort(addr)
	var out strings.Builder
	res, err := r.Exec(testCtx(t), ref, torpor.ExecRequest{
		Cmd:    []string{"sh", "-c", `printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 5 "$0" "$1"`, host, p},
		Stdout: &out, Stderr: &out, Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return out.String(), res.ExitCode
}
