package api_test

import (
	"net/http"
	"testing"

	"github.com/torpor-dev/torpor"
)

// TestCheckpointsThroughTheClient: checkpoints, fork and restore through
// the Go client, and their refusals through the raw API.
func TestCheckpointsThroughTheClient(t *testing.T) {
	f := newFixture(t)
	cl := f.tenantCl
	sb, err := cl.Create(ctx, torpor.CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	cp, err := cl.CreateCheckpoint(ctx, sb.ID, "one")
	if err != nil || cp.Name != "one" || cp.State != torpor.CheckpointReady {
		t.Fatalf("checkpoint: %+v %v", cp, err)
	}
	if _, err := cl.CreateCheckpoint(ctx, sb.ID, "one"); !torpor.IsCode(err, torpor.EConflict) {
		t.Fatalf("a taken name: %v", err)
	}
	if list, err := cl.Checkpoints(ctx, sb.ID); err != nil || len(list) != 1 {
		t.Fatalf("list: %v %v", list, err)
	}
	if _, err := cl.Checkpoint(ctx, sb.ID, "two"); !torpor.IsCode(err, torpor.ENotFound) {
		t.Fatalf("a missing checkpoint: %v", err)
	}
	res, err := cl.Fork(ctx, sb.ID, torpor.ForkRequest{Count: 2, Checkpoint: "one"})
	if err != nil || len(res.Sandboxes) != 2 || res.ProcessesCarried {
		t.Fatalf("fork: %+v %v", res, err)
	}
	for _, k := range res.Sandboxes {
		if k.Metadata[torpor.MetaForkedFrom] != sb.ID || k.Metadata[torpor.MetaForkedFromCheckpoint] != "one" {
			t.Fatalf("fork's metadata %v", k.Metadata)
		}
	}
	if got, err := cl.Restore(ctx, sb.ID, "one"); err != nil || got.State != torpor.StateRunning {
		t.Fatalf("restore: %+v %v", got, err)
	}
	if err := cl.DeleteCheckpoint(ctx, sb.ID, "one"); err != nil {
		t.Fatal(err)
	}
	base := "/v1/sandboxes/" + sb.ID
	for _, c := range []struct {
		method, path, body string
		want               int
		param              string
	}{
		{"POST", base + "/checkpoints", `{"name":"../x"}`, http.StatusBadRequest, "name"},
		{"POST", base + "/checkpoints", `{}`, http.StatusBadRequest, "name"},
		{"POST", base + "/fork", `{"count":0}`, http.StatusBadRequest, "count"},
		{"POST", base + "/fork", `{"count":17}`, http.StatusBadRequest, "count"},
		{"POST", base + "/fork", `{"count":1,"checkpoint":"one"}`, http.StatusNotFound, ""},
		{"POST", base + "/restore", `{"checkpoint":"one"}`, http.StatusNotFound, ""},
		{"DELETE", base + "/checkpoints/one", ``, http.StatusNotFound, ""},
	} {
		code, eb := f.raw(t, c.method, c.path, f.acmeKey, "application/json", c.body)
		if code != c.want || eb.Error.Param != c.param {
			t.Errorf("%s %s %s: %d %+v, want %d (param %q)", c.method, c.path, c.body, code, eb, c.want, c.param)
		}
	}
	if code, _ := f.raw(t, "POST", base+"/fork", f.acmeKey, "application/json", ``); code != http.StatusCreated {
		t.Errorf("a fork with no body (one, of the disk as it is): %d", code)
	}
}
