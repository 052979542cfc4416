package e2e

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/client"
	"github.com/torpor-dev/torpor/network"
	"github.com/torpor-dev/torpor/network/networktest"
)

var (
	srvOnce sync.Once
	srvPath string
	srvErr  error
)

// sandboxServer builds testdata/sandboxsrv, a static server to copy into
// sandboxes (busybox has no WebSocket or HTTP/2 server).
func sandboxServer(t testing.TB) string {
	t.Helper()
	srvOnce.Do(func() {
		// One stable path per user (as runtimetest does for the init):
		// repeated runs overwrite it instead of leaving binaries behind.
		dir := filepath.Join(os.TempDir(), fmt.Sprintf("torpor-test-sandboxsrv-%d", os.Getuid()))
		if srvErr = os.MkdirAll(dir, 0o755); srvErr != nil {
			return
		}
		srvPath = filepath.Join(dir, "sandboxsrv")
		tmp := fmt.Sprintf("%s.%d", srvPath, os.Getpid())
		cmd := exec.Command("go", "build", "-trimpath", "-o", tmp, "./testdata/sandboxsrv")
		cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
		if out, err := cmd.CombinedOutput(); err != nil {
			srvErr = errors.New(string(out))
			return
		}
		srvErr = os.Rename(tmp, srvPath)
	})
	if srvErr != nil {
		t.Fatalf("building the sandbox server: %v", srvErr)
	}
	return srvPath
}

// startServer copies the sandbox server into a running sandbox, starts it
// on addr (":8080": every address) and waits until it accepts.
func startServer(t testing.TB, d *daemon, id, addr string) {
	t.Helper()
	f, err := os.Open(sandboxServer(t))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cl := d.client(t)
	if _, err := cl.WriteFile(context.Background(), id, "/usr/local/bin/sandboxsrv", f, &client.WriteOptions{Mode: client.Mode(0o755)}); err != nil {
		t.Fatal(err)
	}
	d.ok("exec", id, "--", "sh", "-c", "nohup sandboxsrv "+addr+" >/tmp/srv.log 2>&1 &")
	port := addr[strings.LastIndex(addr, ":")+1:]
	deadline := time.Now().Add(20 * time.Second)
	for {
		if _, _, code := d.cli("exec", id, "--", "sh", "-c", "nc -w 1 127.0.0.1 "+port+" </dev/null"); code == 0 {
			return
		}
		if time.Now().After(deadline) {
			out, _, _ := d.cli("exec", id, "--", "cat", "/tmp/srv.log")
			t.Fatalf("the sandbox server did not listen: %s", out)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

var inetRe = regexp.MustCompile(`inet (\d+\.\d+\.\d+\.\d+)/32`)

// sandboxAddr reads the address of the sandbox's eth0.
func sandboxAddr(t testing.TB, d *daemon, id string) netip.Addr {
	t.Helper()
	out := d.ok("exec", id, "--", "ip", "-4", "-o", "addr", "show", "eth0")
	m := inetRe.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("no address on eth0: %q", out)
	}
	return netip.MustParseAddr(m[1])
}

// fetchFrom sends an HTTP/1.0 GET from inside the sandbox with busybox nc
// and returns the answer and nc's exit code.
func fetchFrom(d *daemon, id, host, port string) (string, int) {
	out, errs, code := d.cli("exec", id, "--", "sh", "-c", `printf 'GET / HTTP/1.0\r\n\r\n' | nc -w 5 "$0" "$1"`, host, port)
	return out + errs, code
}

func leaseExists(a netip.Addr) bool {
	_, err := os.Stat(filepath.Join(network.DefaultStateDir, network.DefaultBridge, "leases", a.String()))
	return err == nil
}

// TestSandboxNetwork: with the default network each sandbox has an
// address of its own that the host reaches; sandboxes reach neither each
// other nor the host's services; addresses stay across a daemon restart
// (and the proxy still reaches them) and are given back on delete.
func TestSandboxNetwork(t *testing.T) {
	needs(t)
	bin, dataDir := torporBin(t), t.TempDir()
	d := startDaemon(t, bin, dataDir)
	a := strings.TrimSpace(d.ok("create", "--setup", "mkdir -p /www && echo hello-a > /www/index.html", "--", "httpd", "-f", "-p", "8080", "-h", "/www"))
	b := strings.TrimSpace(d.ok("create", "--setup", "mkdir -p /www && echo hello-b > /www/index.html", "--", "httpd", "-f", "-p", "8080", "-h", "/www"))
	addrA, addrB := sandboxAddr(t, d, a), sandboxAddr(t, d, b)
	if addrA == addrB || !network.DefaultPrefix.Contains(addrA) || !network.DefaultPrefix.Contains(addrB) {
		t.Fatalf("addresses %s and %s, want two of %s", addrA, addrB, network.DefaultPrefix)
	}
	if got := d.get(a).Address; got != addrA.String() {
		t.Errorf("the API says sandbox a is at %q, its eth0 has %s", got, addrA)
	}
	hc := &http.Client{Timeout: 10 * time.Second}
	getBody := func(url string) string {
		t.Helper()
		resp, err := hc.Get(url)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return string(body)
	}
	if got := getBody("http://" + addrA.String() + ":8080/"); got != "hello-a\n" {
		t.Fatalf("the host to %s: %q", addrA, got)
	}
	// Neither the other sandbox nor a service of the host.
	hostPort := networktest.HostService(t)
	gateway := network.DefaultPrefix.Addr().Next().String()
	for _, to := range [][2]string{{addrB.String(), "8080"}, {gateway, hostPort}, {"127.0.0.1", hostPort}} {
		if out, code := fetchFrom(d, a, to[0], to[1]); code == 0 || strings.Contains(out, "200 OK") {
			t.Errorf("sandbox %s reached %s:%s: %q", a, to[0], to[1], out)
		}
	}

	// A daemon restart: the sandbox keeps its address, the proxy reaches
	// it, and a new sandbox gets another one.
	d.stop()
	d = startDaemon(t, bin, dataDir)
	if got := sandboxAddr(t, d, a); got != addrA || !leaseExists(addrA) {
		t.Fatalf("after a restart %s has %s (lease kept: %v), want %s", a, got, leaseExists(addrA), addrA)
	}
	token := d.get(a).TrafficToken
	req, _ := http.NewRequest("GET", "http://"+d.proxy+"/", nil)
	req.Host = "8080-" + a + ".localhost"
	req.Header.Set("X-Torpor-Token", token)
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(body) != "hello-a\n" {
		t.Fatalf("the proxy after a restart: %d %q", resp.StatusCode, body)
	}
	c := strings.TrimSpace(d.ok("create"))
	if addrC := sandboxAddr(t, d, c); addrC == addrA || addrC == addrB {
		t.Fatalf("a new sandbox got the address %s of a live one", addrC)
	}
	// Hibernation keeps the address; delete gives it back.
	d.ok("hibernate", a)
	d.ok("start", a)
	if got := sandboxAddr(t, d, a); got != addrA {
		t.Fatalf("after hibernation %s has %s, want %s", a, got, addrA)
	}
	d.ok("rm", a)
	if leaseExists(addrA) {
		t.Fatalf("the address %s of a deleted sandbox is still leased", addrA)
	}
	if _, err := os.Stat("/sys/class/net/tv" + hexAddr(addrA)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the veth of a deleted sandbox is left: %v", err)
	}
}

func hexAddr(a netip.Addr) string {
	b := a.As4()
	const digits = "0123456789abcdef"
	var s bytes.Buffer
	for _, x := range b {
		s.WriteByte(digits[x>>4])
		s.WriteByte(digits[x&15])
	}
	return s.String()
}

// TestAllowInternet: only a sandbox created with allow_internet reaches an
// address beyond the host (a namespace standing for the internet), and
// it arrives from the host's address (masqueraded), and only it has the
// nameservers of network_dns in its /etc/resolv.conf.
func TestAllowInternet(t *testing.T) {
	needs(t)
	d := startDaemon(t, torporBin(t), t.TempDir(), "TORPOR_NETWORK_DNS=192.0.2.53")
	out := networktest.NewOutside(t)
	ln := out.Listen(t)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			host, _, _ := net.SplitHostPort(c.RemoteAddr().String())
			io.WriteString(c, "HTTP/1.0 200 OK\r\n\r\nfrom "+host+"\n")
			c.Close()
		}
	}()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	cl := d.client(t)
	ctx := context.Background()
	closed, err := cl.Create(ctx, torpor.CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	open, err := cl.Create(ctx, torpor.CreateRequest{Template: "base", AllowInternet: true})
	if err != nil {
		t.Fatal(err)
	}
	if !open.AllowInternet || closed.AllowInternet {
		t.Fatalf("allow_internet: %v and %v", open.AllowInternet, closed.AllowInternet)
	}
	if got, code := fetchFrom(d, closed.ID, out.Addr.String(), port); code == 0 || strings.Contains(got, "200 OK") {
		t.Fatalf("a sandbox without allow_internet reached the outside: %q", got)
	}
	if got, code := fetchFrom(d, open.ID, out.Addr.String(), port); code != 0 || !strings.Contains(got, "from "+out.Host.String()+"\n") {
		t.Fatalf("a sandbox with allow_internet: %q (exit %d), want it to arrive from %s", got, code, out.Host)
	}
	resolvConf := func(id string) string {
		out, errs, _ := d.cli("exec", id, "--", "cat", "/etc/resolv.conf")
		return out + errs
	}
	if got := resolvConf(open.ID); !strings.Contains(got, "\nnameserver 192.0.2.53\n") {
		t.Fatalf("/etc/resolv.conf of a sandbox with allow_internet: %q", got)
	}
	if got := resolvConf(closed.ID); strings.Contains(got, "nameserver") {
		t.Fatalf("/etc/resolv.conf of a sandbox without allow_internet: %q", got)
	}
	// It stays allowed across hibernation (booted again from the record).
	if _, err := cl.Hibernate(ctx, open.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.Start(ctx, open.ID); err != nil {
		t.Fatal(err)
	}
	if got, code := fetchFrom(d, open.ID, out.Addr.String(), port); code != 0 || !strings.Contains(got, "200 OK") {
		t.Fatalf("after hibernation: %q (exit %d)", got, code)
	}
	if got := resolvConf(open.ID); !strings.Contains(got, "\nnameserver 192.0.2.53\n") {
		t.Fatalf("/etc/resolv.conf after hibernation: %q", got)
	}
}
