package templates

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/template"
)

// fake is a template store and a builder whose builds wait for release.
type fake struct {
	mu      sync.Mutex
	tmpls   map[string]torpor.Template
	builds  []torpor.TemplateBuildRequest
	copies  []string
	release chan struct{}
	fail    error // the next build's error
	busy    bool  // the next build answers busy, then the template appears
}

func newFake() *fake {
	return &fake{tmpls: map[string]torpor.Template{"python": {Name: "python"}}, release: make(chan struct{})}
}

func (f *fake) GetTemplate(ctx context.Context, name string) (*torpor.Template, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	t, ok := f.tmpls[name]
	if !ok {
		return nil, torpor.Errorf(torpor.ENotFound, "template %q not found", name)
	}
	return &t, nil
}

func (f *fake) Build(ctx context.Context, req torpor.TemplateBuildRequest, progress template.Progress) (*torpor.Template, error) {
	f.mu.Lock()
	f.builds = append(f.builds, req)
	fail, busy := f.fail, f.busy
	f.fail, f.busy = nil, false
	f.mu.Unlock()
	if busy {
		go func() {
			time.Sleep(100 * time.Millisecond)
			f.mu.Lock()
			f.tmpls[req.Name] = torpor.Template{Name: req.Name}
			f.mu.Unlock()
		}()
		return nil, &torpor.Error{Code: torpor.EConflict, Reason: "busy", Message: "being made"}
	}
	progress("I: Retrieving python3")
	select {
	case <-f.release:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if fail != nil {
		return nil, fail
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	t := torpor.Template{Name: req.Name, Layers: []string{"/l/" + req.Name}}
	f.tmpls[req.Name] = t
	return &t, nil
}

func (f *fake) Copy(ctx context.Context, from, to string) (*torpor.Template, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	src, ok := f.tmpls[from]
	if !ok {
		return nil, torpor.Errorf(torpor.ENotFound, "no %s", from)
	}
	f.copies = append(f.copies, from+">"+to)
	src.Name = to
	f.tmpls[to] = src
	return &src, nil
}

func (f *fake) counts() (builds, copies int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.builds), len(f.copies)
}

type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func newResolver(t *testing.T, f *fake, mod func(*Config)) (*Resolver, *syncBuf) {
	t.Helper()
	logs := &syncBuf{}
	cfg := Config{Builder: f, Store: f, Logger: slog.New(slog.NewTextHandler(logs, nil))}
	if mod != nil {
		mod(&cfg)
	}
	return New(cfg), logs
}

func TestParseAliases(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want string // String() of the result; "!" when invalid
	}{
		{DefaultAliases, "base=e2b-base,code-interpreter-v1=e2b-code-interpreter"},
		{"", ""},
		{" base = python , , desktop=e2b-base", "base=python,desktop=e2b-base"},
		{"base", "!"},
		{"base=", "!"},
		{"=python", "!"},
		{"base=Not_A_Template", "!"},
		{"base=a,base=b", "!"},
	} {
		a, err := ParseAliases(tc.in)
		switch {
		case tc.want == "!" && !torpor.IsCode(err, torpor.EInvalid):
			t.Errorf("%q: want invalid, got %v %v", tc.in, a, err)
		case tc.want != "!" && (err != nil || a.String() != tc.want):
			t.Errorf("%q: got %q, %v; want %q", tc.in, a.String(), err, tc.want)
		}
	}
}

func TestResolveExisting(t *testing.T) {
	f := newFake()
	f.tmpls[Base] = torpor.Template{Name: Base}
	aliases, _ := ParseAliases("base=e2b-base,py=python,gone=nothing-here")
	r, _ := newResolver(t, f, func(c *Config) { c.Aliases = aliases })
	ctx := context.Background()
	for in, want := range map[string]string{"base": Base, "py": "python", "python": "python", Base: Base} {
		if got, err := r.Resolve(ctx, in); err != nil || got != want {
			t.Errorf("Resolve(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, in := range []string{"nope", "gone", "code-interpreter-v1", "../etc", strings.Repeat("x", 300), ""} {
		if got, err := r.Resolve(ctx, in); !torpor.IsCode(err, torpor.ENotFound) {
			t.Errorf("Resolve(%q) = %q, %v; want not found", in, got, err)
		}
	}
	if b, c := f.counts(); b != 0 || c != 0 {
		t.Errorf("%d builds, %d copies for existing templates", b, c)
	}
}

// Concurrent first uses share one build, which logs its progress; the
// other E2B template is then a copy of the first, not a second build.
func TestResolveBuildsOnce(t *testing.T) {
	f := newFake()
	r, logs := newResolver(t, f, nil)
	ctx := context.Background()
	var wg sync.WaitGroup
	errs := make(chan error, 10)
	for i := 0; i < 5; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			name, err := r.Resolve(ctx, "base")
			if err == nil && name != Base {
				err = errors.New("resolved to " + name)
			}
			errs <- err
		}()
	}
	// Asked for meanwhile, the code interpreter's template waits for that
	// build and copies it.
	wg.Add(1)
	go func() {
		defer wg.Done()
		time.Sleep(50 * time.Millisecond)
		name, err := r.Resolve(ctx, "code-interpreter-v1")
		if err == nil && name != CodeInterpreter {
			err = errors.New("resolved to " + name)
		}
		errs <- err
	}()
	time.Sleep(150 * time.Millisecond)
	close(f.release)
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Error(err)
		}
	}
	builds, copies := f.counts()
	if builds != 1 || copies != 1 || f.copies[0] != Base+">"+CodeInterpreter {
		t.Fatalf("%d builds, copies %v", builds, f.copies)
	}
	req := f.builds[0]
	if req.Name != Base || req.Debian != "bookworm" || len(req.Users) != 1 || req.Users[0] != (torpor.TemplateUser{Name: "user", UID: 1000, Sudo: true}) {
		t.Errorf("build request: %+v", req)
	}
	for _, p := range []string{"bash", "coreutils", "curl", "git", "python3", "ca-certificates", "procps"} {
		if !strings.Contains(","+strings.Join(req.Packages, ",")+",", ","+p+",") {
			t.Errorf("the recipe lacks %s: %v", p, req.Packages)
		}
	}
	if err := req.Validate(); err != nil {
		t.Errorf("the recipe is not a valid build request: %v", err)
	}
	if !strings.Contains(logs.String(), "I: Retrieving python3") {
		t.Errorf("the build's progress was not logged:\n%s", logs)
	}
	if name, err := r.Resolve(ctx, "base"); err != nil || name != Base {
		t.Fatalf("after the build: %q %v", name, err)
	}
	if b, _ := f.counts(); b != 1 {
		t.Errorf("built again: %d builds", b)
	}
}

// A failed build is an error for everyone waiting (no hang); the next use
// tries again.
func TestResolveBuildFails(t *testing.T) {
	f := newFake()
	f.fail = torpor.Invalid("packages", "debootstrap failed: E: Couldn't download packages")
	r, _ := newResolver(t, f, nil)
	close(f.release)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := r.Resolve(ctx, "code-interpreter-v1")
	if !torpor.IsCode(err, torpor.EInvalid) || !strings.Contains(err.Error(), "debootstrap failed") {
		t.Fatalf("failed build: %v", err)
	}
	f.fail = errors.New("disk full")
	if _, err := r.Resolve(ctx, "code-interpreter-v1"); err == nil || !strings.Contains(err.Error(), "building template e2b-code-interpreter: disk full") {
		t.Fatalf("second failure: %v", err)
	}
	if name, err := r.Resolve(ctx, "code-interpreter-v1"); err != nil || name != CodeInterpreter {
		t.Fatalf("third try: %q %v", name, err)
	}
	if b, _ := f.counts(); b != 3 {
		t.Errorf("%d builds, want 3", b)
	}
}

// Past MaxWait a use is told the template is being built, and the build
// goes on; a caller that leaves does not stop it either.
func TestResolveMaxWait(t *testing.T) {
	f := newFake()
	r, _ := newResolver(t, f, func(c *Config) { c.MaxWait = 50 * time.Millisecond })
	_, err := r.Resolve(context.Background(), "base")
	var te *torpor.Error
	if !errors.As(err, &te) || te.Code != torpor.EUnavailable || te.RetryAfter <= 0 || !strings.Contains(te.Message, "being built") {
		t.Fatalf("past MaxWait: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := r.Resolve(ctx, "base"); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
	close(f.release)
	deadline := time.Now().Add(5 * time.Second)
	for {
		if name, err := r.Resolve(context.Background(), "base"); err == nil && name == Base {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the build did not finish")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if b, _ := f.counts(); b != 1 {
		t.Errorf("%d builds, want 1", b)
	}
}

// Another request building the template (torpor template build) is waited
// for rather than failed.
func TestResolveOtherBuilder(t *testing.T) {
	f := newFake()
	f.busy = true
	r, _ := newResolver(t, f, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if name, err := r.Resolve(ctx, "base"); err != nil || name != Base {
		t.Fatalf("got %q %v", name, err)
	}
}

func TestRecipes(t *testing.T) {
	rs := Recipes()
	if len(rs) != 2 || rs[0].Name != Base || rs[1].Name != CodeInterpreter || !sameRecipe(rs[0], rs[1]) {
		t.Fatalf("recipes: %+v", rs)
	}
	if _, ok := Recipe("python"); ok {
		t.Error("python is not an E2B recipe")
	}
}
