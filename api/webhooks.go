package api

import (
	"net/http"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/wire"
)

func (s *Server) webhookStore() (torpor.WebhookStore, error) {
	if s.hooks == nil {
		return nil, torpor.Errorf(torpor.EUnavailable, "webhooks are not enabled on this server")
	}
	return s.hooks, nil
}

// createWebhook registers an endpoint for the caller's tenant's events. The
// signing secret is in this response only.
func (s *Server) createWebhook(w http.ResponseWriter, r *http.Request, p principal) error {
	st, err := s.webhookStore()
	if err != nil {
		return err
	}
	var req wire.WebhookRequest
	if err := decode(r, &req, false); err != nil {
		return err
	}
	// The address rule, on what the host resolves to now; the delivery
	// client checks again what it dials.
	if err := s.hookGuard.CheckURL(r.Context(), req.URL); err != nil {
		return err
	}
	wh := torpor.Webhook{ID: torpor.NewID("wh_", 16), Tenant: p.tenant, URL: req.URL,
		Secret: "whsec_" + torpor.NewID("", 40), CreatedAt: s.clock.Now().UTC()}
	if err := st.CreateWebhook(r.Context(), wh); err != nil {
		return err
	}
	if s.hooksChanged != nil {
		s.hooksChanged()
	}
	writeJSON(w, http.StatusCreated, wire.WebhookCreated{Webhook: wh, Secret: wh.Secret})
	return nil
}

func (s *Server) listWebhooks(w http.ResponseWriter, r *http.Request, p principal) error {
	st, err := s.webhookStore()
	if err != nil {
		return err
	}
	hooks, err := st.ListWebhooks(r.Context(), p.tenant)
	if err != nil {
		return err
	}
	if hooks == nil {
		hooks = []torpor.Webhook{}
	}
	// Only the caller's tenant's webhooks are listed, so their delivery
	// states are the tenant's too.
	if s.deliveries != nil {
		for i := range hooks {
			d := s.deliveries.WebhookDelivery(r.Context(), hooks[i])
			hooks[i].Delivery = &d
		}
	}
	writeJSON(w, http.StatusOK, wire.WebhookList{Webhooks: hooks})
	return nil
}

func (s *Server) deleteWebhook(w http.ResponseWriter, r *http.Request, p principal) error {
	st, err := s.webhookStore()
	if err != nil {
		return err
	}
	if err := st.DeleteWebhook(r.Context(), p.tenant, r.PathValue("id")); err != nil {
		return err
	}
	if s.hooksChanged != nil {
		s.hooksChanged()
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}
