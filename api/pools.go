package api

import (
	"net/http"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/wire"
)

// listPools shows the node's warm pools (docs/pools.md): sizes and
// counts, aggregate figures with no sandbox ids, like /metrics.
func (s *Server) listPools(w http.ResponseWriter, r *http.Request, p principal) error {
	pools := s.eng.Pools()
	if !p.admin {
		// A refill's error can name a member or carry a runtime's words
		// about the host: it is the operator's to read.
		for i := range pools {
			pools[i].LastError = ""
		}
	}
	writeJSON(w, http.StatusOK, wire.PoolList{Pools: pools})
	return nil
}

// setPool sets a template's warm pool (admin): {"size": N}, 0 turns the
// pool off, and "allow_internet" whether its members reach the internet.
// The size is stored and outlives a restart; the refill runs in the
// background.
func (s *Server) setPool(w http.ResponseWriter, r *http.Request, p principal) error {
	var req torpor.PoolRequest
	if err := decode(r, &req, false); err != nil {
		return err
	}
	if req.Size == nil {
		return torpor.Invalid("size", "size is required (0 turns the pool off)")
	}
	st, err := s.eng.SetPool(r.Context(), r.PathValue("template"), *req.Size, req.AllowInternet)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, st)
	return nil
}
