package api

import (
	"net/http"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/wire"
)

func (s *Server) listTenants(w http.ResponseWriter, r *http.Request, p principal) error {
	ts, err := s.auth.ListTenants(r.Context())
	if err != nil {
		return err
	}
	if ts == nil {
		ts = []torpor.Tenant{}
	}
	writeJSON(w, http.StatusOK, wire.TenantList{Tenants: ts})
	return nil
}

func (s *Server) createTenant(w http.ResponseWriter, r *http.Request, p principal) error {
	var req wire.TenantRequest
	if err := decode(r, &req, false); err != nil {
		return err
	}
	if err := torpor.ValidateTenantName(req.Name); err != nil {
		return err
	}
	t := torpor.Tenant{Name: req.Name, CreatedAt: s.clock.Now().UTC()}
	if err := s.auth.CreateTenant(r.Context(), t); err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, t)
	return nil
}

// createKey makes an API key for a tenant, creating the tenant when it does
// not exist yet. The secret is in this response only.
func (s *Server) createKey(w http.ResponseWriter, r *http.Request, p principal) error {
	var req wire.KeyRequest
	if err := decode(r, &req, false); err != nil {
		return err
	}
	if err := torpor.ValidateTenantName(req.Tenant); err != nil {
		return err
	}
	if err := torpor.ValidateTier(req.Tier); err != nil {
		return err
	}
	now := s.clock.Now().UTC()
	if _, err := s.auth.GetTenant(r.Context(), req.Tenant); torpor.IsCode(err, torpor.ENotFound) {
		if err := s.auth.CreateTenant(r.Context(), torpor.Tenant{Name: req.Tenant, CreatedAt: now}); err != nil && !torpor.IsCode(err, torpor.EConflict) {
			return err
		}
	} else if err != nil {
		return err
	}
	secret, k := torpor.NewAPIKey(req.Tenant, req.Admin, now)
	if req.Tier != "" {
		k.Tier = req.Tier
	}
	if err := s.auth.CreateAPIKey(r.Context(), k); err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, wire.KeyCreated{APIKey: k, Key: secret})
	return nil
}
