package api

import (
	"net/http"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/wire"
)

// The volumes routes (docs/volumes.md). A volume's files are served by
// the files handlers (files.go) under /v1/volumes/{name}/files, with the
// same confinement: withFiles opens the volume instead of a sandbox.

func (s *Server) createVolume(w http.ResponseWriter, r *http.Request, p principal) error {
	var req wire.VolumeRequest
	if err := decode(r, &req, false); err != nil {
		return err
	}
	v, err := s.eng.CreateVolume(r.Context(), p.tenant, req.Name, req.SizeMiB)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, v)
	return nil
}

func (s *Server) listVolumes(w http.ResponseWriter, r *http.Request, p principal) error {
	vs, err := s.eng.ListVolumes(r.Context(), p.tenant)
	if err != nil {
		return err
	}
	if vs == nil {
		vs = []torpor.Volume{}
	}
	writeJSON(w, http.StatusOK, wire.VolumeList{Volumes: vs})
	return nil
}

func (s *Server) getVolume(w http.ResponseWriter, r *http.Request, p principal) error {
	v, err := s.eng.GetVolume(r.Context(), p.tenant, r.PathValue("name"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, v)
	return nil
}

func (s *Server) resizeVolume(w http.ResponseWriter, r *http.Request, p principal) error {
	var req wire.VolumeResize
	if err := decode(r, &req, false); err != nil {
		return err
	}
	v, err := s.eng.ResizeVolume(r.Context(), p.tenant, r.PathValue("name"), req.SizeMiB)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, v)
	return nil
}

func (s *Server) deleteVolume(w http.ResponseWriter, r *http.Request, p principal) error {
	if err := s.eng.DeleteVolume(r.Context(), p.tenant, r.PathValue("name")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
