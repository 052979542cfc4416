package api

import (
	"math"
	"net/http"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/wire"
)

// runCode is POST /v1/sandboxes/{id}/code. A snippet's own error is a
// 200 with a structured error in the body.
func (s *Server) runCode(w http.ResponseWriter, r *http.Request, p principal) error {
	var req wire.CodeRequest
	// A snippet may take 1 MiB; JSON escapes may make it up to 6 times
	// longer.
	if err := decodeLimit(r, &req, false, 6*torpor.MaxCodeSize+4096); err != nil {
		return err
	}
	if req.TimeoutSeconds < 0 || req.TimeoutSeconds > torpor.MaxCodeTimeout.Seconds() || math.IsNaN(req.TimeoutSeconds) {
		return torpor.Invalid("timeout_seconds", "must be between 0 and %d", int(torpor.MaxCodeTimeout.Seconds()))
	}
	cr := torpor.CodeRequest{Language: req.Language, Code: req.Code,
		Timeout: time.Duration(req.TimeoutSeconds * float64(time.Second))}
	if err := torpor.ValidateCode(cr); err != nil {
		return err
	}
	res, err := s.eng.RunCode(r.Context(), p.tenant, r.PathValue("id"), cr)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, res)
	return nil
}
