package api

import (
	"net/http"

	"github.com/torpor-dev/torpor"
)

// Checkpoints, fork and restore (docs/fork.md).

type checkpointRequest struct {
	Name string `json:"name"`
}

type restoreRequest struct {
	Checkpoint string `json:"checkpoint"`
}

func (s *Server) createCheckpoint(w http.ResponseWriter, r *http.Request, p principal) error {
	var req checkpointRequest
	if err := decode(r, &req, false); err != nil {
		return err
	}
	if req.Name == "" {
		return torpor.Invalid("name", "name is required")
	}
	cp, err := s.eng.CreateCheckpoint(r.Context(), p.tenant, r.PathValue("id"), req.Name)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, cp)
	return nil
}

func (s *Server) listCheckpoints(w http.ResponseWriter, r *http.Request, p principal) error {
	cps, err := s.eng.Checkpoints(r.Context(), p.tenant, r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"checkpoints": cps})
	return nil
}

func (s *Server) getCheckpoint(w http.ResponseWriter, r *http.Request, p principal) error {
	cp, err := s.eng.GetCheckpoint(r.Context(), p.tenant, r.PathValue("id"), r.PathValue("name"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, cp)
	return nil
}

func (s *Server) deleteCheckpoint(w http.ResponseWriter, r *http.Request, p principal) error {
	if err := s.eng.DeleteCheckpoint(r.Context(), p.tenant, r.PathValue("id"), r.PathValue("name")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) fork(w http.ResponseWriter, r *http.Request, p principal) error {
	var body struct {
		Count      *int   `json:"count"`
		Checkpoint string `json:"checkpoint"`
	}
	if err := decode(r, &body, true); err != nil {
		return err
	}
	req := torpor.ForkRequest{Count: 1, Checkpoint: body.Checkpoint}
	if body.Count != nil {
		req.Count = *body.Count
	}
	res, err := s.eng.Fork(r.Context(), p.tenant, r.PathValue("id"), req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, res)
	return nil
}

func (s *Server) restore(w http.ResponseWriter, r *http.Request, p principal) error {
	var req restoreRequest
	if err := decode(r, &req, false); err != nil {
		return err
	}
	if req.Checkpoint == "" {
		return torpor.Invalid("checkpoint", "checkpoint is required")
	}
	sb, err := s.eng.Restore(r.Context(), p.tenant, r.PathValue("id"), req.Checkpoint)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, sb)
	return nil
}
