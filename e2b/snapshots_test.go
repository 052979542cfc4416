package e2b_test

import (
	"net/http"
	"strings"
	"testing"

	"github.com/torpor-dev/torpor"
)

// TestSnapshotsAreCheckpoints: createSnapshot, listSnapshots, create from
// a snapshot (a fork with the create's metadata) and deleteSnapshot, as
// the SDK calls them; another tenant sees none of them.
func TestSnapshotsAreCheckpoints(t *testing.T) {
	f := newFixture(t)
	sb := f.create(`{"templateID":"base"}`)
	r := f.do("POST", "/sandboxes/"+sb.SandboxID+"/snapshots", f.acme, `{"name":"snap1"}`)
	if r.status != http.StatusCreated {
		t.Fatalf("createSnapshot: %d %s", r.status, r.body)
	}
	var snap struct {
		SnapshotID string   `json:"snapshotID"`
		Names      []string `json:"names"`
	}
	r.decode(t, &snap)
	if !strings.HasPrefix(snap.SnapshotID, "snap-"+sb.SandboxID+"-") || len(snap.Names) != 1 || snap.Names[0] != "snap1" {
		t.Fatalf("createSnapshot answered %s", r.body)
	}
	if r := f.do("POST", "/sandboxes/"+sb.SandboxID+"/snapshots", f.acme, `{}`); r.status != http.StatusCreated {
		t.Fatalf("createSnapshot without a name: %d %s", r.status, r.body)
	}
	var list []map[string]any
	f.do("GET", "/snapshots?sandboxID="+sb.SandboxID, f.acme, "").decode(t, &list)
	if len(list) != 2 {
		t.Fatalf("listSnapshots: %v", list)
	}
	if r := f.do("GET", "/snapshots", f.other, ""); strings.Contains(string(r.body), sb.SandboxID) {
		t.Fatalf("another tenant lists the snapshots: %s", r.body)
	}

	r = f.do("POST", "/sandboxes", f.acme, `{"templateID":"`+snap.SnapshotID+`","metadata":{"run":"7"},"timeout":120}`)
	if r.status != http.StatusCreated {
		t.Fatalf("create from the snapshot: %d %s", r.status, r.body)
	}
	var kid struct {
		SandboxID string `json:"sandboxID"`
	}
	r.decode(t, &kid)
	got, err := f.eng.Get(t.Context(), "acme", kid.SandboxID)
	if err != nil {
		t.Fatal(err)
	}
	if got.Metadata[torpor.MetaForkedFrom] != sb.SandboxID || got.Metadata[torpor.MetaForkedFromCheckpoint] != "snap1" || got.Metadata["run"] != "7" || got.EndAt == nil {
		t.Fatalf("the sandbox made from the snapshot: metadata %v, end %v", got.Metadata, got.EndAt)
	}
	if r := f.do("POST", "/sandboxes", f.other, `{"templateID":"`+snap.SnapshotID+`"}`); r.status != http.StatusNotFound {
		t.Fatalf("another tenant's create from the snapshot: %d %s", r.status, r.body)
	}

	if r := f.do("DELETE", "/templates/"+snap.SnapshotID, f.other, ""); r.status != http.StatusNotFound {
		t.Fatalf("another tenant's deleteSnapshot: %d", r.status)
	}
	if r := f.do("DELETE", "/templates/"+snap.SnapshotID, f.acme, ""); r.status != http.StatusNoContent {
		t.Fatalf("deleteSnapshot: %d %s", r.status, r.body)
	}
	if r := f.do("DELETE", "/templates/"+snap.SnapshotID, f.acme, ""); r.status != http.StatusNotFound {
		t.Fatalf("deleteSnapshot again: %d %s", r.status, r.body)
	}
	if r := f.do("DELETE", "/templates/base", f.acme, ""); r.status != http.StatusNotFound {
		t.Fatalf("deleteSnapshot of a template: %d %s", r.status, r.body)
	}
}
