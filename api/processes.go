package api

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/wire"
)

// processPoll is how often a streamed output asks for new output.
const processPoll = 100 * time.Millisecond

// startProcess is POST /v1/sandboxes/{id}/processes.
func (s *Server) startProcess(w http.ResponseWriter, r *http.Request, p principal) error {
	var req wire.ProcessRequest
	if err := decode(r, &req, false); err != nil {
		return err
	}
	pr := torpor.ProcessRequest{Cmd: req.Cmd, Env: req.Env, Cwd: req.Cwd}
	if err := torpor.ValidateProcess(pr); err != nil {
		return err
	}
	info, err := s.eng.StartProcess(r.Context(), p.tenant, r.PathValue("id"), pr)
	if err != nil {
		return err
	}
	info.Env = nil // env often carries secrets: never returned
	writeJSON(w, http.StatusCreated, info)
	return nil
}

// listProcesses is GET /v1/sandboxes/{id}/processes.
func (s *Server) listProcesses(w http.ResponseWriter, r *http.Request, p principal) error {
	list, err := s.eng.ListProcesses(r.Context(), p.tenant, r.PathValue("id"))
	if err != nil {
		return err
	}
	for i := range list {
		list[i].Env = nil // env often carries secrets: never returned
	}
	writeJSON(w, http.StatusOK, wire.ProcessList{Processes: list})
	return nil
}

func processID(r *http.Request) (int, error) {
	n, err := strconv.Atoi(r.PathValue("pid"))
	if err != nil || n <= 0 {
		return 0, torpor.Invalid("pid", "a process id is a positive integer")
	}
	return n, nil
}

// processOutput is GET /v1/sandboxes/{id}/processes/{pid}/output: the
// output from ?offset=N, or with Accept: text/event-stream a stream of it
// until the process ends.
func (s *Server) processOutput(w http.ResponseWriter, r *http.Request, p principal) error {
	pid, err := processID(r)
	if err != nil {
		return err
	}
	var offset int64
	if v := r.URL.Query().Get("offset"); v != "" {
		if offset, err = strconv.ParseInt(v, 10, 64); err != nil || offset < 0 {
			return torpor.Invalid("offset", "must be a byte offset, 0 or more")
		}
	}
	id := r.PathValue("id")
	if !strings.Contains(r.Header.Get("Accept"), "text/event-stream") {
		out, err := s.eng.ProcessOutput(r.Context(), p.tenant, id, pid, offset)
		if err != nil {
			return err
		}
		writeJSON(w, http.StatusOK, out)
		return nil
	}
	sse := &sseWriter{w: w, rc: http.NewResponseController(w)}
	t := time.NewTicker(processPoll)
	defer t.Stop()
	for {
		out, err := s.eng.ProcessOutput(r.Context(), p.tenant, id, pid, offset)
		if err != nil {
			if !sse.started() {
				return err
			}
			if r.Context().Err() != nil {
				return nil
			}
			e := torpor.AsError(err)
			sse.send(wire.EventError, wire.ErrorBody{Error: wire.ErrorDetail{Code: e.Code, Message: e.Message}})
			return nil
		}
		offset = out.Next
		if out.Ended {
			sse.send(wire.EventExit, out)
			return nil
		}
		if out.Data != "" || !sse.started() {
			sse.send(wire.EventOutput, out)
		}
		// A full read may have left more: ask again at once.
		if len(out.Data) >= torpor.MaxProcessOutputRead {
			continue
		}
		select {
		case <-r.Context().Done():
			return nil
		case <-t.C:
		}
	}
}

// processStdin is POST /v1/sandboxes/{id}/processes/{pid}/stdin.
func (s *Server) processStdin(w http.ResponseWriter, r *http.Request, p principal) error {
	pid, err := processID(r)
	if err != nil {
		return err
	}
	var req wire.StdinRequest
	// JSON escapes may make 1 MiB up to 6 times longer.
	if err := decodeLimit(r, &req, false, 6*torpor.MaxProcessStdin+4096); err != nil {
		return err
	}
	if len(req.Data) > torpor.MaxProcessStdin {
		return torpor.Invalid("data", "at most %d bytes", torpor.MaxProcessStdin)
	}
	if err := s.eng.WriteProcessStdin(r.Context(), p.tenant, r.PathValue("id"), pid, []byte(req.Data), req.Close); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// signalProcess is POST /v1/sandboxes/{id}/processes/{pid}/signal.
func (s *Server) signalProcess(w http.ResponseWriter, r *http.Request, p principal) error {
	pid, err := processID(r)
	if err != nil {
		return err
	}
	var req wire.SignalRequest
	if err := decode(r, &req, false); err != nil {
		return err
	}
	sig, err := torpor.NormalizeSignal(req.Signal)
	if err != nil {
		return err
	}
	if err := s.eng.SignalProcess(r.Context(), p.tenant, r.PathValue("id"), pid, sig); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
