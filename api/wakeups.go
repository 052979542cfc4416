package api

import (
	"net/http"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/wire"
)

// The routes of a sandbox's scheduled wake-ups (docs/schedule.md).

func (s *Server) listWakeups(w http.ResponseWriter, r *http.Request, p principal) error {
	sb, err := s.eng.Get(r.Context(), p.tenant, r.PathValue("id"))
	if err != nil {
		return err
	}
	writeWakeups(w, http.StatusOK, sb)
	return nil
}

func (s *Server) setWakeups(w http.ResponseWriter, r *http.Request, p principal) error {
	var req wire.WakeupsRequest
	if err := decode(r, &req, false); err != nil {
		return err
	}
	if req.Wakeups == nil {
		return torpor.Invalid("wakeups", "give the list of wake-ups ([] removes them all)")
	}
	sb, err := s.eng.SetWakeups(r.Context(), p.tenant, r.PathValue("id"), req.Wakeups)
	if err != nil {
		return err
	}
	writeWakeups(w, http.StatusOK, sb)
	return nil
}

func (s *Server) addWakeup(w http.ResponseWriter, r *http.Request, p principal) error {
	var req torpor.WakeupSpec
	if err := decode(r, &req, false); err != nil {
		return err
	}
	sb, err := s.eng.AddWakeup(r.Context(), p.tenant, r.PathValue("id"), req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, sb.Wakeups[len(sb.Wakeups)-1])
	return nil
}

func (s *Server) clearWakeups(w http.ResponseWriter, r *http.Request, p principal) error {
	if _, err := s.eng.SetWakeups(r.Context(), p.tenant, r.PathValue("id"), nil); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (s *Server) removeWakeup(w http.ResponseWriter, r *http.Request, p principal) error {
	if _, err := s.eng.RemoveWakeup(r.Context(), p.tenant, r.PathValue("id"), r.PathValue("wakeup")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func writeWakeups(w http.ResponseWriter, status int, sb *torpor.Sandbox) {
	ws := sb.Wakeups
	if ws == nil {
		ws = []torpor.Wakeup{}
	}
	writeJSON(w, status, wire.WakeupList{Wakeups: ws})
}
