package envd_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/e2b/envd"
	"github.com/torpor-dev/torpor/lifecycle"
	"github.com/torpor-dev/torpor/runtime/fake"
	"github.com/torpor-dev/torpor/store/sqlite"
)

// FuzzConnectEnvelope sends whatever bytes to envd's Connect endpoints,
// framed and unframed, in each encoding the SDKs use: a malformed
// envelope or message is a 4xx (or, on a stream, an error in its
// end-of-stream message), never a 5xx nor a panic, and it starts nothing.
func FuzzConnectEnvelope(f *testing.F) {
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(f.TempDir(), "torpor.db"))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { st.Close() })
	st.PutTemplate(ctx, torpor.Template{Name: "base", RootFS: "/x", CreatedAt: time.Now()})
	eng, err := lifecycle.New(lifecycle.Config{Store: st, Runtimes: []torpor.Runtime{fake.New(fake.NewHost())},
		Capacity: lifecycle.Capacity{VCPUs: 2, MemoryMiB: 2048}})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(eng.Close)
	if err := eng.Recover(ctx); err != nil {
		f.Fatal(err)
	}
	sb, err := eng.Create(ctx, "acme", torpor.CreateRequest{Template: "base"})
	if err != nil {
		f.Fatal(err)
	}
	srv := envd.New(envd.Config{Engine: eng})
	h := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { srv.ServeSandbox(w, r, sb) })

	frame := func(flags byte, msg []byte) []byte {
		b := make([]byte, 5, 5+len(msg))
		b[0] = flags
		binary.BigEndian.PutUint32(b[1:], uint32(len(msg)))
		return append(b, msg...)
	}
	f.Add(uint8(0), []byte(`{"process":{"cmd":"/bin/sh","args":["-c","true"]}}`))
	f.Add(uint8(1), []byte(`{"process":{"pid":4294967295},"signal":"SIGNAL_SIGKILL"}`))
	f.Add(uint8(2), []byte{0x0a, 0x03, 0x0a, 0x01, 0x2f})
	f.Add(uint8(3), frame(0, []byte(`{"path":"/../../etc"}`)))
	f.Add(uint8(4), []byte{0, 0xff, 0xff, 0xff, 0xff})
	f.Add(uint8(5), frame(2, []byte(`{}`)))
	endpoints := []struct{ path, ctype string }{
		{"/process.Process/Start", "application/connect+json"},
		{"/process.Process/Start", "application/connect+proto"},
		{"/process.Process/SendSignal", "application/json"},
		{"/process.Process/SendInput", "application/proto"},
		{"/process.Process/Connect", "application/connect+json"},
		{"/process.Process/StreamInput", "application/connect+json"},
		{"/filesystem.Filesystem/WatchDir", "application/connect+json"},
		{"/process.Process/List", "application/json"},
	}
	f.Fuzz(func(t *testing.T, which uint8, body []byte) {
		ep := endpoints[int(which)%len(endpoints)]
		for _, b := range [][]byte{body, frame(0, body)} {
			rctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			r := httptest.NewRequestWithContext(rctx, "POST", ep.path, bytes.NewReader(b))
			r.Header.Set("Content-Type", ep.ctype)
			r.Header.Set("Connect-Timeout-Ms", "200")
			w := httptest.NewRecorder()
			h.ServeHTTP(w, r)
			cancel()
			if w.Code >= 500 {
				t.Fatalf("%s (%s) answered %d to %q: %s", ep.path, ep.ctype, w.Code, b, w.Body.String())
			}
		}
	})
}
