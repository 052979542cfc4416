package api

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/wire"
)

// maxOutput bounds each of stdout and stderr kept for a non-streamed exec.
const maxOutput = 8 << 20

func (s *Server) exec(w http.ResponseWriter, r *http.Request, p principal) error {
	var req wire.ExecRequest
	if err := decode(r, &req, false); err != nil {
		return err
	}
	if req.TimeoutSeconds < 0 {
		return torpor.Invalid("timeout_seconds", "must not be negative")
	}
	er := torpor.ExecRequest{
		Cmd:     req.Cmd,
		Env:     req.Env,
		Cwd:     req.Cwd,
		User:    req.User,
		Timeout: time.Duration(req.TimeoutSeconds * float64(time.Second)),
	}
	if req.Stdin != "" {
		er.Stdin = strings.NewReader(req.Stdin)
	}
	if strings.Contains(r.Header.Get("Accept"), "text/event-stream") {
		return s.execStream(w, r, p, er)
	}
	var stdout, stderr capBuffer
	er.Stdout, er.Stderr = &stdout, &stderr
	res, err := s.eng.Exec(r.Context(), p.tenant, r.PathValue("id"), er)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, wire.ExecResponse{
		ExitCode: res.ExitCode, TimedOut: res.TimedOut,
		Stdout: stdout.buf.String(), Stderr: stderr.buf.String(),
		Truncated: stdout.truncated || stderr.truncated,
	})
	return nil
}

// execStream sends output as server-sent events while the command runs.
// Errors before the stream starts are ordinary error responses; later ones
// are an "error" event.
func (s *Server) execStream(w http.ResponseWriter, r *http.Request, p principal, er torpor.ExecRequest) error {
	sse := &sseWriter{w: w, rc: http.NewResponseController(w)}
	er.Stdout = sse.stream(wire.EventStdout)
	er.Stderr = sse.stream(wire.EventStderr)
	res, err := s.eng.Exec(r.Context(), p.tenant, r.PathValue("id"), er)
	if err != nil {
		if !sse.started() {
			return err
		}
		e := torpor.AsError(err)
		sse.send(wire.EventError, wire.ErrorBody{Error: wire.ErrorDetail{Code: e.Code, Message: e.Message}})
		return nil
	}
	sse.send(wire.EventExit, wire.ExecResponse{ExitCode: res.ExitCode, TimedOut: res.TimedOut})
	return nil
}

// sseWriter writes server-sent events, one JSON object per event.
type sseWriter struct {
	mu      sync.Mutex
	w       http.ResponseWriter
	rc      *http.ResponseController
	begun   bool
	failed  bool
	scratch bytes.Buffer
}

func (s *sseWriter) started() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.begun
}

func (s *sseWriter) send(event string, v any) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.failed {
		return
	}
	if !s.begun {
		h := s.w.Header()
		h.Set("Content-Type", "text/event-stream")
		h.Set("Cache-Control", "no-cache")
		s.w.WriteHeader(http.StatusOK)
		s.begun = true
	}
	data, _ := json.Marshal(v)
	s.scratch.Reset()
	fmt.Fprintf(&s.scratch, "event: %s\ndata: %s\n\n", event, data)
	if _, err := s.w.Write(s.scratch.Bytes()); err != nil {
		s.failed = true
		return
	}
	_ = s.rc.Flush()
}

// stream returns a writer whose writes become events of one name.
func (s *sseWriter) stream(event string) *sseStream { return &sseStream{s: s, event: event} }

type sseStream struct {
	s     *sseWriter
	event string
}

func (st *sseStream) Write(p []byte) (int, error) {
	st.s.send(st.event, wire.ExecChunk{Data: string(p)})
	return len(p), nil
}

// capBuffer keeps the first maxOutput bytes written to it.
type capBuffer struct {
	mu        sync.Mutex
	buf       bytes.Buffer
	truncated bool
}

func (c *capBuffer) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	room := maxOutput - c.buf.Len()
	if room < len(p) {
		c.truncated = true
		if room > 0 {
			c.buf.Write(p[:room])
		}
		return len(p), nil
	}
	c.buf.Write(p)
	return len(p), nil
}
