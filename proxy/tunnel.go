package proxy

import (
	"encoding/base64"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/torpor-dev/torpor"
)

// tunnel answers a CONNECT: it connects to the sandbox's port and copies
// bytes both ways until both sides are done. Over HTTP/1.1 the client's
// connection becomes the tunnel; over HTTP/2, the request's stream. The
// upstream connection reports its traffic like any other.
func (p *Proxy) tunnel(w http.ResponseWriter, r *http.Request, sb *torpor.Sandbox, port int, req *underWay) error {
	up, err := p.dial(r.Context(), sb, port)
	req.end() // connected: from now on its bytes count while they flow
	if err != nil {
		p.log.Debug("proxy: tunnel", "sandbox", sb.ID, "port", port, "err", err)
		return &torpor.Error{Code: torpor.EUnavailable, RetryAfter: time.Second,
			Message: fmt.Sprintf("port %d of the sandbox did not answer", port)}
	}
	defer up.Close()
	if r.ProtoMajor == 1 {
		conn, brw, err := http.NewResponseController(w).Hijack()
		if err != nil {
			return fmt.Errorf("proxy: hijack: %w", err)
		}
		defer conn.Close()
		_ = conn.SetDeadline(time.Time{})
		if _, err := brw.WriteString("HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
			return nil
		}
		if err := brw.Flush(); err != nil {
			return nil
		}
		var from io.Reader = conn
		if n := brw.Reader.Buffered(); n > 0 { // sent before our answer
			from = io.MultiReader(io.LimitReader(brw.Reader, int64(n)), conn)
		}
		splice(conn, from, up)
		return nil
	}
	rc := http.NewResponseController(w)
	w.WriteHeader(http.StatusOK)
	if err := rc.Flush(); err != nil {
		return nil
	}
	splice(flushWriter{w, rc}, r.Body, up)
	return nil
}

// splice copies client→up and up→client; each direction's end half-closes
// the other side where it can.
func splice(client io.Writer, clientIn io.Reader, up net.Conn) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_, _ = io.Copy(up, clientIn)
		if cw, ok := up.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
	}()
	_, _ = io.Copy(client, up)
	if cw, ok := client.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	} else if c, ok := client.(io.Closer); ok {
		_ = c.Close()
	}
	wg.Wait()
}

// flushWriter flushes after every write, so a tunnel over HTTP/2 streams.
type flushWriter struct {
	w  io.Writer
	rc *http.ResponseController
}

func (f flushWriter) Write(b []byte) (int, error) {
	n, err := f.w.Write(b)
	if err == nil {
		err = f.rc.Flush()
	}
	return n, err
}

// parseProxyAuth reads a Basic Proxy-Authorization (user and password).
func parseProxyAuth(h string) (user, password string, ok bool) {
	scheme, cred, found := strings.Cut(h, " ")
	if !found || !strings.EqualFold(scheme, "Basic") {
		return "", "", false
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(cred))
	if err != nil {
		return "", "", false
	}
	return strings.Cut(string(b), ":")
}
