package e2b

import (
	"bytes"
	"io"
	"net/http"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/jsonbody"
	"github.com/torpor-dev/torpor/fleet"
)

// In a fleet (docs/fleet.md) any node answers E2B's control plane for
// every sandbox, as the native API does (api/fleet.go): a request for a
// sandbox of another node, or a create placed on another node, is
// forwarded to it with the key's principal signed in place of the key,
// and a request that arrived so is served here. (envd and the sandbox's
// ports are the port proxy's, which forwards by itself.)

// sent is who sent a request, for a create's forward.
type sent struct {
	key       *torpor.APIKey
	forwarded bool
}

type sentKey struct{}

// whoSent is the key of a request: the identity another node signed
// (forwarded), or else the request's own key.
func (a *API) whoSent(r *http.Request, from fleet.Identity, forwarded bool) (*torpor.APIKey, error) {
	if !forwarded {
		return a.authenticate(r)
	}
	if from.Tenant == "" {
		return nil, torpor.Errorf(torpor.EUnauthenticated, "the request of node %s acts for no tenant", from.Node)
	}
	return &torpor.APIKey{ID: from.KeyID, Tenant: from.Tenant, Tier: from.Tier, Admin: from.Admin}, nil
}

func identity(k *torpor.APIKey) fleet.Identity {
	return fleet.Identity{Tenant: k.Tenant, KeyID: k.ID, Tier: k.Tier, Admin: k.Admin}
}

// toOwner forwards a request for a sandbox that another node owns to that
// node, and tells whether it did (err is then the answer when the node
// could not be reached, or when a forwarded request finds that the
// sandbox moved on). An unknown sandbox stays here: the handler answers
// as it does for any sandbox the key cannot see.
func (a *API) toOwner(w http.ResponseWriter, r *http.Request, k *torpor.APIKey, forwarded bool) (bool, error) {
	id := sandboxID(r)
	to, err := a.router.Route(r.Context(), k.Tenant, id)
	switch {
	case torpor.IsCode(err, torpor.ENotFound):
		return false, nil
	case err != nil:
		return true, err
	case to.Local:
		return false, nil
	case forwarded:
		return true, fleet.OwnerMoved(id, to.Node.Name)
	}
	return true, a.fleet.Forward(w, r, to.Node, fleet.API, identity(k))
}

// keepBody reads the body of a create that this node may forward, and
// leaves it to be read again (by the handler, then by the forward); nil
// when the create stays here: no fleet, a create forwarded here, or a
// body over the limit, which the handler refuses.
func (a *API) keepBody(r *http.Request) []byte {
	s, _ := r.Context().Value(sentKey{}).(sent)
	if a.fleet == nil || s.key == nil || s.forwarded {
		return nil
	}
	body, ok := fleet.KeepBody(r, jsonbody.DefaultLimit)
	if !ok {
		return nil
	}
	return body
}

// placeCreate asks the engine where a create goes, and forwards it (its
// body as it came) when that is another node: true then, with the
// answer's error if the node could not be reached.
func (a *API) placeCreate(w http.ResponseWriter, r *http.Request, req torpor.CreateRequest, body []byte) (bool, error) {
	to, err := a.router.PlaceCreate(r.Context(), req)
	switch {
	case err != nil:
		return true, err
	case to.Local:
		return false, nil
	}
	s, _ := r.Context().Value(sentKey{}).(sent)
	r.Body = io.NopCloser(bytes.NewReader(body))
	return true, a.fleet.Forward(w, r, to.Node, fleet.API, identity(s.key))
}
