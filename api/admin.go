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
	for i := range ts {
		ts[i] = s.tenantView(ts[i])
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
	if req.Quota != nil {
		if err := req.Quota.Validate(); err != nil {
			return err
		}
		t.Quota = *req.Quota
	}
	if err := s.auth.CreateTenant(r.Context(), t); err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, s.tenantView(t))
	return nil
}

// updateTenant changes a tenant's quota: the quota fields the body names
// are replaced (0 removes that limit), the others kept.
func (s *Server) updateTenant(w http.ResponseWriter, r *http.Request, p principal) error {
	var req wire.TenantUpdate
	if err := decode(r, &req, false); err != nil {
		return err
	}
	name := r.PathValue("name")
	t, err := s.auth.GetTenant(r.Context(), name)
	if err != nil {
		return err
	}
	if req.Quota != nil {
		q := req.Quota.Apply(t.Quota)
		if err := q.Validate(); err != nil {
			return err
		}
		if err := s.auth.SetTenantQuota(r.Context(), name, q); err != nil {
			return err
		}
		t.Quota = q
	}
	writeJSON(w, http.StatusOK, s.tenantView(*t))
	return nil
}

// tenantView is a tenant as the API shows it: with what its sandboxes
// hold against its quota.
func (s *Server) tenantView(t torpor.Tenant) torpor.Tenant {
	u := s.eng.TenantUsage(t.Name)
	t.Usage = &u
	return t
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
