package api

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/jsonbody"
	"github.com/torpor-dev/torpor/fleet"
	"github.com/torpor-dev/torpor/lifecycle"
)

// In a fleet (docs/fleet.md) any node answers every request: one for a
// sandbox that another node owns, or a create placed on another node, is
// forwarded to it (fleet.Forward) once this node has authenticated the
// user, with the user's principal signed in place of the key. A request
// that arrived so is served here, whatever the engine says: it is never
// forwarded again.

// arrival is what Verify said of a request's fleet headers.
type arrival struct {
	id  fleet.Identity
	ok  bool
	err error
}

type arrivalKey struct{}

// checkFleet removes the fleet headers of a request that has any, and
// remembers whether they were a valid signature of another node.
func (s *Server) checkFleet(r *http.Request) *http.Request {
	if !fleet.Present(r.Header) {
		return r
	}
	id, ok, err := s.fleet.Verify(r)
	return r.WithContext(context.WithValue(r.Context(), arrivalKey{}, arrival{id: id, ok: ok, err: err}))
}

// whoSent is the principal of a request, and whether another node
// forwarded it: the identity that node signed, or else the request's own
// key or session.
func (s *Server) whoSent(r *http.Request) (principal, bool, error) {
	a, _ := r.Context().Value(arrivalKey{}).(arrival)
	switch {
	case a.err != nil:
		return principal{}, false, a.err
	case !a.ok:
		p, err := s.authenticate(r.Context(), r)
		return p, false, err
	case a.id.Tenant == "":
		return principal{}, false, torpor.Errorf(torpor.EUnauthenticated, "the request of node %s acts for no tenant", a.id.Node)
	}
	return principal{tenant: a.id.Tenant, admin: a.id.Admin, tier: a.id.Tier, keyID: a.id.KeyID}, true, nil
}

// identity is the principal as another node is told it.
func (p principal) identity() fleet.Identity {
	return fleet.Identity{Tenant: p.tenant, KeyID: p.keyID, Tier: p.tier, Admin: p.admin}
}

// toOwner forwards a request for a sandbox of another node, or a create
// placed on another node, to that node, and tells whether it did (err is
// then the answer when the node could not be reached). who is the
// principal that authenticated the request, p the one it acts as.
func (s *Server) toOwner(w http.ResponseWriter, r *http.Request, rt route, who, p principal, forwarded bool) (bool, error) {
	var to lifecycle.Route
	var err error
	switch {
	case strings.HasPrefix(rt.path, "/v1/sandboxes/{id}"):
		tenant := p.tenant
		if tenant == lifecycle.AllTenants {
			tenant = ""
		}
		to, err = s.router.Route(r.Context(), tenant, r.PathValue("id"))
	case rt.method == http.MethodPost && rt.path == "/v1/sandboxes" && !forwarded:
		// The node that forwarded a create placed it here.
		to, err = s.placeCreate(r)
	default:
		return false, nil
	}
	switch {
	case torpor.IsCode(err, torpor.ENotFound):
		// The handler answers as it does for any sandbox it cannot see.
		return false, nil
	case err != nil:
		return true, err
	case to.Local:
		return false, nil
	case forwarded:
		return true, fleet.OwnerMoved(r.PathValue("id"), to.Node.Name)
	}
	return true, s.fleet.Forward(w, r, to.Node, fleet.API, who.identity())
}

// placeCreate reads a create's body, which it leaves for the handler or
// the forward to read again, and asks the engine where the sandbox goes.
// A body that does not decode stays here: the handler answers why.
func (s *Server) placeCreate(r *http.Request) (lifecycle.Route, error) {
	local := lifecycle.Route{Local: true}
	body, ok := fleet.KeepBody(r, jsonbody.DefaultLimit)
	if !ok {
		return local, nil
	}
	var req torpor.CreateRequest
	probe := &http.Request{Header: r.Header, Body: io.NopCloser(bytes.NewReader(body))}
	if err := decode(probe, &req, false); err != nil {
		return local, nil
	}
	return s.router.PlaceCreate(r.Context(), req)
}
