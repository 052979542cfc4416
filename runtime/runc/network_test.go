package runc

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/network"
	"github.com/torpor-dev/torpor/network/networktest"
	"github.com/torpor-dev/torpor/rootfs"
	"github.com/torpor-dev/torpor/runtime/runtimetest"
)

// testNetwork makes a sandbox network on a bridge and a /24 of its own
// (runtimetest.Network).
func testNetwork(t *testing.T) network.Config { return runtimetest.Network(t, "tpr", 215) }

// newNetRuntime returns a runtime with a sandbox network; each call over
// the same configs is a restarted daemon.
func newNetRuntime(t *testing.T, cfg Config, ncfg network.Config) *Runtime {
	t.Helper()
	n, err := network.New(context.Background(), ncfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Network = n
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// httpd is an entrypoint serving "hi" on port 8080 of every address and
// "lo" on port 8081 of the loopback only.
var httpd = func(s *torpor.BootSpec) {
	s.Setup = []string{"mkdir -p /www /lo && echo hi > /www/index.html && echo lo > /lo/index.html && httpd -p 127.0.0.1:8081 -h /lo"}
	s.Entrypoint = []string{"httpd", "-f", "-p", "8080", "-h", "/www"}
}

func get(t *testing.T, c *http.Client, url string) (string, error) {
	t.Helper()
	resp, err := c.Get(url)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return strings.TrimSpace(string(b)), err
}

// TestSandboxNetwork: each sandbox gets an address that the host reaches,
// the runtime's dialer reaches it there (and a loopback-only service
// through its namespace), sandboxes reach neither each other nor the
// host, the address outlives a stop and a restarted runtime, and destroy
// gives it back.
func TestSandboxNetwork(t *testing.T) {
	needHost(t)
	ncfg := testNetwork(t)
	base := t.TempDir() + "/base"
	if err := buildBase(base); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t)
	r := newNetRuntime(t, cfg, ncfg)
	ctx := context.Background()
	a := bootOne(t, r, base, httpd)
	b := bootOne(t, r, base, httpd)
	addrA, okA := r.Address(ctx, a)
	addrB, okB := r.Address(ctx, b)
	if !okA || !okB || addrA == addrB || !ncfg.Prefix.Contains(addrA) || !ncfg.Prefix.Contains(addrB) {
		t.Fatalf("addresses %s %v, %s %v", addrA, okA, addrB, okB)
	}
	// Inside, eth0 has the address.
	if out := execOut(t, r, a, "ip", "-4", "-o", "addr", "show", "eth0"); !strings.Contains(out, addrA.String()+"/32") {
		t.Fatalf("eth0 in the sandbox: %q", out)
	}

	// The host reaches the sandbox's address.
	hc := &http.Client{Timeout: 10 * time.Second}
	if body, err := get(t, hc, "http://"+addrA.String()+":8080/"); err != nil || body != "hi" {
		t.Fatalf("host to %s: %q %v", addrA, body, err)
	}
	// The dialer: a loopback address goes to the sandbox's address, and a
	// service on the loopback only is reached inside the namespace.
	dialed := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			return r.DialContext(ctx, a, network, addr)
		}}}
	for port, want := range map[string]string{"8080": "hi", "8081": "lo"} {
		if body, err := get(t, dialed, "http://127.0.0.1:"+port+"/"); err != nil || body != want {
			t.Fatalf("dialer to port %s: %q %v", port, body, err)
		}
	}
	if _, err := get(t, hc, "http://"+addrA.String()+":8081/"); err == nil {
		t.Fatal("a loopback-only service answered on the sandbox's address")
	}

	// No sandbox reaches another, nor a service of the host.
	hostAddr := net.JoinHostPort(gatewayOf(ncfg), networktest.HostService(t))
	for _, to := range []string{net.JoinHostPort(addrB.String(), "8080"), hostAddr} {
		if out, code := fetchIn(t, r, a, to); code == 0 || strings.Contains(out, "200 OK") {
			t.Errorf("sandbox reached %s: %q", to, out)
		}
	}
	if body, err := get(t, hc, "http://"+hostAddr+"/"); err != nil || body != "host" {
		t.Fatalf("the host's own service: %q %v", body, err)
	}

	// A stop keeps the address; the next boot uses it again.
	if err := r.Stop(ctx, a); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(r.netnsPath(a.SandboxID)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the namespace of a stopped sandbox is kept: %v", err)
	}
	spec := torpor.BootSpec{SandboxID: a.SandboxID, Template: torpor.Template{Name: "base", RootFS: base}}
	httpd(&spec)
	var err error
	if a.Handle, err = r.Boot(ctx, spec); err != nil {
		t.Fatal(err)
	}
	if got, _ := r.Address(ctx, a); got != addrA {
		t.Fatalf("address after stop and boot: %s, want %s", got, addrA)
	}

	// A restarted runtime (daemon) knows the addresses and reaches them.
	r2 := newNetRuntime(t, cfg, ncfg)
	if got, _ := r2.Address(ctx, b); got != addrB {
		t.Fatalf("address after a restart: %s, want %s", got, addrB)
	}
	dialed.Transport = &http.Transport{DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		return r2.DialContext(ctx, b, network, addr)
	}}
	if body, err := get(t, dialed, "http://127.0.0.1:8080/"); err != nil || body != "hi" {
		t.Fatalf("dialer after a restart: %q %v", body, err)
	}

	// Destroy gives the address back.
	if err := r2.Destroy(ctx, b); err != nil {
		t.Fatal(err)
	}
	if _, ok := r2.Address(ctx, b); ok {
		t.Fatal("a destroyed sandbox kept its address")
	}
	if _, err := os.Stat(ncfg.StateDir + "/" + ncfg.Bridge + "/leases/" + addrB.String()); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the lease of a destroyed sandbox is kept: %v", err)
	}
}

// TestSandboxInternet: only a sandbox booted with AllowInternet reaches an
// address beyond the host (an outside namespace), masqueraded.
func TestSandboxInternet(t *testing.T) {
	needHost(t)
	ncfg := testNetwork(t)
	base := t.TempDir() + "/base"
	if err := buildBase(base); err != nil {
		t.Fatal(err)
	}
	r := newNetRuntime(t, testConfig(t), ncfg)
	out := networktest.NewOutside(t)
	ln := out.Listen(t)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
			io.WriteString(c, "HTTP/1.0 200 OK\r\n\r\n"+host+"\n")
			c.Close()
		}
	}()
	closed := bootOne(t, r, base, nil)
	open := bootOne(t, r, base, func(s *torpor.BootSpec) { s.AllowInternet = true })
	if got, code := fetchIn(t, r, closed, ln.Addr().String()); code == 0 || strings.Contains(got, "200 OK") {
		t.Fatalf("a sandbox without allow_internet reached an outside address: %q", got)
	}
	if got, code := fetchIn(t, r, open, ln.Addr().String()); code != 0 || !strings.HasSuffix(got, "\n"+out.Host.String()+"\n") {
		t.Fatalf("the outside answered %q (exit %d), want it to see the host's address %s", got, code, out.Host)
	}
}

func gatewayOf(c network.Config) string { return c.Prefix.Masked().Addr().Next().String() }

func port(a net.Addr) string { _, p, _ := net.SplitHostPort(a.String()); return p }

func execOut(t *testing.T, r *Runtime, ref torpor.InstanceRef, cmd ...string) string {
	t.Helper()
	var out, errb strings.Builder
	res, err := r.Exec(context.Background(), ref, torpor.ExecRequest{Cmd: cmd, Stdout: &out, Stderr: &errb, Timeout: 30 * time.Second})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("%v: exit %d, %v: %s%s", cmd, res.ExitCode, err, out.String(), errb.String())
	}
	return out.String()
}

// fetchIn sends an HTTP/1.0 GET to addr from inside the sandbox with
// busybox nc (busybox's wget crashes in some builds) and returns the
// answer and nc's exit code.
func fetchIn(t *testing.T, r *Runtime, ref torpor.InstanceRef, addr string) (string, int) {
	t.Helper()
	host, p, _ := net.SplitHostPort(addr)
	var out strings.Builder
	res, err := r.Exec(context.Background(), ref, torpor.ExecRequest{
		Cmd:    []string{"sh", "-c", `printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 5 "$0" "$1"`, host, p},
		Stdout: &out, Stderr: &out, Timeout: 30 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	return out.String(), res.ExitCode
}

func buildBase(dir string) error { return rootfs.BuildBase(context.Background(), dir) }

// TestRuntimeWithNetwork runs the runtime suite with a sandbox network.
func TestRuntimeWithNetwork(t *testing.T) {
	needHost(t)
	ncfg := testNetwork(t)
	base := t.TempDir() + "/base"
	if err := buildBase(base); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t)
	runtimetest.Run(t, runtimetest.Harness{
		New:       func(t *testing.T) torpor.Runtime { return newNetRuntime(t, cfg, ncfg) },
		Template:  torpor.Template{Name: "base", RootFS: base},
		Processes: true,
		Network:   true,
	})
}

// TestSandboxResolvConf: a sandbox booted with AllowInternet finds the
// runtime's resolv.conf at /etc/resolv.conf, at every boot, in place of a
// symlink its template has there (which is replaced, never followed to
// the host); a sandbox without it keeps its template's file.
func TestSandboxResolvConf(t *testing.T) {
	needHost(t)
	ncfg := testNetwork(t)
	dir := t.TempDir()
	base := dir + "/base"
	if err := buildBase(base); err != nil {
		t.Fatal(err)
	}
	// The template's /etc/resolv.conf points at a host file by an
	// absolute path (as systemd images point at their stub's file).
	canary := dir + "/host-resolv.conf"
	if err := os.WriteFile(canary, []byte("host's\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(canary, base+"/etc/resolv.conf"); err != nil {
		t.Fatal(err)
	}
	const text = "# test\nnameserver 192.0.2.53\nsearch example.test\n"
	cfg := testConfig(t)
	cfg.ResolvConf = text
	r := newNetRuntime(t, cfg, ncfg)
	ctx := context.Background()

	closed := bootOne(t, r, base, nil)
	if got := execOut(t, r, closed, "readlink", "/etc/resolv.conf"); got != canary+"\n" {
		t.Fatalf("without allow_internet, /etc/resolv.conf links to %q, want the template's %q", got, canary)
	}
	open := bootOne(t, r, base, func(s *torpor.BootSpec) { s.AllowInternet = true })
	check := func(when string) {
		t.Helper()
		if got := execOut(t, r, open, "sh", "-c", "test ! -L /etc/resolv.conf && cat /etc/resolv.conf"); got != text {
			t.Fatalf("%s: /etc/resolv.conf is %q, want %q", when, got, text)
		}
	}
	check("first boot")
	if b, err := os.ReadFile(canary); err != nil || string(b) != "host's\n" {
		t.Fatalf("the host file the template's symlink names: %q %v", b, err)
	}
	if target, err := os.Readlink(base + "/etc/resolv.conf"); err != nil || target != canary {
		t.Fatalf("the template's own /etc/resolv.conf changed: %q %v", target, err)
	}

	// The sandbox may change the file; the next boot writes it again.
	execOut(t, r, open, "sh", "-c", "echo 'nameserver 198.51.100.1' > /etc/resolv.conf")
	if err := r.Stop(ctx, open); err != nil {
		t.Fatal(err)
	}
	spec := torpor.BootSpec{SandboxID: open.SandboxID, Template: torpor.Template{Name: "base", RootFS: base}, AllowInternet: true}
	var err error
	if open.Handle, err = r.Boot(ctx, spec); err != nil {
		t.Fatal(err)
	}
	check("after a stop and boot")
}
