package e2b_test

import (
	"strings"
	"testing"
)

// volumeMounts at create mount the tenant's volumes (read-write), and
// the sandbox's answers list them as E2B's {name, path}; another
// tenant's volume is not there for a create.
func TestCreateWithVolumeMounts(t *testing.T) {
	f := newFixture(t)
	f.host.FilesDir = t.TempDir()
	if _, err := f.eng.CreateVolume(ctx, "acme", "data", 32); err != nil {
		t.Fatal(err)
	}
	body := `{"templateID":"base","volumeMounts":[{"name":"data","path":"/mnt/data"}]}`
	r := f.do("POST", "/v2/sandboxes", f.acme, body)
	if r.status != 201 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	var c created
	r.decode(t, &c)
	if got := f.host.Spec(c.SandboxID).Volumes; len(got) != 1 || got[0].Path != "/mnt/data" || got[0].ReadOnly {
		t.Fatalf("the boot's volumes: %+v", got)
	}
	r = f.do("GET", "/sandboxes/"+c.SandboxID, f.acme, "")
	if r.status != 200 || !strings.Contains(string(r.body), `"volumeMounts":[{"name":"data","path":"/mnt/data"}]`) {
		t.Fatalf("detail: %d %s", r.status, r.body)
	}
	if r := f.do("POST", "/v2/sandboxes", f.other, body); r.status != 400 {
		t.Fatalf("the other tenant's create mounting acme's volume: %d %s", r.status, r.body)
	}
}
