package template_test

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/template"
)

// debianishBuilder writes the account files of a Debian system.
type debianishBuilder struct{ sudo bool }

func (debianishBuilder) Check() error { return nil }
func (b debianishBuilder) Build(ctx context.Context, req torpor.TemplateBuildRequest, dir string, progress template.Progress) error {
	for p, data := range map[string]string{
		"etc/passwd":       "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
		"etc/group":        "root:x:0:\nsudo:x:27:\n",
		"etc/shadow":       "root:*:19000:0:99999:7:::\n",
		"etc/gshadow":      "root:*::\n",
		"etc/skel/.bashrc": "PS1='$ '\n",
		"bin/bash":         "#!",
	} {
		os.MkdirAll(filepath.Join(dir, filepath.Dir(p)), 0o755)
		if err := os.WriteFile(filepath.Join(dir, p), []byte(data), 0o644); err != nil {
			return err
		}
	}
	if b.sudo {
		os.MkdirAll(filepath.Join(dir, "etc/sudoers.d"), 0o755)
	}
	return nil
}

func TestBuildUsers(t *testing.T) {
	f := newFixture(t, template.Config{Builder: debianishBuilder{sudo: true}})
	var lines []string
	tpl, err := f.m.Build(t.Context(), torpor.TemplateBuildRequest{Name: "withuser",
		Users: []torpor.TemplateUser{{Name: "user", UID: 1000, Sudo: true}, {Name: "bob", UID: 1001}}}, func(l string) { lines = append(lines, l) })
	if err != nil {
		t.Fatal(err)
	}
	root := tpl.Layers[0]
	read := func(p string) string {
		b, err := os.ReadFile(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	for p, want := range map[string]string{
		"etc/passwd":  "user:x:1000:1000::/home/user:/bin/bash\nbob:x:1001:1001::/home/bob:/bin/bash\n",
		"etc/group":   "user:x:1000:\nbob:x:1001:\n",
		"etc/gshadow": "user:!::\nbob:!::\n",
	} {
		if got := read(p); !strings.HasSuffix(got, want) {
			t.Errorf("%s:\n%s", p, got)
		}
	}
	if got := read("etc/shadow"); !strings.Contains(got, "\nuser:!:") || !strings.Contains(got, "\nbob:!:") {
		t.Errorf("shadow:\n%s", got)
	}
	if got := read("etc/sudoers.d/user"); got != "user ALL=(ALL:ALL) NOPASSWD: ALL\n" {
		t.Errorf("sudoers: %q", got)
	}
	if _, err := os.Stat(filepath.Join(root, "etc/sudoers.d/bob")); err == nil {
		t.Error("bob got sudo")
	}
	for _, p := range []string{"home/user", "home/user/.bashrc"} {
		fi, err := os.Stat(filepath.Join(root, p))
		if err != nil {
			t.Fatal(err)
		}
		if st := fi.Sys().(*syscall.Stat_t); st.Uid != 1000 || st.Gid != 1000 {
			t.Errorf("%s is owned by %d:%d", p, st.Uid, st.Gid)
		}
	}
	if read("home/user/.bashrc") != "PS1='$ '\n" {
		t.Error("skel not copied")
	}
	if !slices.ContainsFunc(lines, func(l string) bool { return strings.Contains(l, "added user user (uid 1000") }) {
		t.Errorf("progress: %q", lines)
	}

	for _, tc := range []struct {
		what  string
		b     template.Builder
		users []torpor.TemplateUser
	}{
		{"a name the system has", debianishBuilder{}, []torpor.TemplateUser{{Name: "nobody", UID: 2000}}},
		{"sudo without the sudo package", debianishBuilder{}, []torpor.TemplateUser{{Name: "user", UID: 1000, Sudo: true}}},
		{"uid 0", debianishBuilder{}, []torpor.TemplateUser{{Name: "user", UID: 0}}},
		{"a bad name", debianishBuilder{}, []torpor.TemplateUser{{Name: "../x", UID: 1000}}},
		{"twice", debianishBuilder{}, []torpor.TemplateUser{{Name: "a", UID: 1000}, {Name: "b", UID: 1000}}},
		{"no passwd", &fakeBuilder{}, []torpor.TemplateUser{{Name: "user", UID: 1000}}},
	} {
		g := newFixture(t, template.Config{Builder: tc.b})
		_, err := g.m.Build(t.Context(), torpor.TemplateBuildRequest{Name: "u", Users: tc.users}, nil)
		wantCode(t, err, torpor.EInvalid, tc.what)
		if _, err := g.store.GetTemplate(t.Context(), "u"); err == nil {
			t.Errorf("%s: a template was stored", tc.what)
		}
	}
}

// A copy shares the layers: it outlives the removal of its original.
func TestCopy(t *testing.T) {
	f := newFixture(t, template.Config{Builder: &fakeBuilder{}})
	orig, err := f.m.Build(t.Context(), torpor.TemplateBuildRequest{Name: "orig", Packages: []string{"python3"},
		TemplateOptions: torpor.TemplateOptions{Env: map[string]string{"A": "1"}}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	before := f.layerDirs(t)
	cp, err := f.m.Copy(t.Context(), "orig", "copy")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(cp.Layers, orig.Layers) || cp.Defaults.Env["A"] != "1" || cp.Name != "copy" {
		t.Errorf("copy %+v of %+v", cp, orig)
	}
	if !slices.Equal(f.layerDirs(t), before) {
		t.Errorf("the copy unpacked layers: %v, before %v", f.layerDirs(t), before)
	}
	_, err = f.m.Copy(t.Context(), "orig", "copy")
	wantCode(t, err, torpor.EConflict, "copy onto an existing template")
	_, err = f.m.Copy(t.Context(), "nope", "other")
	wantCode(t, err, torpor.ENotFound, "copy of a missing template")
	_, err = f.m.Copy(t.Context(), "orig", "Bad Name")
	wantCode(t, err, torpor.EInvalid, "copy to a bad name")
	if err := f.m.Delete(t.Context(), "orig"); err != nil {
		t.Fatal(err)
	}
	got, err := f.store.GetTemplate(t.Context(), "copy")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(got.Layers[0], "usr/bin/python3")); err != nil {
		t.Errorf("the copy lost its files with the original: %v", err)
	}
}
