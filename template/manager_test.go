package template_test

import (
	"bytes"
	"compress/gzip"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/store/sqlite"
	"github.com/torpor-dev/torpor/template"
	tt "github.com/torpor-dev/torpor/template/templatetest"
)

func needRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root (unpacking sets owners, makes whiteout devices and trusted xattrs)")
	}
}

type fixture struct {
	dir   string
	store *sqlite.Store
	m     *template.Manager
}

func newFixture(t *testing.T, cfg template.Config) *fixture {
	t.Helper()
	needRoot(t)
	dir := t.TempDir()
	st, err := sqlite.Open(t.Context(), filepath.Join(dir, "torpor.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	cfg.Store, cfg.Dir = st, dir
	m, err := template.New(t.Context(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &fixture{dir: dir, store: st, m: m}
}

// layerDirs lists the layer directories on disk.
func (f *fixture) layerDirs(t *testing.T) []string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(f.dir, "layers"))
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, e := range entries {
		out = append(out, e.Name())
	}
	return out
}

// testImage has a base layer and a layer that deletes, hides and adds.
func testImage(t *testing.T) v1.Image {
	base := tt.Layer(t, tt.Tar(t, tt.Dir("etc/"), tt.File("etc/secret", "s"), tt.File("etc/keep", "k"),
		tt.Dir("data/"), tt.File("data/old", "o"), tt.Dir("tmp/")))
	top := tt.Layer(t, tt.Tar(t, tt.Whiteout("etc/secret"), tt.Dir("data/"), tt.Opaque("data"), tt.File("data/new", "n")))
	return tt.Image(t, v1.Config{
		Env:        []string{"PATH=/usr/local/bin:/bin", "LANG=C.UTF-8", "bad name=x"},
		Entrypoint: []string{"/bin/app"},
		Cmd:        []string{"--serve"},
		WorkingDir: "/srv",
		User:       "1000",
	}, base, top)
}

// checkImageTemplate checks what importing testImage made.
func checkImageTemplate(t *testing.T, tpl *torpor.Template, kind string) {
	t.Helper()
	if tpl.Source.Kind != kind || !strings.HasPrefix(tpl.Digest, "sha256:") || tpl.SizeBytes != 4 {
		t.Errorf("template %+v", tpl)
	}
	// Two image layers and the mount point layer (.torpor, dev, proc, sys).
	if len(tpl.Layers) != 3 {
		t.Fatalf("layers %v, want 3", tpl.Layers)
	}
	top := tpl.Layers[1]
	var st unix.Stat_t
	if err := unix.Lstat(filepath.Join(top, "etc/secret"), &st); err != nil || st.Mode&unix.S_IFMT != unix.S_IFCHR || st.Rdev != 0 {
		t.Errorf("etc/secret in the top layer is not a whiteout: %v", err)
	}
	skel := tpl.Layers[2]
	for _, d := range []string{".torpor", "dev", "proc", "sys"} {
		if fi, err := os.Stat(filepath.Join(skel, d)); err != nil || !fi.IsDir() {
			t.Errorf("mount point layer lacks %s", d)
		}
	}
	if _, err := os.Stat(filepath.Join(skel, "tmp")); err == nil {
		t.Error("the mount point layer has tmp, which the image has")
	}
	d := tpl.Defaults
	if d.Env["PATH"] != "/usr/local/bin:/bin" || d.Env["LANG"] != "C.UTF-8" || len(d.Env) != 2 {
		t.Errorf("env %v", d.Env)
	}
	if !slices.Equal(d.ImageCmd, []string{"/bin/app", "--serve"}) || d.WorkingDir != "/srv" || d.ImageUser != "1000" {
		t.Errorf("defaults %+v", d)
	}
	if len(d.Entrypoint) != 0 {
		t.Errorf("the image command became the entrypoint without use_image_cmd: %v", d.Entrypoint)
	}
}

func TestImportOCILayout(t *testing.T) {
	f := newFixture(t, template.Config{})
	dir := filepath.Join(t.TempDir(), "layout")
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(testImage(t), layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": "v1"})); err != nil {
		t.Fatal(err)
	}
	var lines []string
	tpl, err := f.m.Import(t.Context(), torpor.TemplateImportRequest{Name: "app", OCILayout: dir}, func(l string) { lines = append(lines, l) })
	if err != nil {
		t.Fatal(err)
	}
	checkImageTemplate(t, tpl, torpor.SourceOCILayout)
	if len(lines) < 3 {
		t.Errorf("progress: %q", lines)
	}
	stored, err := f.store.GetTemplate(t.Context(), "app")
	if err != nil || !slices.Equal(stored.Layers, tpl.Layers) {
		t.Errorf("stored %+v %v", stored, err)
	}
	// By tag; a tag that is not there is a 400.
	if _, err := f.m.Import(t.Context(), torpor.TemplateImportRequest{Name: "app2", OCILayout: dir, Tag: "v1"}, nil); err != nil {
		t.Errorf("import by tag: %v", err)
	}
	_, err = f.m.Import(t.Context(), torpor.TemplateImportRequest{Name: "app3", OCILayout: dir, Tag: "v9"}, nil)
	wantCode(t, err, torpor.EInvalid, "a missing tag")
}

func TestImportDockerArchive(t *testing.T) {
	f := newFixture(t, template.Config{})
	p := filepath.Join(t.TempDir(), "img.tar")
	tag, _ := name.NewTag("example.test/app:1")
	if err := tarball.WriteToFile(p, tag, testImage(t)); err != nil {
		t.Fatal(err)
	}
	tpl, err := f.m.Import(t.Context(), torpor.TemplateImportRequest{Name: "app", DockerArchive: p, UseImageCmd: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(tpl.Defaults.Entrypoint, []string{"/bin/app", "--serve"}) {
		t.Errorf("use_image_cmd: entrypoint %v", tpl.Defaults.Entrypoint)
	}
	tpl.Defaults.Entrypoint = nil
	checkImageTemplate(t, tpl, torpor.SourceDockerArchive)
	// The same image again shares every layer.
	tpl2, err := f.m.Import(t.Context(), torpor.TemplateImportRequest{Name: "app-gz", DockerArchive: gzipFile(t, p)}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(tpl.Layers, tpl2.Layers) {
		t.Errorf("the same image got other layers: %v vs %v", tpl.Layers, tpl2.Layers)
	}
}

func gzipFile(t *testing.T, p string) string {
	data, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	zw.Write(data)
	zw.Close()
	out := p + ".gz"
	if err := os.WriteFile(out, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestImportFromRegistry(t *testing.T) {
	f := newFixture(t, template.Config{})
	host := tt.Registry(t)
	tt.Push(t, host+"/team/app:1", testImage(t))
	tpl, err := f.m.Import(t.Context(), torpor.TemplateImportRequest{Name: "app", Image: host + "/team/app:1", Insecure: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	checkImageTemplate(t, tpl, torpor.SourceRegistry)
	if tpl.Source.Ref != host+"/team/app:1" {
		t.Errorf("source %+v", tpl.Source)
	}
	_, err = f.m.Import(t.Context(), torpor.TemplateImportRequest{Name: "nope", Image: host + "/team/nope:1", Insecure: true}, nil)
	wantCode(t, err, torpor.EInvalid, "an image the registry does not have")
	_, err = f.m.Import(t.Context(), torpor.TemplateImportRequest{Name: "nope", Image: "127.0.0.1:1/x:1", Insecure: true}, nil)
	wantCode(t, err, torpor.EUnavailable, "an unreachable registry")
	_, err = f.m.Import(t.Context(), torpor.TemplateImportRequest{Name: "nope", Image: "UPPER CASE!"}, nil)
	wantCode(t, err, torpor.EInvalid, "a malformed reference")
	if _, err := f.store.GetTemplate(t.Context(), "nope"); !torpor.IsCode(err, torpor.ENotFound) {
		t.Errorf("a failed import stored a template: %v", err)
	}
}

func TestImportRootFS(t *testing.T) {
	f := newFixture(t, template.Config{})
	root := t.TempDir()
	for _, d := range []string{"bin", "etc", "tmp", "proc", "sys", "dev", ".torpor"} {
		os.Mkdir(filepath.Join(root, d), 0o755)
	}
	os.WriteFile(filepath.Join(root, "etc/os-release"), []byte("ID=test\n"), 0o644)
	os.Symlink("../etc/os-release", filepath.Join(root, "bin/link"))
	os.Link(filepath.Join(root, "etc/os-release"), filepath.Join(root, "etc/hard"))
	unix.Mknod(filepath.Join(root, "dev/null"), unix.S_IFCHR|0o666, int(unix.Mkdev(1, 3)))
	tpl, err := f.m.Import(t.Context(), torpor.TemplateImportRequest{Name: "dir", RootFS: root}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if len(tpl.Layers) != 1 || tpl.Source.Kind != torpor.SourceRootFS || tpl.Digest == "" {
		t.Fatalf("template %+v", tpl)
	}
	l := tpl.Layers[0]
	if data, _ := os.ReadFile(filepath.Join(l, "etc/hard")); string(data) != "ID=test\n" {
		t.Errorf("hard link: %q", data)
	}
	if target, _ := os.Readlink(filepath.Join(l, "bin/link")); target != "../etc/os-release" {
		t.Errorf("symlink: %q", target)
	}
	if _, err := os.Lstat(filepath.Join(l, "dev/null")); err == nil {
		t.Error("a device node was copied")
	}
	// The same tree as a tarball is the same layer.
	tarPath := filepath.Join(t.TempDir(), "root.tar.gz")
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	tarOf(t, root, zw)
	zw.Close()
	os.WriteFile(tarPath, buf.Bytes(), 0o644)
	tpl2, err := f.m.Import(t.Context(), torpor.TemplateImportRequest{Name: "tarball", RootFS: tarPath}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(filepath.Join(tpl2.Layers[0], "etc/os-release")); string(data) != "ID=test\n" {
		t.Errorf("tarball import: %q", data)
	}
	_, err = f.m.Import(t.Context(), torpor.TemplateImportRequest{Name: "x", RootFS: "/nonexistent/rootfs"}, nil)
	wantCode(t, err, torpor.EInvalid, "a missing rootfs")
}

// tarOf writes a tar of dir with the system tar (a second implementation).
func tarOf(t *testing.T, dir string, w *gzip.Writer) {
	t.Helper()
	out, err := exec.Command("tar", "-C", dir, "-cf", "-", ".").Output()
	if err != nil {
		t.Skipf("needs tar: %v", err)
	}
	w.Write(out)
}

// Two templates share their common layers; removing one keeps the shared
// layers, removing the last removes them all.
func TestLayersSharedAndCollected(t *testing.T) {
	f := newFixture(t, template.Config{})
	base := tt.Layer(t, tt.Tar(t, tt.File("shared", "s"), tt.Dir("tmp/")))
	a := tt.Image(t, v1.Config{}, base, tt.Layer(t, tt.Tar(t, tt.File("a", "a"))))
	b := tt.Image(t, v1.Config{}, base, tt.Layer(t, tt.Tar(t, tt.File("b", "b"))))
	host := tt.Registry(t)
	tt.Push(t, host+"/a:1", a)
	tt.Push(t, host+"/b:1", b)
	ta, err := f.m.Import(t.Context(), torpor.TemplateImportRequest{Name: "a", Image: host + "/a:1", Insecure: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	tb, err := f.m.Import(t.Context(), torpor.TemplateImportRequest{Name: "b", Image: host + "/b:1", Insecure: true}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ta.Layers[0] != tb.Layers[0] || ta.Layers[1] == tb.Layers[1] || ta.Layers[2] != tb.Layers[2] {
		t.Fatalf("layers not shared as expected:\n%v\n%v", ta.Layers, tb.Layers)
	}
	if n := len(f.layerDirs(t)); n != 4 {
		t.Errorf("%d layer dirs, want 4 (base, a, b, mount points)", n)
	}
	if err := f.m.Delete(t.Context(), "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(ta.Layers[1]); err == nil {
		t.Error("a's own layer stayed")
	}
	if _, err := os.Stat(tb.Layers[0]); err != nil {
		t.Error("the shared layer went with a")
	}
	if err := f.m.Delete(t.Context(), "b"); err != nil {
		t.Fatal(err)
	}
	if dirs := f.layerDirs(t); len(dirs) != 0 {
		t.Errorf("layers left after the last template went: %v", dirs)
	}
	wantCode(t, f.m.Delete(t.Context(), "b"), torpor.ENotFound, "deleting a deleted template")
}

// A failed import leaves no template and no layer, not even the layers it
// had finished before the failing one.
func TestFailedImportLeavesNothing(t *testing.T) {
	f := newFixture(t, template.Config{})
	good := tt.Layer(t, tt.Tar(t, tt.File("fine", "x")))
	evil := tt.Layer(t, tt.Tar(t, tt.File("../../escape", "x")))
	host := tt.Registry(t)
	tt.Push(t, host+"/evil:1", tt.Image(t, v1.Config{}, good, evil))
	_, err := f.m.Import(t.Context(), torpor.TemplateImportRequest{Name: "evil", Image: host + "/evil:1", Insecure: true}, nil)
	wantCode(t, err, torpor.EInvalid, "an image with an escaping entry")
	if dirs := f.layerDirs(t); len(dirs) != 0 {
		t.Errorf("a failed import left %v", dirs)
	}
	if ts, _ := f.store.ListTemplates(t.Context()); len(ts) != 0 {
		t.Errorf("a failed import stored %v", ts)
	}
	// A digest that does not match the content.
	p := filepath.Join(t.TempDir(), "img.tar")
	tag, _ := name.NewTag("example.test/lie:1")
	if err := tarball.WriteToFile(p, tag, tt.Image(t, v1.Config{}, lyingLayer{good})); err != nil {
		t.Fatal(err)
	}
	_, err = f.m.Import(t.Context(), torpor.TemplateImportRequest{Name: "lie", DockerArchive: p}, nil)
	if !torpor.IsCode(err, torpor.EInvalid) || !strings.Contains(err.Error(), "digest mismatch") {
		t.Errorf("a lying diff id: %v", err)
	}
	if dirs := f.layerDirs(t); len(dirs) != 0 {
		t.Errorf("a digest mismatch left %v", dirs)
	}
}

// lyingLayer claims a diff id its content does not have.
type lyingLayer struct{ v1.Layer }

func (lyingLayer) DiffID() (v1.Hash, error) {
	return v1.NewHash("sha256:" + strings.Repeat("ab", 32))
}

func TestNamesAndConflicts(t *testing.T) {
	f := newFixture(t, template.Config{})
	root := t.TempDir()
	os.WriteFile(filepath.Join(root, "f"), []byte("x"), 0o644)
	for _, bad := range []string{"", "Upper", "-dash", "under_score", strings.Repeat("a", 64), "a/b", "a b"} {
		_, err := f.m.Import(t.Context(), torpor.TemplateImportRequest{Name: bad, RootFS: root}, nil)
		wantCode(t, err, torpor.EInvalid, "name "+bad)
	}
	if _, err := f.m.Import(t.Context(), torpor.TemplateImportRequest{Name: "x.y-1", RootFS: root}, nil); err != nil {
		t.Fatal(err)
	}
	_, err := f.m.Import(t.Context(), torpor.TemplateImportRequest{Name: "x.y-1", RootFS: root}, nil)
	wantCode(t, err, torpor.EConflict, "an existing name")
	for _, req := range []torpor.TemplateImportRequest{
		{Name: "s"},
		{Name: "s", RootFS: root, Image: "x"},
		{Name: "s", RootFS: "relative/path"},
		{Name: "s", RootFS: root, UseImageCmd: true},
		{Name: "s", RootFS: root, Insecure: true},
		{Name: "s", RootFS: root, Tag: "v1"},
		{Name: "s", RootFS: root, TemplateOptions: torpor.TemplateOptions{Env: map[string]string{"1BAD": "x"}}},
		{Name: "s", RootFS: root, TemplateOptions: torpor.TemplateOptions{Resources: &torpor.Resources{MemoryMiB: -1}}},
	} {
		_, err := f.m.Import(t.Context(), req, nil)
		wantCode(t, err, torpor.EInvalid, "request "+strings.ReplaceAll(root, root, "ROOT"))
	}
	// Built-in templates (no layers) cannot be removed.
	f.store.PutTemplate(t.Context(), torpor.Template{Name: "base", RootFS: "/x", Source: torpor.TemplateSource{Kind: torpor.SourceBuiltin}})
	wantCode(t, f.m.Delete(t.Context(), "base"), torpor.EForbidden, "deleting base")
}

// A template that a live sandbox uses is not removed.
func TestDeleteInUseIsRefused(t *testing.T) {
	f := newFixture(t, template.Config{})
	root := t.TempDir()
	os.WriteFile(filepath.Join(root, "f"), []byte("x"), 0o644)
	tpl, err := f.m.Import(t.Context(), torpor.TemplateImportRequest{Name: "used", RootFS: root}, nil)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC()
	sb := &torpor.Sandbox{ID: "sb1", Tenant: "t", Template: "used", State: torpor.StateRunning, StateSince: now, CreatedAt: now, LastActivityAt: now}
	if err := f.store.CreateSandbox(t.Context(), sb); err != nil {
		t.Fatal(err)
	}
	err = f.m.Delete(t.Context(), "used")
	wantCode(t, err, torpor.EConflict, "deleting a template in use")
	if err != nil && !strings.Contains(err.Error(), "sb1") {
		t.Errorf("the conflict does not name the sandbox: %v", err)
	}
	if _, err := os.Stat(tpl.Layers[0]); err != nil {
		t.Errorf("the refused delete removed the layer: %v", err)
	}
}

// fakeBuilder writes a tiny root filesystem.
type fakeBuilder struct {
	mu   sync.Mutex
	reqs []torpor.TemplateBuildRequest
}

func (*fakeBuilder) Check() error { return nil }
func (b *fakeBuilder) Build(ctx context.Context, req torpor.TemplateBuildRequest, dir string, progress template.Progress) error {
	b.mu.Lock()
	b.reqs = append(b.reqs, req)
	b.mu.Unlock()
	progress("I: Retrieving " + strings.Join(req.Packages, " "))
	if slices.Contains(req.Packages, "nosuch") {
		return torpor.Invalid("packages", "E: Couldn't find these debs: nosuch")
	}
	os.MkdirAll(filepath.Join(dir, "usr/bin"), 0o755)
	return os.WriteFile(filepath.Join(dir, "usr/bin/python3"), []byte("#!"), 0o755)
}

func TestBuild(t *testing.T) {
	b := &fakeBuilder{}
	f := newFixture(t, template.Config{Builder: b})
	var lines []string
	tpl, err := f.m.Build(t.Context(), torpor.TemplateBuildRequest{Name: "python", Packages: []string{"python3"},
		TemplateOptions: torpor.TemplateOptions{Setup: []string{"true"}}}, func(l string) { lines = append(lines, l) })
	if err != nil {
		t.Fatal(err)
	}
	if tpl.Source.Kind != torpor.SourceDebootstrap || tpl.Source.Ref != "bookworm+python3" || !slices.Equal(tpl.Defaults.Setup, []string{"true"}) {
		t.Errorf("template %+v", tpl)
	}
	if b.reqs[0].Debian != "bookworm" || !slices.Contains(lines, "I: Retrieving python3") {
		t.Errorf("build request %+v, progress %q", b.reqs, lines)
	}
	if _, err := os.Stat(filepath.Join(tpl.Layers[0], "usr/bin/python3")); err != nil {
		t.Error(err)
	}
	if entries, _ := os.ReadDir(filepath.Join(f.dir, "build")); len(entries) != 0 {
		t.Errorf("build dirs left: %v", entries)
	}
	_, err = f.m.Build(t.Context(), torpor.TemplateBuildRequest{Name: "bad", Packages: []string{"nosuch"}}, nil)
	wantCode(t, err, torpor.EInvalid, "a package the mirror lacks")
	for _, req := range []torpor.TemplateBuildRequest{
		{Name: "b", Debian: "Bookworm!"},
		{Name: "b", Packages: []string{"-oops"}},
		{Name: "b", Mirror: "ftp://x"},
		{Name: "b", Mirror: "http://x/ y"},
	} {
		_, err := f.m.Build(t.Context(), req, nil)
		wantCode(t, err, torpor.EInvalid, "build request")
	}
}

func wantCode(t *testing.T, err error, code torpor.ErrorCode, what string) {
	t.Helper()
	if !torpor.IsCode(err, code) {
		t.Errorf("%s: %v, want %s", what, err, code)
	}
}
