package proxy_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/torpor-dev/torpor"
)

// TestARequestCutByARestart: a request whose server a restart ends before
// it answers goes again once the sandbox runs again when it can (a GET);
// one that cannot (a POST) is answered with the conflict that says the
// sandbox stopped under it, not with a 503 that blames its server.
func TestARequestCutByARestart(t *testing.T) {
	f := newFixture(t)
	sb := f.create(t, torpor.CreateRequest{Ports: []torpor.PortSpec{{Port: 9100, Public: true}}})
	// The server restarts the sandbox under every other request, and
	// goes with it (the connection closes unanswered).
	var seen atomic.Int32
	server := serveRequests(t, func(c net.Conn, req *http.Request) bool {
		io.Copy(io.Discard, req.Body)
		if seen.Add(1)%2 == 1 {
			if _, err := f.eng.Restart(ctx, "acme", sb.ID); err != nil {
				t.Error(err)
			}
			return false
		}
		io.WriteString(c, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nagain")
		return true
	})
	dial := f.host.DialFunc
	f.host.DialFunc = func(ctx context.Context, id, network, addr string) (net.Conn, error) {
		if addr == "127.0.0.1:9100" {
			var d net.Dialer
			return d.DialContext(ctx, network, server)
		}
		return dial(ctx, id, network, addr)
	}
	host := "9100-" + sb.ID + ".sb.test"

	if status, body := f.get(t, host, "/", nil); status != 200 || body != "again" || seen.Load() != 2 {
		t.Fatalf("a GET cut by a restart: %d %q after %d requests to the server, want 200 \"again\" after 2", status, body, seen.Load())
	}
	req, _ := http.NewRequest("POST", f.proxy.URL+"/", strings.NewReader("x"))
	req.Host = host
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict || !strings.Contains(string(body), "stopped running the server") || seen.Load() != 3 {
		t.Fatalf("a POST cut by a restart: %d %s after %d requests to the server, want 409 after 3", resp.StatusCode, body, seen.Load())
	}
	if got, _ := f.eng.Lookup(ctx, sb.ID); got.Boots != 3 {
		t.Fatalf("the sandbox booted %d times, want 3", got.Boots)
	}
}
