package api_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/torpor-dev/torpor"
)

// The volumes routes: create (201; 409 on a taken name; 400 on a bad name
// or size), list, get (with mounted_by), grow (never shrink), files in and
// out confined to the volume, a create that mounts it (checked at the
// edge), delete refused while mounted; B sees none of A's (404, as an
// unknown name), and an admin acts as A with ?tenant=.
func TestVolumesRoutes(t *testing.T) {
	keys := newPrincipals()
	t.Cleanup(keys.remove)
	l := newListener(t, t.TempDir(), keys)
	t.Cleanup(l.close)
	do := func(key, method, target, ctype, body string, want int) string {
		t.Helper()
		rec := l.do(key, method, target, ctype, []byte(body))
		if rec.Code != want {
			t.Fatalf("%s %s: %d %s, want %d", method, target, rec.Code, rec.Body, want)
		}
		return rec.Body.String()
	}
	var v torpor.Volume
	if err := json.Unmarshal([]byte(do(keys.a, "POST", "/v1/volumes", jsonType, `{"name":"data","size_mib":64}`, 201)), &v); err != nil || v.Name != "data" || v.SizeMiB != 64 || v.Tenant != tenantA {
		t.Fatalf("create answered %+v, %v", v, err)
	}
	do(keys.a, "POST", "/v1/volumes", jsonType, `{"name":"data","size_mib":64}`, 409)
	do(keys.a, "POST", "/v1/volumes", jsonType, `{"name":"Bad/Name","size_mib":64}`, 400)
	do(keys.a, "POST", "/v1/volumes", jsonType, `{"name":"tiny","size_mib":1}`, 400)
	do(keys.a, "POST", "/v1/volumes", jsonType, `{"name":"x","size_mib":64,"extra":1}`, 400)

	// Seed a file; it reads back; paths that climb stay inside.
	do(keys.a, "PUT", "/v1/volumes/data/files?path=/in/seed.txt", "application/octet-stream", "seeded", 200)
	if got := do(keys.a, "GET", "/v1/volumes/data/files?path=/in/seed.txt", "", "", 200); got != "seeded" {
		t.Fatalf("read back %q", got)
	}
	if got := do(keys.a, "GET", "/v1/volumes/data/files?path=/../../in/seed.txt", "", "", 200); got != "seeded" {
		t.Fatalf("a path that climbs above the root stays at the root: %q", got)
	}
	if got := do(keys.a, "GET", "/v1/volumes/data/files/list?path=/", "", "", 200); !strings.Contains(got, "/in") || strings.Contains(got, "lost+found") {
		t.Fatalf("list of the root: %s", got)
	}
	// B sees nothing of it.
	for _, rt := range []struct{ method, target, ctype, body string }{
		{"GET", "/v1/volumes/data", "", ""},
		{"PATCH", "/v1/volumes/data", jsonType, `{"size_mib":128}`},
		{"DELETE", "/v1/volumes/data", "", ""},
		{"GET", "/v1/volumes/data/files?path=/in/seed.txt", "", ""},
		{"PUT", "/v1/volumes/data/files?path=/b.txt", "application/octet-stream", "b"},
	} {
		do(keys.b, rt.method, rt.target, rt.ctype, rt.body, 404)
	}
	if got := do(keys.b, "GET", "/v1/volumes", "", "", 200); got != `{"volumes":[]}`+"\n" {
		t.Fatalf("B's list: %s", got)
	}
	do(keys.b, "POST", "/v1/sandboxes", jsonType, `{"template":"base","volume_mounts":[{"name":"data","path":"/data"}]}`, 400)

	// Mount checks at the edge.
	for _, p := range []string{"data", "/", "/proc", "/sys/x", "/dev", "/a/../b", "/a//b"} {
		do(keys.a, "POST", "/v1/sandboxes", jsonType, `{"template":"base","volume_mounts":[{"name":"data","path":"`+p+`"}]}`, 400)
	}
	var sb torpor.Sandbox
	_ = json.Unmarshal([]byte(do(keys.a, "POST", "/v1/sandboxes", jsonType, `{"template":"base","volume_mounts":[{"name":"data","path":"/data","read_only":true}]}`, 201)), &sb)
	if len(sb.VolumeMounts) != 1 || sb.VolumeMounts[0] != (torpor.VolumeMount{Name: "data", Path: "/data", ReadOnly: true}) {
		t.Fatalf("the sandbox's volume_mounts: %+v", sb.VolumeMounts)
	}
	_ = json.Unmarshal([]byte(do(keys.admin, "GET", "/v1/volumes/data?tenant="+tenantA, "", "", 200)), &v)
	if len(v.MountedBy) != 1 || v.MountedBy[0] != sb.ID || v.UsedBytes == nil {
		t.Fatalf("get: %+v", v)
	}
	do(keys.a, "PATCH", "/v1/volumes/data", jsonType, `{"size_mib":32}`, 400)
	_ = json.Unmarshal([]byte(do(keys.a, "PATCH", "/v1/volumes/data", jsonType, `{"size_mib":128}`, 200)), &v)
	if v.SizeMiB != 128 {
		t.Fatalf("grown: %+v", v)
	}
	if got := do(keys.a, "DELETE", "/v1/volumes/data", "", "", 409); !strings.Contains(got, sb.ID) {
		t.Fatalf("delete while mounted: %s", got)
	}
	do(keys.a, "DELETE", "/v1/sandboxes/"+sb.ID, "", "", 200)
	do(keys.a, "DELETE", "/v1/volumes/data", "", "", 204)
	do(keys.a, "GET", "/v1/volumes/data", "", "", 404)
	if got := do(keys.a, "GET", "/v1/volumes", "", "", 200); got != `{"volumes":[]}`+"\n" {
		t.Fatalf("list after the delete: %s", got)
	}
}
