package api

import (
	"net/http"

	"github.com/torpor-dev/torpor/api/wire"
)

// listRuntimes serves GET /v1/runtimes: the runtimes sandboxes can ask for
// (by "isolation" or "runtime.kind") and how each can pause.
func (s *Server) listRuntimes(w http.ResponseWriter, r *http.Request, p principal) error {
	writeJSON(w, http.StatusOK, wire.RuntimeList{Runtimes: s.eng.Runtimes()})
	return nil
}
