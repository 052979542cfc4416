// Command sandboxsrv is a small static server that the end-to-end tests
// and benchmarks copy into a sandbox: on :8080 (every address) it answers
// GET / with "ok", GET /proto with the HTTP version it was spoken to in
// (HTTP/1.1 or cleartext HTTP/2), GET /sleep?ms=N with "slept" after N
// milliseconds, and GET /ws with a WebSocket echo.
package main

import (
	"bufio"
	"crypto/sha1"
	"encoding/base64"
	"encoding/binary"
	"fmt"
	"io"
	"log"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"
)

func main() {
	addr := ":8080"
	if len(os.Args) > 1 {
		addr = os.Args[1]
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok") })
	mux.HandleFunc("GET /proto", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, r.Proto) })
	mux.HandleFunc("GET /sleep", func(w http.ResponseWriter, r *http.Request) {
		ms, _ := strconv.Atoi(r.URL.Query().Get("ms"))
		select {
		case <-time.After(time.Duration(ms) * time.Millisecond):
			io.WriteString(w, "slept")
		case <-r.Context().Done():
		}
	})
	mux.HandleFunc("GET /ws", websocketEcho)
	srv := &http.Server{Addr: addr, Handler: mux, Protocols: new(http.Protocols)}
	srv.Protocols.SetHTTP1(true)
	srv.Protocols.SetUnencryptedHTTP2(true)
	log.Fatal(srv.ListenAndServe())
}

// websocketEcho answers the WebSocket handshake (RFC 6455) and sends each
// text or binary message back.
func websocketEcho(w http.ResponseWriter, r *http.Request) {
	key := r.Header.Get("Sec-Websocket-Key")
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") || key == "" {
		http.Error(w, "not a websocket handshake", http.StatusBadRequest)
		return
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		return
	}
	defer conn.Close()
	sum := sha1.Sum([]byte(key + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
	fmt.Fprintf(brw, "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n",
		base64.StdEncoding.EncodeToString(sum[:]))
	if brw.Flush() != nil {
		return
	}
	for {
		op, payload, err := readFrame(brw.Reader)
		if err != nil {
			return
		}
		switch op {
		case 0x8: // close
			writeFrame(conn, 0x8, nil)
			return
		case 0x9: // ping
			writeFrame(conn, 0xA, payload)
		case 0x1, 0x2:
			if writeFrame(conn, op, payload) != nil {
				return
			}
		}
	}
}

func readFrame(r *bufio.Reader) (byte, []byte, error) {
	var h [2]byte
	if _, err := io.ReadFull(r, h[:]); err != nil {
		return 0, nil, err
	}
	n := uint64(h[1] & 0x7f)
	switch n {
	case 126:
		var b [2]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return 0, nil, err
		}
		n = uint64(binary.BigEndian.Uint16(b[:]))
	case 127:
		var b [8]byte
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return 0, nil, err
		}
		n = binary.BigEndian.Uint64(b[:])
	}
	if n > 1<<20 {
		return 0, nil, fmt.Errorf("frame too large")
	}
	var mask [4]byte
	if h[1]&0x80 != 0 {
		if _, err := io.ReadFull(r, mask[:]); err != nil {
			return 0, nil, err
		}
	}
	payload := make([]byte, n)
	if _, err := io.ReadFull(r, payload); err != nil {
		return 0, nil, err
	}
	for i := range payload {
		payload[i] ^= mask[i%4]
	}
	return h[0] & 0x0f, payload, nil
}

func writeFrame(w io.Writer, op byte, payload []byte) error {
	h := []byte{0x80 | op}
	switch n := len(payload); {
	case n < 126:
		h = append(h, byte(n))
	case n < 1<<16:
		h = append(h, 126, byte(n>>8), byte(n))
	default:
		h = append(h, 127)
		h = binary.BigEndian.AppendUint64(h, uint64(n))
	}
	_, err := w.Write(append(h, payload...))
	return err
}
