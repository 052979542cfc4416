package storetest

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

func templateTests() []test {
	return []test{
		{"PutThenGet", testTemplateRoundTrip},
		{"PutReplaces", testTemplateReplace},
		{"GetMissingIsNotFound", testTemplateMissing},
		{"ListSortedByName", testTemplateList},
		{"EveryFieldRoundTrips", testTemplateFullRoundTrip},
		{"InUseCountsLiveSandboxes", testTemplateInUse},
		{"DeleteRemoves", testTemplateDelete},
		{"DeleteMissingIsNotFound", testTemplateDeleteMissing},
		{"DeleteInUseIsConflict", testTemplateDeleteInUse},
	}
}

// putTemplate stores a template or fails the test.
func (h *harness) putTemplate(tpl torpor.Template) {
	h.t.Helper()
	if err := h.s.PutTemplate(h.t.Context(), tpl); err != nil {
		h.t.Fatalf("PutTemplate(%q): %v", tpl.Name, err)
	}
}

// getTemplate returns a stored template or fails the test.
func (h *harness) getTemplate(name string) *torpor.Template {
	h.t.Helper()
	tpl, err := h.s.GetTemplate(h.t.Context(), name)
	if err != nil {
		h.t.Fatalf("GetTemplate(%q): %v", name, err)
	}
	return tpl
}

// listTemplates returns every template or fails the test.
func (h *harness) listTemplates() []torpor.Template {
	h.t.Helper()
	tpls, err := h.s.ListTemplates(h.t.Context())
	if err != nil {
		h.t.Fatalf("ListTemplates: %v", err)
	}
	return tpls
}

// RootFS, hidden from the API, is kept.
func testTemplateRoundTrip(t *testing.T, h *harness) {
	want := torpor.Template{Name: "python-3.12", RootFS: "/var/lib/torpor/templates/python-3.12/rootfs", CreatedAt: at(time.Microsecond)}
	h.putTemplate(want)
	checkSame(t, "template", h.getTemplate(want.Name), &want)
}

// Putting a name again replaces the template; there is still one.
func testTemplateReplace(t *testing.T, h *harness) {
	h.putTemplate(torpor.Template{Name: "base", RootFS: "/old", CreatedAt: at(0)})
	want := torpor.Template{Name: "base", RootFS: "/new", CreatedAt: at(time.Hour)}
	h.putTemplate(want)
	checkSame(t, "replaced template", h.getTemplate("base"), &want)
	if got := h.listTemplates(); len(got) != 1 {
		t.Errorf("ListTemplates after a replace returned %d templates, want 1", len(got))
	}
}

func testTemplateMissing(t *testing.T, h *harness) {
	_, err := h.s.GetTemplate(t.Context(), "nosuch")
	wantCode(t, err, torpor.ENotFound, "GetTemplate of an unknown name")
}

func testTemplateList(t *testing.T, h *harness) {
	if got := h.listTemplates(); len(got) != 0 {
		t.Fatalf("ListTemplates on an empty store returned %d templates", len(got))
	}
	byName := map[string]torpor.Template{}
	for i, name := range []string{"ubuntu-24.04", "alpine", "node-22", "alpine-edge"} {
		tpl := torpor.Template{Name: name, RootFS: "/rootfs/" + name, CreatedAt: at(time.Duration(i) * time.Second)}
		h.putTemplate(tpl)
		byName[name] = tpl
	}
	got := h.listTemplates()
	order := []string{"alpine", "alpine-edge", "node-22", "ubuntu-24.04"}
	if len(got) != len(order) {
		t.Fatalf("ListTemplates returned %d templates, want %d", len(got), len(order))
	}
	for i, name := range order {
		checkSame(t, "template "+name, got[i], byName[name])
	}
}

// fullTemplate returns a template with every stored field set (InUse is
// derived, not stored).
func fullTemplate(name string) torpor.Template {
	return torpor.Template{
		Name:      name,
		RootFS:    "/var/lib/torpor/templates/" + name + "/rootfs",
		Layers:    []string{"/var/lib/torpor/layers/sha256-aa", "/var/lib/torpor/layers/sha256-bb"},
		Source:    torpor.TemplateSource{Kind: torpor.SourceRegistry, Ref: "registry.example/team/py:3.12"},
		Digest:    "sha256:0123456789abcdef",
		SizeBytes: 123 << 20,
		Defaults: torpor.TemplateDefaults{
			Env:        map[string]string{"PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8"},
			Setup:      []string{"mkdir -p /work"},
			Entrypoint: []string{"python3", "-m", "http.server"},
			Resources:  &torpor.Resources{VCPUs: 2, MemoryMiB: 1024},
			WorkingDir: "/work",
			ImageCmd:   []string{"python3"},
			ImageUser:  "1000:1000",
		},
		CreatedAt: at(42 * time.Microsecond),
	}
}

// Layers, source, digest, size and defaults survive a round trip and a
// restart.
func testTemplateFullRoundTrip(t *testing.T, h *harness) {
	want := fullTemplate("python-3.12")
	h.putTemplate(want)
	checkSame(t, "template", h.getTemplate(want.Name), &want)
	h.restart()
	checkSame(t, "template after a restart", h.getTemplate(want.Name), &want)
	if got := h.listTemplates(); len(got) != 1 || got[0].Digest != want.Digest || len(got[0].Layers) != 2 {
		t.Errorf("ListTemplates = %+v", got)
	}
}

// InUse counts the sandboxes of the template that are not terminated,
// failed ones included (they keep their disk).
func testTemplateInUse(t *testing.T, h *harness) {
	h.putTemplate(torpor.Template{Name: "base", RootFS: "/b", CreatedAt: at(0)})
	h.putTemplate(torpor.Template{Name: "other", RootFS: "/o", CreatedAt: at(0)})
	for i, st := range []torpor.State{torpor.StateRunning, torpor.StatePaused, torpor.StateFailed, torpor.StateTerminated} {
		h.create(newSandbox(fmt.Sprintf("sb%d", i), "acme", st, at(time.Duration(i)*time.Second)))
	}
	if got := h.getTemplate("base").InUse; got != 3 {
		t.Errorf("GetTemplate(base).InUse = %d, want 3", got)
	}
	for _, tpl := range h.listTemplates() {
		want := map[string]int{"base": 3, "other": 0}[tpl.Name]
		if tpl.InUse != want {
			t.Errorf("ListTemplates: %s in use %d, want %d", tpl.Name, tpl.InUse, want)
		}
	}
}

func testTemplateDelete(t *testing.T, h *harness) {
	h.putTemplate(fullTemplate("gone"))
	h.putTemplate(fullTemplate("kept"))
	// A terminated sandbox does not hold its template.
	h.create(newSandbox("old", "acme", torpor.StateTerminated, at(0)))
	sb := newSandbox("done", "acme", torpor.StateTerminated, at(time.Second))
	sb.Template = "gone"
	h.create(sb)
	if err := h.s.DeleteTemplate(t.Context(), "gone"); err != nil {
		t.Fatalf("DeleteTemplate: %v", err)
	}
	_, err := h.s.GetTemplate(t.Context(), "gone")
	wantCode(t, err, torpor.ENotFound, "GetTemplate after DeleteTemplate")
	if got := h.listTemplates(); len(got) != 1 || got[0].Name != "kept" {
		t.Errorf("ListTemplates after a delete = %+v", got)
	}
	h.restart()
	if got := h.listTemplates(); len(got) != 1 {
		t.Errorf("the delete did not last a restart: %d templates", len(got))
	}
}

func testTemplateDeleteMissing(t *testing.T, h *harness) {
	wantCode(t, h.s.DeleteTemplate(t.Context(), "nosuch"), torpor.ENotFound, "DeleteTemplate of an unknown name")
}

// A template used by a sandbox that is not terminated stays, and the
// conflict names the sandbox; once it is terminated the delete works.
func testTemplateDeleteInUse(t *testing.T, h *harness) {
	h.putTemplate(fullTemplate("py"))
	sb := newSandbox("user1", "acme", torpor.StateHibernated, at(0))
	sb.Template = "py"
	h.create(sb)
	err := h.s.DeleteTemplate(t.Context(), "py")
	wantCode(t, err, torpor.EConflict, "DeleteTemplate of a template in use")
	if err != nil && !strings.Contains(err.Error(), "user1") {
		t.Errorf("the conflict does not name the sandbox: %v", err)
	}
	if h.getTemplate("py").InUse != 1 {
		t.Error("the refused delete changed the template")
	}
	sb = h.get("user1")
	sb.State = torpor.StateTerminated
	h.update(sb)
	if err := h.s.DeleteTemplate(t.Context(), "py"); err != nil {
		t.Fatalf("DeleteTemplate after the sandbox was terminated: %v", err)
	}
}
