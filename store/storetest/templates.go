package storetest

import (
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
