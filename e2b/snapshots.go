package e2b

import (
	"net/http"
	"strings"

	"github.com/torpor-dev/torpor"
)

// E2B's snapshots are torpor's checkpoints (docs/fork.md): a snapshot's
// id is snap-<sandbox id>-<checkpoint name> (sandbox ids hold no '-'), the
// SDK's Sandbox.create(snapshotId) forks one sandbox from it, and
// deleteSnapshot (DELETE /templates/{id}) removes the checkpoint.

const snapshotPrefix = "snap-"

func snapshotID(sandbox, name string) string { return snapshotPrefix + sandbox + "-" + name }

// parseSnapshotID splits a snapshot id; ok is false for any other id.
func parseSnapshotID(s string) (sandbox, name string, ok bool) {
	rest, found := strings.CutPrefix(s, snapshotPrefix)
	if !found {
		return "", "", false
	}
	sandbox, name, ok = strings.Cut(rest, "-")
	return sandbox, name, ok && torpor.ValidID(sandbox) && torpor.ValidCheckpointName(name)
}

// snapshotInfo is E2B's SnapshotInfo.
type snapshotInfo struct {
	SnapshotID string   `json:"snapshotID"`
	Names      []string `json:"names"`
}

func (a *API) createSnapshot(w http.ResponseWriter, r *http.Request, tenant string, _ torpor.Caller) error {
	var body struct {
		Name *string `json:"name"`
	}
	if _, err := decode(r, &body); err != nil {
		return err
	}
	id := sandboxID(r)
	if _, err := a.load(r.Context(), tenant, id); err != nil {
		return err
	}
	name := torpor.NewID("snap_", 10)
	if body.Name != nil && *body.Name != "" {
		name = *body.Name
	}
	cp, err := a.eng.CreateCheckpoint(r.Context(), tenant, id, name)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, snapshotInfo{SnapshotID: snapshotID(id, cp.Name), Names: []string{cp.Name}})
	return nil
}

func (a *API) listSnapshots(w http.ResponseWriter, r *http.Request, tenant string, _ torpor.Caller) error {
	q := r.URL.Query()
	var ids []string
	if id := q.Get("sandboxID"); id != "" {
		id, _, _ = strings.Cut(id, "-")
		if _, err := a.load(r.Context(), tenant, id); err != nil {
			if torpor.IsCode(err, torpor.ENotFound) {
				writeJSON(w, http.StatusOK, []snapshotInfo{})
				return nil
			}
			return err
		}
		ids = append(ids, id)
	} else {
		sbs, err := a.eng.List(r.Context(), tenant, torpor.SandboxFilter{})
		if err != nil {
			return err
		}
		for _, sb := range sbs {
			if len(sb.Checkpoints) > 0 {
				ids = append(ids, sb.ID)
			}
		}
	}
	out := []snapshotInfo{}
	for _, id := range ids {
		cps, err := a.eng.Checkpoints(r.Context(), tenant, id)
		if err != nil {
			return err
		}
		for _, cp := range cps {
			if n := q.Get("name"); n != "" && n != cp.Name {
				continue
			}
			out = append(out, snapshotInfo{SnapshotID: snapshotID(id, cp.Name), Names: []string{cp.Name}})
		}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// deleteTemplate deletes a snapshot (the SDK's deleteSnapshot); the
// templates themselves are the operator's: any other id is not found.
func (a *API) deleteTemplate(w http.ResponseWriter, r *http.Request, tenant string, _ torpor.Caller) error {
	id := r.PathValue("templateID")
	sb, name, ok := parseSnapshotID(id)
	if !ok {
		return torpor.Errorf(torpor.ENotFound, "no snapshot %q (templates are managed through torpor's own API)", id)
	}
	if _, err := a.load(r.Context(), tenant, sb); err != nil {
		return err
	}
	if err := a.eng.DeleteCheckpoint(r.Context(), tenant, sb, name); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// createFromSnapshot is a create whose templateID is a snapshot: one fork
// of the snapshot's sandbox from its checkpoint, with the create's
// metadata, environment and timeout.
func (a *API) createFromSnapshot(w http.ResponseWriter, r *http.Request, tenant string, req torpor.CreateRequest, sandbox, name string) error {
	if _, err := a.load(r.Context(), tenant, sandbox); err != nil {
		return err
	}
	pol := req.PolicyRequest
	res, err := a.eng.Fork(r.Context(), tenant, sandbox, torpor.ForkRequest{Count: 1, Checkpoint: name, Metadata: req.Metadata, Env: req.Env, Policy: &pol})
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, a.answer(res.Sandboxes[0]))
	return nil
}
