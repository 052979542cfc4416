// Package templates maps the template names E2B programs ask for (`base`
// by default, `code-interpreter-v1` for the code interpreter) to torpor
// templates, and builds the torpor templates made for them with torpor's
// own builder (debootstrap from Debian's mirror) the first time they are
// needed.
//
// The templates are Debian bookworm with what E2B programs expect: bash,
// coreutils, curl, git, python3, ca-certificates, procps and sudo, and a
// `user` account (uid 1000, passwordless sudo) owning /home/user. The code
// interpreter needs nothing more, since torpor serves it from the daemon
// and runs snippets in the sandbox's own python3: its template has the
// same files, so whichever of the two is built first is copied (its layers
// shared) to make the other.
package templates

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/template"
)

// The torpor templates made for E2B programs.
const (
	Base            = "e2b-base"
	CodeInterpreter = "e2b-code-interpreter"
)

// DefaultAliases is the mapping `--e2b-templates` defaults to.
const DefaultAliases = "base=" + Base + ",code-interpreter-v1=" + CodeInterpreter

// User is the account E2B programs run as, and its home.
const (
	User    = "user"
	UserUID = 1000
	Home    = "/home/user"
)

// Packages are what the E2B templates install over Debian's minimal base.
var Packages = []string{"bash", "coreutils", "curl", "git", "python3", "ca-certificates", "procps", "sudo"}

// Recipe returns the build request of a torpor template made for E2B
// programs, and whether name is one.
func Recipe(name string) (torpor.TemplateBuildRequest, bool) {
	switch name {
	case Base, CodeInterpreter:
	default:
		return torpor.TemplateBuildRequest{}, false
	}
	return torpor.TemplateBuildRequest{
		Name:     name,
		Debian:   "bookworm",
		Packages: append([]string(nil), Packages...),
		Users:    []torpor.TemplateUser{{Name: User, UID: UserUID, Sudo: true}},
		TemplateOptions: torpor.TemplateOptions{Env: map[string]string{
			// Debian's python refuses `pip install` outside a venv; E2B
			// programs expect it to work (as user, it installs to ~/.local).
			"PIP_BREAK_SYSTEM_PACKAGES": "1",
		}},
	}, true
}

// Recipes returns the build requests of every torpor template made for
// E2B programs, by name.
func Recipes() []torpor.TemplateBuildRequest {
	var out []torpor.TemplateBuildRequest
	for _, n := range []string{Base, CodeInterpreter} {
		r, _ := Recipe(n)
		out = append(out, r)
	}
	return out
}

// Aliases maps E2B template names to torpor template names.
type Aliases map[string]string

// ParseAliases reads "e2bname=torporname,..." (the `--e2b-templates`
// flag). An empty string is no aliases.
func ParseAliases(s string) (Aliases, error) {
	out := Aliases{}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		from, to, ok := strings.Cut(part, "=")
		from, to = strings.TrimSpace(from), strings.TrimSpace(to)
		if !ok || from == "" || to == "" {
			return nil, torpor.Invalid("e2b_templates", "%q is not e2bname=torporname", part)
		}
		if len(from) > 128 || strings.ContainsAny(from, " \t\x00") {
			return nil, torpor.Invalid("e2b_templates", "%q is not an E2B template name", from)
		}
		if err := torpor.ValidateTemplateName("e2b_templates", to); err != nil {
			return nil, err
		}
		if _, dup := out[from]; dup {
			return nil, torpor.Invalid("e2b_templates", "%q is mapped twice", from)
		}
		out[from] = to
	}
	return out, nil
}

// String is the mapping in ParseAliases' form, sorted.
func (a Aliases) String() string {
	keys := make([]string, 0, len(a))
	for k := range a {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + a[k]
	}
	return strings.Join(parts, ",")
}

// Builder makes templates: *template.Manager.
type Builder interface {
	Build(ctx context.Context, req torpor.TemplateBuildRequest, progress template.Progress) (*torpor.Template, error)
	Copy(ctx context.Context, from, to string) (*torpor.Template, error)
}

// Store finds templates: torpor.TemplateStore.
type Store interface {
	GetTemplate(ctx context.Context, name string) (*torpor.Template, error)
}

var _ Builder = (*template.Manager)(nil)

// Config is what a Resolver needs.
type Config struct {
	// Builder builds the recipes (the daemon's *template.Manager).
	Builder Builder
	// Store finds templates (the daemon's store).
	Store Store
	// Aliases maps E2B names; nil takes DefaultAliases.
	Aliases Aliases
	// MaxWait bounds how long Resolve waits for a build: past it, it
	// answers unavailable (retry later) and the build goes on. 0 waits
	// as long as the caller's context allows.
	MaxWait time.Duration
	// BuildTimeout bounds one build (default 30 minutes).
	BuildTimeout time.Duration
	Logger       *slog.Logger
	// Now tells the time (time.Now when nil).
	Now func() time.Time
}

// Resolver finds the torpor template for an E2B template name, building
// the E2B templates on first use. Concurrent Resolves share one build.
type Resolver struct {
	cfg Config
	log *slog.Logger

	mu     sync.Mutex
	builds map[string]*build
	seq    int
}

// build is one build in flight; err is set before done closes.
type build struct {
	done    chan struct{}
	err     error
	started time.Time
	seq     int // the order builds started in
}

// New returns a resolver.
func New(cfg Config) *Resolver {
	if cfg.Aliases == nil {
		cfg.Aliases, _ = ParseAliases(DefaultAliases)
	}
	if cfg.BuildTimeout <= 0 {
		cfg.BuildTimeout = 30 * time.Minute
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Resolver{cfg: cfg, log: log, builds: map[string]*build{}}
}

// Aliases returns the mapping in use.
func (r *Resolver) Aliases() Aliases { return r.cfg.Aliases }

// Resolve returns the torpor template an E2B program means by e2bName:
// its alias, or a torpor template of that name. An E2B template that is
// not built yet is built first (Resolve waits, up to MaxWait). A name
// that is neither is not_found.
func (r *Resolver) Resolve(ctx context.Context, e2bName string) (string, error) {
	name := e2bName
	if to, ok := r.cfg.Aliases[e2bName]; ok {
		name = to
	}
	if torpor.ValidateTemplateName("templateID", name) != nil {
		return "", notFound(e2bName)
	}
	_, err := r.cfg.Store.GetTemplate(ctx, name)
	switch {
	case err == nil:
		return name, nil
	case !torpor.IsCode(err, torpor.ENotFound):
		return "", err
	}
	if _, ok := Recipe(name); !ok {
		return "", notFound(e2bName)
	}
	return name, r.await(ctx, name)
}

func notFound(name string) error {
	if len(name) > 64 {
		name = name[:64] + "..."
	}
	return torpor.Errorf(torpor.ENotFound, "template %q not found", name)
}

// Ensure builds the E2B template name unless it exists, and waits for it
// like Resolve.
func (r *Resolver) Ensure(ctx context.Context, name string) error {
	if _, ok := Recipe(name); !ok {
		return notFound(name)
	}
	if _, err := r.cfg.Store.GetTemplate(ctx, name); err == nil {
		return nil
	}
	return r.await(ctx, name)
}

// await waits for the build of name, starting it when none runs.
func (r *Resolver) await(ctx context.Context, name string) error {
	r.mu.Lock()
	b := r.builds[name]
	if b == nil {
		r.seq++
		b = &build{done: make(chan struct{}), started: r.cfg.Now(), seq: r.seq}
		r.builds[name] = b
		go r.run(name, b)
	}
	r.mu.Unlock()
	var limit <-chan time.Time
	if r.cfg.MaxWait > 0 {
		t := time.NewTimer(r.cfg.MaxWait)
		defer t.Stop()
		limit = t.C
	}
	select {
	case <-b.done:
		return b.err
	case <-ctx.Done():
		return ctx.Err()
	case <-limit:
		return &torpor.Error{Code: torpor.EUnavailable, Reason: "template_building", RetryAfter: 30 * time.Second,
			Message: fmt.Sprintf("template %s is being built (started %s ago; a build takes a few minutes): retry shortly",
				name, r.cfg.Now().Sub(b.started).Round(time.Second))}
	}
}

// run builds name (or copies the other E2B template, which has the same
// files) in the background, for every caller that waits for it.
func (r *Resolver) run(name string, b *build) {
	ctx, cancel := context.WithTimeout(context.Background(), r.cfg.BuildTimeout)
	defer cancel()
	err := r.make(ctx, name, b.seq)
	if err != nil {
		r.log.Error("e2b template: build failed", "template", name, "err", err)
		if te := (*torpor.Error)(nil); !errors.As(err, &te) {
			err = fmt.Errorf("building template %s: %w", name, err)
		}
	} else {
		r.log.Info("e2b template: ready", "template", name, "took", r.cfg.Now().Sub(b.started).Round(time.Second))
	}
	r.mu.Lock()
	b.err = err
	delete(r.builds, name)
	r.mu.Unlock()
	close(b.done)
}

// make builds or copies name. Another request making it first (through
// torpor's API) is waited for; should that one fail, this one tries again.
func (r *Resolver) make(ctx context.Context, name string, seq int) error {
	for waited := false; ; waited = true {
		err := r.attempt(ctx, name, seq)
		var te *torpor.Error
		if !errors.As(err, &te) || te.Code != torpor.EConflict {
			return err
		}
		if te.Reason == "exists" {
			return nil
		}
		if !waited {
			r.log.Info("e2b template: another request is making it; waiting", "template", name)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for template %s that another request makes: %w", name, ctx.Err())
		case <-time.After(2 * time.Second):
		}
		if _, err := r.cfg.Store.GetTemplate(ctx, name); err == nil {
			return nil
		}
	}
}

// attempt copies a template of the same recipe when there is one (or
// one that an earlier build is making), and builds name otherwise.
func (r *Resolver) attempt(ctx context.Context, name string, seq int) error {
	recipe, _ := Recipe(name)
	for _, other := range Recipes() {
		if other.Name == name || !sameRecipe(recipe, other) {
			continue
		}
		r.mu.Lock()
		ob := r.builds[other.Name]
		r.mu.Unlock()
		if ob != nil && ob.seq < seq {
			select {
			case <-ob.done:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		if _, err := r.cfg.Store.GetTemplate(ctx, other.Name); err == nil {
			r.log.Info("e2b template: copying a template with the same recipe", "template", name, "from", other.Name)
			_, err := r.cfg.Builder.Copy(ctx, other.Name, name)
			return err
		}
	}
	r.log.Info("e2b template: building (debootstrap; a few minutes, once)", "template", name, "packages", strings.Join(recipe.Packages, ","))
	_, err := r.cfg.Builder.Build(ctx, recipe, func(line string) {
		r.log.Info("e2b template: build", "template", name, "progress", line)
	})
	return err
}

func sameRecipe(a, b torpor.TemplateBuildRequest) bool {
	a.Name, b.Name = "", ""
	return reflect.DeepEqual(a, b)
}
