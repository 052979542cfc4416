package e2b_test

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/torpor-dev/torpor/e2b"
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

func (f *fixture) doBearer(method, path, token, body string) reply {
	f.t.Helper()
	req, _ := http.NewRequest(method, f.url+path, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		f.t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, header: resp.Header, body: data}
}

type e2bVolume struct {
	VolumeID string `json:"volumeID"`
	Name     string `json:"name"`
	Token    string `json:"token"`
}

// The SDK's Volume class: create, getInfo (by id or name), list and
// destroy work on the tenant's volumes, the native ones included; its
// file calls, with the volume's token, read and write the volume's
// files; a token opens its volume only, and another tenant finds nothing.
func TestVolumeClass(t *testing.T) {
	f := newFixture(t)
	f.host.FilesDir = t.TempDir()
	r := f.do("POST", "/volumes", f.acme, `{"name":"data"}`)
	if r.status != 201 {
		t.Fatalf("create: %d %s", r.status, r.body)
	}
	var v e2bVolume
	r.decode(t, &v)
	if !strings.HasPrefix(v.VolumeID, "vol_") || v.Name != "data" || v.Token == "" {
		t.Fatalf("create = %+v", v)
	}
	if nv, err := f.eng.GetVolume(ctx, "acme", "data"); err != nil || nv.ID != v.VolumeID || nv.SizeMiB != e2b.DefaultVolumeMiB {
		t.Fatalf("the native volume: %+v %v", nv, err)
	}
	if r := f.do("POST", "/volumes", f.acme, `{"name":"data"}`); r.status != 409 {
		t.Fatalf("second create: %d %s", r.status, r.body)
	}
	if _, err := f.eng.CreateVolume(ctx, "acme", "native", 32); err != nil {
		t.Fatal(err)
	}
	r = f.do("GET", "/volumes", f.acme, "")
	if r.status != 200 || !strings.Contains(string(r.body), `"name":"native"`) || !strings.Contains(string(r.body), `"volumeID":"`+v.VolumeID+`"`) {
		t.Fatalf("list: %d %s", r.status, r.body)
	}
	for _, ref := range []string{v.VolumeID, "data"} {
		var got e2bVolume
		r = f.do("GET", "/volumes/"+ref, f.acme, "")
		r.decode(t, &got)
		if r.status != 200 || got.VolumeID != v.VolumeID || got.Token != v.Token {
			t.Fatalf("getInfo %s: %d %s", ref, r.status, r.body)
		}
	}
	// The other tenant sees none of it.
	if r := f.do("GET", "/volumes/"+v.VolumeID, f.other, ""); r.status != 404 {
		t.Fatalf("other's getInfo: %d %s", r.status, r.body)
	}
	if r := f.do("GET", "/volumes", f.other, ""); r.status != 200 || string(r.body) != "[]\n" {
		t.Fatalf("other's list: %d %s", r.status, r.body)
	}
	if r := f.do("GET", "/volumecontent/"+v.VolumeID+"/path?path=/", f.other, ""); r.status != 404 {
		t.Fatalf("other's key on the content: %d %s", r.status, r.body)
	}
	if r := f.do("DELETE", "/volumes/"+v.VolumeID, f.other, ""); r.status != 404 {
		t.Fatalf("other's destroy: %d %s", r.status, r.body)
	}

	c := "/volumecontent/" + v.VolumeID
	if r := f.doBearer("PUT", c+"/file?path=/dir/a.txt&mode=384", v.Token, "hello"); r.status != 200 || !strings.Contains(string(r.body), `"type":"file"`) || !strings.Contains(string(r.body), `"mode":384`) {
		t.Fatalf("writeFile: %d %s", r.status, r.body)
	}
	if r := f.doBearer("GET", c+"/file?path=dir/a.txt", v.Token, ""); r.status != 200 || string(r.body) != "hello" {
		t.Fatalf("readFile: %d %s", r.status, r.body)
	}
	fsys, err := f.eng.VolumeFS(ctx, "acme", "data")
	if err != nil {
		t.Fatal(err)
	}
	if i, err := fsys.Stat("/dir/a.txt"); err != nil || i.Size != 5 {
		t.Fatalf("the file through the native volume: %+v %v", i, err)
	}
	fsys.Close()
	if r := f.doBearer("POST", c+"/dir?path=/x/y&force=true", v.Token, ""); r.status != 201 || !strings.Contains(string(r.body), `"type":"directory"`) {
		t.Fatalf("makeDir: %d %s", r.status, r.body)
	}
	r = f.doBearer("GET", c+"/dir?path=/&depth=2", v.Token, "")
	if r.status != 200 || !strings.Contains(string(r.body), `"path":"/dir/a.txt"`) || !strings.Contains(string(r.body), `"path":"/x/y"`) {
		t.Fatalf("list: %d %s", r.status, r.body)
	}
	if r := f.doBearer("PATCH", c+"/path?path=/dir/a.txt", v.Token, `{"mode":420}`); r.status != 200 || !strings.Contains(string(r.body), `"mode":420`) {
		t.Fatalf("updateMetadata: %d %s", r.status, r.body)
	}
	if r := f.doBearer("GET", c+"/path?path=/nope", v.Token, ""); r.status != 404 {
		t.Fatalf("getInfo of a missing path: %d %s", r.status, r.body)
	}
	if r := f.doBearer("GET", c+"/file?path=/../../etc/passwd", v.Token, ""); r.status != 404 {
		t.Fatalf("a path climbing out: %d %s", r.status, r.body)
	}
	if r := f.doBearer("DELETE", c+"/path?path=/dir", v.Token, ""); r.status != 204 {
		t.Fatalf("remove: %d %s", r.status, r.body)
	}
	if r := f.doBearer("GET", c+"/path?path=/dir", v.Token, ""); r.status != 404 {
		t.Fatalf("getInfo after remove: %d %s", r.status, r.body)
	}
	// A token opens its own volume only; a forged one nothing.
	nat := f.do("GET", "/volumes/native", f.acme, "")
	var nv e2bVolume
	nat.decode(t, &nv)
	if r := f.doBearer("GET", "/volumecontent/"+nv.VolumeID+"/path?path=/", v.Token, ""); r.status != 401 {
		t.Fatalf("data's token on native: %d %s", r.status, r.body)
	}
	if r := f.doBearer("GET", c+"/path?path=/", v.Token+"x", ""); r.status != 401 {
		t.Fatalf("a forged token: %d %s", r.status, r.body)
	}
	if r := f.doBearer("GET", c+"/path?path=/", "", ""); r.status != 401 {
		t.Fatalf("no token: %d %s", r.status, r.body)
	}
	// The tenant's API key opens it too.
	if r := f.do("GET", c+"/path?path=/", f.acme, ""); r.status != 200 {
		t.Fatalf("the API key on the content: %d %s", r.status, r.body)
	}
	if r := f.do("DELETE", "/volumes/"+v.VolumeID, f.acme, ""); r.status != 204 {
		t.Fatalf("destroy: %d %s", r.status, r.body)
	}
	if r := f.do("DELETE", "/volumes/"+v.VolumeID, f.acme, ""); r.status != 404 {
		t.Fatalf("second destroy: %d %s", r.status, r.body)
	}
	if r := f.doBearer("GET", c+"/path?path=/", v.Token, ""); r.status != 404 {
		t.Fatalf("the token of a deleted volume: %d %s", r.status, r.body)
	}
}
