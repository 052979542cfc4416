package e2e

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

// TestProxyWakesAnIdleSandbox: a server inside a real sandbox is reached
// through the proxy by host name; the idle policy pauses the sandbox, and
// the next request wakes it and gets its answer.
func TestProxyWakesAnIdleSandbox(t *testing.T) {
	needs(t)
	d := startDaemon(t, torporBin(t), t.TempDir())
	id := strings.TrimSpace(d.ok("create", "--pause-after", "2",
		"--setup", "mkdir -p /www && echo hello from the sandbox > /www/index.html",
		"--", "httpd", "-f", "-p", "127.0.0.1:8080", "-h", "/www"))
	token := d.get(id).TrafficToken
	get := func(tok string) (int, string) {
		req, _ := http.NewRequest("GET", "http://"+d.proxy+"/index.html", nil)
		req.Host = "8080-" + id + ".localhost"
		if tok != "" {
			req.Header.Set("X-Torpor-Token", tok)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	if status, body := get(token); status != 200 || body != "hello from the sandbox\n" {
		t.Fatalf("through the proxy: %d %q", status, body)
	}
	if status, _ := get(""); status != 401 {
		t.Fatalf("without the token: %d", status)
	}
	d.waitState(id, torpor.StatePaused)
	if status, _ := get("wrong"); status != 403 || d.get(id).State != torpor.StatePaused {
		t.Fatal("a wrong token woke the sandbox")
	}
	if status, body := get(token); status != 200 || body != "hello from the sandbox\n" {
		t.Fatalf("the waking request: %d %q", status, body)
	}
	if sb := d.get(id); sb.State != torpor.StateRunning || sb.Meters.AutoResumed != 1 {
		t.Fatalf("after the waking request: %s %+v", sb.State, sb.Meters)
	}
	// /metrics counts the requests by result and the wake-up.
	resp, err := http.Get("http://" + d.addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	scraped, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, series := range []string{`torpor_proxy_requests_total{result="ok"} 2`, `torpor_proxy_requests_total{result="unauthenticated"} 1`,
		`torpor_proxy_requests_total{result="forbidden"} 1`, `torpor_proxy_wakeups_total{result="ok"} 1`, `torpor_proxy_wake_seconds_count 1`} {
		if !strings.Contains(string(scraped), series+"\n") {
			t.Errorf("/metrics lacks %s:\n%s", series, grepLines(string(scraped), "torpor_proxy"))
		}
	}
	// From hibernation: the entrypoint boots again and the proxy waits for
	// it to listen before forwarding.
	d.ok("hibernate", id)
	if status, body := get(token); status != 200 || body != "hello from the sandbox\n" {
		t.Fatalf("the request to a hibernated sandbox: %d %q", status, body)
	}
}

// wsConn is a minimal WebSocket client (RFC 6455) for the tests.
type wsConn struct {
	c  net.Conn
	br *bufio.Reader
}

// dialWS opens a WebSocket to /ws on port 8080 of a sandbox through the
// proxy.
func dialWS(t *testing.T, d *daemon, id, token string) *wsConn {
	t.Helper()
	c, err := net.Dial("tcp", d.proxy)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	var key [16]byte
	rand.Read(key[:])
	fmt.Fprintf(c, "GET /ws HTTP/1.1\r\nHost: 8080-%s.localhost\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"+
		"Sec-WebSocket-Key: %s\r\nSec-WebSocket-Version: 13\r\nX-Torpor-Token: %s\r\n\r\n", id, base64.StdEncoding.EncodeToString(key[:]), token)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, nil)
	if err != nil || resp.StatusCode != http.StatusSwitchingProtocols {
		t.Fatalf("websocket handshake: %v %v", resp, err)
	}
	return &wsConn{c: c, br: br}
}

// echo sends a text message and reads the answer.
func (w *wsConn) echo(t *testing.T, msg string) {
	t.Helper()
	var mask [4]byte
	rand.Read(mask[:])
	frame := append([]byte{0x81, 0x80 | byte(len(msg))}, mask[:]...)
	for i := 0; i < len(msg); i++ {
		frame = append(frame, msg[i]^mask[i%4])
	}
	w.c.SetDeadline(time.Now().Add(20 * time.Second))
	if _, err := w.c.Write(frame); err != nil {
		t.Fatal(err)
	}
	var h [2]byte
	if _, err := io.ReadFull(w.br, h[:]); err != nil {
		t.Fatalf("websocket read: %v", err)
	}
	got := make([]byte, h[1]&0x7f)
	if _, err := io.ReadFull(w.br, got); err != nil || string(got) != msg {
		t.Fatalf("websocket echo: %q %v, want %q", got, err, msg)
	}
}

// TestWebSocketActivity: a WebSocket to a server in a real sandbox,
// through the proxy, keeps the sandbox awake past its idle time while it
// carries traffic; once it falls silent (still open), the sandbox pauses.
func TestWebSocketActivity(t *testing.T) {
	needs(t)
	d := startDaemon(t, torporBin(t), t.TempDir())
	sandboxServer(t) // built before the idle clock starts
	cl := d.client(t)
	ctx := context.Background()
	const idle, connIdle = 3, 1
	sb, err := cl.Create(ctx, torpor.CreateRequest{Template: "base", PolicyRequest: torpor.PolicyRequest{
		LifecyclePolicy: &torpor.LifecyclePolicy{PauseAfterIdleSeconds: torpor.Seconds(idle), ConnectionIdleSeconds: torpor.Seconds(connIdle)}}})
	if err != nil {
		t.Fatal(err)
	}
	startServer(t, d, sb.ID, ":8080")
	ws := dialWS(t, d, sb.ID, sb.TrafficToken)
	before := d.get(sb.ID).Meters
	// Talk for three times the idle time, and never through a pause: a
	// frozen server would not answer.
	for end := time.Now().Add(3 * idle * time.Second); time.Now().Before(end); time.Sleep(300 * time.Millisecond) {
		ws.echo(t, "ping")
	}
	if got := d.get(sb.ID); got.State != torpor.StateRunning || got.Meters.Pauses != before.Pauses {
		t.Fatalf("a sandbox with a talking WebSocket: %s, %d pauses (%d before)", got.State, got.Meters.Pauses, before.Pauses)
	}
	// Silent but open: it no longer counts, and the sandbox pauses.
	got := d.waitState(sb.ID, torpor.StatePaused)
	if got.Meters.AutoPaused != before.AutoPaused+1 {
		t.Fatalf("meters after the idle pause: %+v (before the talk: %+v)", got.Meters, before)
	}
	// The next message is held until someone wakes the sandbox; a request
	// through the proxy does.
	req, _ := http.NewRequest("GET", "http://"+d.proxy+"/", nil)
	req.Host = "8080-" + sb.ID + ".localhost"
	req.Header.Set("X-Torpor-Token", sb.TrafficToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	ws.echo(t, "after")
}

// TestProxyH2CAndTCP: cleartext HTTP/2 reaches the server in a real
// sandbox as HTTP/2, and CONNECT tunnels plain TCP to a port the proxy is
// configured for.
func TestProxyH2CAndTCP(t *testing.T) {
	needs(t)
	d := startDaemon(t, torporBin(t), t.TempDir(), "TORPOR_PROXY_TCP_PORTS=8080")
	cl := d.client(t)
	sb, err := cl.Create(context.Background(), torpor.CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	startServer(t, d, sb.ID, ":8080")
	tr := &http.Transport{Protocols: new(http.Protocols)}
	tr.Protocols.SetUnencryptedHTTP2(true)
	req, _ := http.NewRequest("GET", "http://"+d.proxy+"/proto", nil)
	req.Host = "8080-" + sb.ID + ".localhost"
	req.Header.Set("X-Torpor-Token", sb.TrafficToken)
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.ProtoMajor != 2 || string(body) != "HTTP/2.0" {
		t.Fatalf("h2c through the proxy: HTTP/%d %q", resp.ProtoMajor, body)
	}

	c, err := net.Dial("tcp", d.proxy)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	auth := base64.StdEncoding.EncodeToString([]byte("torpor:" + sb.TrafficToken))
	fmt.Fprintf(c, "CONNECT %s:8080 HTTP/1.1\r\nHost: %s:8080\r\nProxy-Authorization: Basic %s\r\n\r\n", sb.ID, sb.ID, auth)
	br := bufio.NewReader(c)
	resp, err = http.ReadResponse(br, &http.Request{Method: "CONNECT"})
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	fmt.Fprint(c, "GET / HTTP/1.0\r\n\r\n")
	resp, err = http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ = io.ReadAll(resp.Body)
	if string(body) != "ok" {
		t.Fatalf("HTTP inside the TCP tunnel: %d %q", resp.StatusCode, body)
	}
}

// grepLines returns the lines of s that contain sub.
func grepLines(s, sub string) string {
	var out []string
	for _, l := range strings.Split(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}

// TestSlowAnswersAndIdlePauses: through the real daemon and a real
// sandbox, a request whose answer takes longer than the sandbox's idle
// time is answered, with no pause under it (a frozen server would never
// answer); a request whose client goes away while the server thinks lets
// the sandbox pause.
func TestSlowAnswersAndIdlePauses(t *testing.T) {
	needs(t)
	d := startDaemon(t, torporBin(t), t.TempDir())
	sandboxServer(t) // built before the idle clock starts
	cl := d.client(t)
	ctx := context.Background()
	const idle = 2
	sb, err := cl.Create(ctx, torpor.CreateRequest{Template: "base", Ports: []torpor.PortSpec{{Port: 8080, Public: true}},
		PolicyRequest: torpor.PolicyRequest{LifecyclePolicy: &torpor.LifecyclePolicy{PauseAfterIdleSeconds: torpor.Seconds(idle),
			// A silent connection stops counting after a second: what keeps
			// the sandbox awake below is the request waiting for its answer.
			ConnectionIdleSeconds: torpor.Seconds(1)}}})
	if err != nil {
		t.Fatal(err)
	}
	startServer(t, d, sb.ID, ":8080")
	before := d.get(sb.ID).Meters
	req, _ := http.NewRequest("GET", "http://"+d.proxy+"/sleep?ms=6000", nil)
	req.Host = "8080-" + sb.ID + ".localhost"
	resp, err := (&http.Client{Timeout: 60 * time.Second}).Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "slept" {
		t.Fatalf("a slow answer: %d %q", resp.StatusCode, body)
	}
	if got := d.get(sb.ID).Meters; got.Pauses != before.Pauses {
		t.Fatalf("paused %d times under a request waiting for its answer", got.Pauses-before.Pauses)
	}
	// The client goes away; the server would think for a minute more.
	c, err := net.Dial("tcp", d.proxy)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(c, "GET /sleep?ms=60000 HTTP/1.1\r\nHost: 8080-%s.localhost\r\n\r\n", sb.ID)
	time.Sleep(200 * time.Millisecond)
	c.Close()
	d.waitState(sb.ID, torpor.StatePaused)
}
