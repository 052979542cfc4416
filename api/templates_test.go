package api_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/api"
	"github.com/torpor-dev/torpor/api/wire"
	"github.com/torpor-dev/torpor/client"
	"github.com/torpor-dev/torpor/lifecycle"
	"github.com/torpor-dev/torpor/runtime/fake"
	"github.com/torpor-dev/torpor/store/sqlite"
	"github.com/torpor-dev/torpor/template"
)

// tmplFixture is a server with a template manager over a temporary data
// directory, an admin client and a tenant client.
type tmplFixture struct {
	url         string
	admin, acme *client.Client
	adminKey    string
	acmeKey     string
	store       *sqlite.Store
	rootfs      string
}

func newTmplFixture(t *testing.T) *tmplFixture {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	st, err := sqlite.Open(ctx, filepath.Join(dir, "torpor.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	now := time.Now().UTC()
	st.PutTemplate(ctx, torpor.Template{Name: "base", RootFS: "/x", Source: torpor.TemplateSource{Kind: torpor.SourceBuiltin}, CreatedAt: now})
	st.CreateTenant(ctx, torpor.Tenant{Name: "default", CreatedAt: now})
	secret, k := torpor.NewAPIKey("default", true, now)
	if err := st.CreateAPIKey(ctx, k); err != nil {
		t.Fatal(err)
	}
	eng, err := lifecycle.New(lifecycle.Config{Store: st, Runtimes: []torpor.Runtime{fake.New(fake.NewHost())}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(eng.Close)
	if err := eng.Recover(ctx); err != nil {
		t.Fatal(err)
	}
	tm, err := template.New(ctx, template.Config{Store: st, Dir: dir})
	if err != nil {
		t.Fatal(err)
	}
	srv := api.New(api.Config{Engine: eng, Auth: st, Templates: st, TemplateManager: tm})
	srv.SetReady()
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	f := &tmplFixture{url: hs.URL, store: st, adminKey: secret}
	f.admin, _ = client.New(hs.URL, secret)
	kc, err := f.admin.CreateKey(ctx, wire.KeyRequest{Tenant: "acme"})
	if err != nil {
		t.Fatal(err)
	}
	f.acmeKey = kc.Key
	f.acme, _ = client.New(hs.URL, kc.Key)
	f.rootfs = t.TempDir()
	os.MkdirAll(filepath.Join(f.rootfs, "bin"), 0o755)
	os.WriteFile(filepath.Join(f.rootfs, "bin/hello"), []byte("#!/bin/sh\necho hi\n"), 0o755)
	return f
}

func (f *tmplFixture) do(t *testing.T, method, path, key, body string, headers ...string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(method, f.url+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+key)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	for i := 0; i+1 < len(headers); i += 2 {
		req.Header.Set(headers[i], headers[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(resp.Body)
	return resp, string(data)
}

// Bad requests are 4xx naming the field, tenants cannot import or remove,
// and nothing is made.
func TestTemplateRoutesRefuseBadInput(t *testing.T) {
	f := newTmplFixture(t)
	for _, tc := range []struct {
		method, path, key, body string
		status                  int
		param                   string
	}{
		{"POST", "/v1/templates", f.acmeKey, `{"name":"x","rootfs":"/"}`, 403, ""},
		{"POST", "/v1/templates/build", f.acmeKey, `{"name":"x"}`, 403, ""},
		{"DELETE", "/v1/templates/base", f.acmeKey, ``, 403, ""},
		{"POST", "/v1/templates", f.adminKey, `{"name":"x","rootfs":"/","bogus":1}`, 400, "bogus"},
		{"POST", "/v1/templates", f.adminKey, `{"name":"Bad_Name","rootfs":"/"}`, 400, "name"},
		{"POST", "/v1/templates", f.adminKey, `{"name":"x"}`, 400, "image"},
		{"POST", "/v1/templates", f.adminKey, `{"name":"x","rootfs":"rel/path"}`, 400, "rootfs"},
		{"POST", "/v1/templates", f.adminKey, `{"name":"x","rootfs":"/a","image":"b"}`, 400, "rootfs"},
		{"POST", "/v1/templates", f.adminKey, `{"name":"x","rootfs":"/nonexistent/dir"}`, 400, "rootfs"},
		{"POST", "/v1/templates", f.adminKey, `{"name":"x","image":"::not a ref::"}`, 400, "image"},
		{"POST", "/v1/templates", f.adminKey, `{"name":"x","image":"file:///etc/shadow"}`, 400, "image"},
		{"POST", "/v1/templates", f.adminKey, `{"name":"x","image":"file:/etc/shadow"}`, 400, "image"},
		{"POST", "/v1/templates", f.adminKey, `{"name":"x","image":"https://registry.example/app:1"}`, 400, "image"},
		{"POST", "/v1/templates", f.adminKey, `{"name":"x","image":"registry.example:99999/app:1"}`, 400, "image"},
		{"POST", "/v1/templates", f.adminKey, `{"name":"x","name":"y","rootfs":"/nonexistent"}`, 400, "name"},
		{"POST", "/v1/templates", f.adminKey, `{"name":"x","oci_layout":"/nonexistent"}`, 400, "oci_layout"},
		{"POST", "/v1/templates", f.adminKey, `{"name":"x","docker_archive":"/nonexistent.tar"}`, 400, "docker_archive"},
		{"POST", "/v1/templates", f.adminKey, `{"name":"base","rootfs":"` + f.rootfs + `"}`, 409, ""},
		{"POST", "/v1/templates/build", f.adminKey, `{"name":"x","packages":["--oops"]}`, 400, "packages"},
		{"POST", "/v1/templates/build", f.adminKey, `{"name":"x","debian":"../etc"}`, 400, "debian"},
		{"POST", "/v1/templates/build", f.adminKey, `{"name":"x","mirror":"file:///etc"}`, 400, "mirror"},
		{"GET", "/v1/templates/nosuch", f.acmeKey, ``, 404, ""},
		{"DELETE", "/v1/templates/nosuch", f.adminKey, ``, 404, ""},
		{"DELETE", "/v1/templates/base", f.adminKey, ``, 403, ""},
	} {
		resp, body := f.do(t, tc.method, tc.path, tc.key, tc.body)
		var eb struct {
			Error struct{ Code, Param string }
		}
		json.Unmarshal([]byte(body), &eb)
		if resp.StatusCode != tc.status || eb.Error.Param != tc.param {
			t.Errorf("%s %s %s: %d %s, want %d naming %q", tc.method, tc.path, tc.body, resp.StatusCode, body, tc.status, tc.param)
		}
	}
	ts, _ := f.admin.Templates(ctx)
	if len(ts) != 1 {
		t.Errorf("templates after bad requests: %+v", ts)
	}
}

func TestTemplateImportUseAndDelete(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (unpacking sets owners)")
	}
	f := newTmplFixture(t)
	var progress []string
	tpl, err := f.admin.ImportTemplate(ctx, torpor.TemplateImportRequest{Name: "hello", RootFS: f.rootfs,
		TemplateOptions: torpor.TemplateOptions{Env: map[string]string{"GREETING": "hi"}}}, func(l string) { progress = append(progress, l) })
	if err != nil {
		t.Fatal(err)
	}
	if tpl.Name != "hello" || tpl.Source.Kind != torpor.SourceRootFS || tpl.SizeBytes == 0 || len(progress) < 2 {
		t.Errorf("imported %+v, progress %q", tpl, progress)
	}
	// Without streaming the answer is 201 with the template.
	resp, body := f.do(t, "POST", "/v1/templates", f.adminKey, `{"name":"hello2","rootfs":"`+f.rootfs+`"}`)
	if resp.StatusCode != 201 || !strings.Contains(body, `"name":"hello2"`) {
		t.Errorf("plain import: %d %s", resp.StatusCode, body)
	}
	// The template object hides host paths.
	resp, body = f.do(t, "GET", "/v1/templates/hello", f.acmeKey, "")
	if resp.StatusCode != 200 || strings.Contains(body, "layers/sha256") || !strings.Contains(body, `"GREETING":"hi"`) {
		t.Errorf("GET: %d %s", resp.StatusCode, body)
	}
	sb, err := f.acme.Create(ctx, torpor.CreateRequest{Template: "hello"})
	if err != nil {
		t.Fatal(err)
	}
	got, err := f.acme.Template(ctx, "hello")
	if err != nil || got.InUse != 1 {
		t.Errorf("in use %d, %v", got.InUse, err)
	}
	err = f.admin.DeleteTemplate(ctx, "hello")
	if !client.IsConflict(err) || !strings.Contains(err.Error(), sb.ID) {
		t.Errorf("deleting a template in use: %v, want a 409 naming %s", err, sb.ID)
	}
	if _, err := f.acme.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if err := f.admin.DeleteTemplate(ctx, "hello"); err != nil {
		t.Fatalf("deleting an unused template: %v", err)
	}
	if _, err := f.acme.Template(ctx, "hello"); !client.IsNotFound(err) {
		t.Errorf("after delete: %v", err)
	}
	ts, _ := f.acme.Templates(ctx)
	if len(ts) != 2 {
		t.Errorf("templates: %+v", ts)
	}
}

// A streamed import refused before any progress is an ordinary error
// response; the client reports it the same way either way.
func TestTemplateStreamRefusalIsAStatus(t *testing.T) {
	f := newTmplFixture(t)
	resp, body := f.do(t, "POST", "/v1/templates", f.adminKey, `{"name":"base","rootfs":"`+f.rootfs+`"}`, "Accept", "text/event-stream")
	if resp.StatusCode != 409 || !strings.Contains(body, "already exists") {
		t.Errorf("streamed import of an existing name: %d %s", resp.StatusCode, body)
	}
	_, err := f.admin.ImportTemplate(ctx, torpor.TemplateImportRequest{Name: "base", RootFS: f.rootfs}, nil)
	if !client.IsConflict(err) {
		t.Errorf("client: %v", err)
	}
	_, err = f.admin.BuildTemplate(ctx, torpor.TemplateBuildRequest{Name: "x", Packages: []string{"Bad"}}, nil)
	if !client.IsInvalid(err) {
		t.Errorf("client build: %v", err)
	}
}

// in_use counts the sandboxes the caller may see: a tenant its own, an
// admin every tenant's.
func TestTemplateInUseIsPerTenant(t *testing.T) {
	f := newTmplFixture(t)
	kc, err := f.admin.CreateKey(ctx, wire.KeyRequest{Tenant: "other"})
	if err != nil {
		t.Fatal(err)
	}
	other, _ := client.New(f.url, kc.Key)
	for _, cl := range []*client.Client{f.acme, other, other} {
		if _, err := cl.Create(ctx, torpor.CreateRequest{Template: "base"}); err != nil {
			t.Fatal(err)
		}
	}
	gone, err := f.acme.Create(ctx, torpor.CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.acme.Delete(ctx, gone.ID); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		who  string
		cl   *client.Client
		want int
	}{
		{"acme", f.acme, 1},
		{"other", other, 2},
		{"admin", f.admin, 3},
	} {
		ts, err := tc.cl.Templates(ctx)
		if err != nil || len(ts) != 1 || ts[0].InUse != tc.want {
			t.Errorf("%s lists %+v (%v), want base in use %d", tc.who, ts, err, tc.want)
		}
		tpl, err := tc.cl.Template(ctx, "base")
		if err != nil || tpl.InUse != tc.want {
			t.Errorf("%s gets base in use %+v (%v), want %d", tc.who, tpl, err, tc.want)
		}
	}
}

// A registry that cannot be reached is reported by the name the image
// reference gives it, never by the addresses of the server's resolver or
// of what it dialed.
func TestTemplateRegistryErrorsShowNoAddresses(t *testing.T) {
	f := newTmplFixture(t)
	ip := regexp.MustCompile(`\d+\.\d+\.\d+\.\d+|\[[0-9a-fA-F:]+\]`)
	for _, image := range []string{"nosuch.invalid/app:1", "registry.nosuch.invalid:5000/team/app:1"} {
		resp, body := f.do(t, "POST", "/v1/templates", f.adminKey, `{"name":"x","image":"`+image+`"}`)
		if resp.StatusCode != 400 && resp.StatusCode != 503 {
			t.Errorf("%s: %d %s, want 400 or 503", image, resp.StatusCode, body)
		}
		if ip.MatchString(body) || !strings.Contains(body, image) {
			t.Errorf("%s: %s shows an address, or does not name the image", image, body)
		}
	}
}
