package api

import (
	"net/http"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/wire"
)

// setSecret creates or rotates one of the caller's tenant's secrets. The
// answer, as every other, holds the metadata only: 201 for a new secret,
// 200 for a rotation.
func (s *Server) setSecret(w http.ResponseWriter, r *http.Request, p principal) error {
	var req wire.SecretRequest
	if err := decode(r, &req, false); err != nil {
		return err
	}
	sec, err := s.eng.SetSecret(r.Context(), p.tenant, r.PathValue("name"), []byte(req.Value))
	if err != nil {
		return err
	}
	status := http.StatusOK
	if sec.Version == 1 {
		status = http.StatusCreated
	}
	writeJSON(w, status, sec)
	return nil
}

func (s *Server) listSecrets(w http.ResponseWriter, r *http.Request, p principal) error {
	secs, err := s.eng.ListSecrets(r.Context(), p.tenant)
	if err != nil {
		return err
	}
	if secs == nil {
		secs = []torpor.Secret{}
	}
	writeJSON(w, http.StatusOK, wire.SecretList{Secrets: secs})
	return nil
}

func (s *Server) getSecret(w http.ResponseWriter, r *http.Request, p principal) error {
	sec, err := s.eng.GetSecret(r.Context(), p.tenant, r.PathValue("name"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, sec)
	return nil
}

func (s *Server) deleteSecret(w http.ResponseWriter, r *http.Request, p principal) error {
	if err := s.eng.DeleteSecret(r.Context(), p.tenant, r.PathValue("name")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
