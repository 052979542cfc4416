package api

import (
	"context"
	"net/http"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api/wire"
)

// listNodes shows the fleet's nodes (admin): their addresses, labels,
// capacity and sandbox counts are the operator's business, not a
// tenant's.
func (s *Server) listNodes(w http.ResponseWriter, r *http.Request, p principal) error {
	nodes, err := s.nodes(r.Context())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, wire.NodeList{Nodes: nodes})
	return nil
}

// drainNode asks a node to move its sandboxes away and take no new ones
// (admin), and answers the node as it is then: draining, its sandboxes
// not yet moved (torpor nodes drain follows the counts).
func (s *Server) drainNode(w http.ResponseWriter, r *http.Request, p principal) error {
	return s.nodeVerb(w, r, s.eng.DrainNode)
}

// undrainNode lets a draining node take sandboxes again (admin).
func (s *Server) undrainNode(w http.ResponseWriter, r *http.Request, p principal) error {
	return s.nodeVerb(w, r, s.eng.UndrainNode)
}

func (s *Server) nodeVerb(w http.ResponseWriter, r *http.Request, fn func(context.Context, string) (torpor.Node, error)) error {
	if err := decode(r, &struct{}{}, true); err != nil {
		return err
	}
	n, err := fn(r.Context(), r.PathValue("name"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, wire.NewNode(n, n.Name == s.eng.Self()))
	return nil
}

// nodes are the engine's nodes as the API shows them, the answering one
// marked self.
func (s *Server) nodes(ctx context.Context) ([]wire.Node, error) {
	nodes, err := s.eng.Nodes(ctx)
	if err != nil {
		return nil, err
	}
	self := s.eng.Self()
	out := make([]wire.Node, 0, len(nodes))
	for _, n := range nodes {
		out = append(out, wire.NewNode(n, n.Name == self))
	}
	return out, nil
}
