// Package template makes and removes torpor templates: it imports OCI
// images (from a registry, an OCI image layout or a `docker save`
// tarball) and root filesystems (a directory or a tarball), and builds
// Debian templates with debootstrap.
//
// Layers are unpacked once per digest into DATA_DIR/layers/sha256-<hex>/
// and shared by every template and sandbox that uses them: a template is
// a list of layer directories that the runtime stacks with overlayfs.
// Whiteouts are converted to overlayfs' own form while unpacking, so the
// layers stack as they are (no flattening). Each template also gets, when
// its image lacks them, a tiny shared layer with the directories a
// sandbox mounts over (/.torpor, /dev, /proc, /sys, /tmp).
//
// An import is all or nothing: a failure stores no template, and layers
// that only it had unpacked are removed again.
package template

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/torpor-dev/torpor"
)

// Config configures a Manager.
type Config struct {
	// Store keeps the templates. Required.
	Store torpor.TemplateStore
	// Dir is the data directory: layers go to Dir/layers, builds run in
	// Dir/build. Required.
	Dir string
	// Limits bound imports; zero fields take DefaultLimits'.
	Limits Limits
	// Builder builds root filesystems for Build; nil: debootstrap.
	Builder Builder
	Logger  *slog.Logger
	// Now tells the time (time.Now when nil).
	Now func() time.Time
}

// Progress receives one line of progress at a time.
type Progress func(line string)

// Manager makes and removes templates.
type Manager struct {
	store   torpor.TemplateStore
	layers  *layerStore
	lim     Limits
	builder Builder
	dir     string
	log     *slog.Logger
	now     func() time.Time

	mu   sync.Mutex
	busy map[string]bool
}

// New returns a manager over cfg.Dir and removes what interrupted imports
// left there.
func New(ctx context.Context, cfg Config) (*Manager, error) {
	if cfg.Store == nil || cfg.Dir == "" {
		return nil, errors.New("template: Config.Store and Config.Dir are required")
	}
	lim := cfg.Limits
	def := DefaultLimits
	if lim.MaxLayerBytes <= 0 {
		lim.MaxLayerBytes = def.MaxLayerBytes
	}
	if lim.MaxImageBytes <= 0 {
		lim.MaxImageBytes = def.MaxImageBytes
	}
	if lim.MaxEntries <= 0 {
		lim.MaxEntries = def.MaxEntries
	}
	if lim.MaxLayers <= 0 {
		lim.MaxLayers = def.MaxLayers
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	ls, err := newLayerStore(filepath.Join(dir, "layers"), lim)
	if err != nil {
		return nil, fmt.Errorf("template: %w", err)
	}
	m := &Manager{store: cfg.Store, layers: ls, lim: lim, builder: cfg.Builder, dir: dir, log: cfg.Logger, now: cfg.Now, busy: map[string]bool{}}
	if m.builder == nil {
		m.builder = Debootstrap{}
	}
	if m.log == nil {
		m.log = slog.New(slog.DiscardHandler)
	}
	if m.now == nil {
		m.now = time.Now
	}
	if err := m.cleanBuilds(); err != nil {
		return nil, err
	}
	if err := m.collect(ctx); err != nil {
		return nil, err
	}
	return m, nil
}

// made is what a source yields: unpacked (and pinned) layers, lowest
// first, and what the template says about itself.
type made struct {
	layers   []layer
	source   torpor.TemplateSource
	digest   string
	defaults torpor.TemplateDefaults
}

// Import makes a template from an image or a root filesystem.
func (m *Manager) Import(ctx context.Context, req torpor.TemplateImportRequest, progress Progress) (*torpor.Template, error) {
	if err := req.Validate(); err != nil {
		return nil, err
	}
	if progress == nil {
		progress = func(string) {}
	}
	return m.create(ctx, req.Name, progress, func(mk *made) error {
		if req.RootFS != "" {
			return m.fromRootFS(ctx, req.RootFS, progress, mk)
		}
		if err := m.fromImage(ctx, req, progress, mk); err != nil {
			return err
		}
		if req.UseImageCmd {
			if len(mk.defaults.ImageCmd) == 0 {
				return torpor.Invalid("use_image_cmd", "the image has no ENTRYPOINT or CMD")
			}
			mk.defaults.Entrypoint = mk.defaults.ImageCmd
		}
		return nil
	}, req.TemplateOptions)
}

// create reserves name, runs fill to unpack the template's layers, adds
// the mount point layer and stores the template. On failure nothing is
// stored and the layers only this call unpacked are removed.
func (m *Manager) create(ctx context.Context, name string, progress Progress, fill func(*made) error, opts torpor.TemplateOptions) (*torpor.Template, error) {
	if progress == nil {
		progress = func(string) {}
	}
	release, err := m.reserve(ctx, name)
	if err != nil {
		return nil, err
	}
	defer release()
	var mk made
	defer func() { m.unpinAll(mk.layers) }()
	t, err := m.finish(ctx, name, progress, fill, opts, &mk)
	if err != nil {
		m.unpinAll(mk.layers)
		mk.layers = nil
		if cerr := m.collect(context.WithoutCancel(ctx)); cerr != nil {
			m.log.Warn("template: removing the layers of a failed import", "err", cerr)
		}
		return nil, err
	}
	progress(fmt.Sprintf("template %s is ready (%d layers, %s)", name, len(t.Layers), humanBytes(t.SizeBytes)))
	return t, nil
}

func (m *Manager) finish(ctx context.Context, name string, progress Progress, fill func(*made) error, opts torpor.TemplateOptions, mk *made) (*torpor.Template, error) {
	if err := fill(mk); err != nil {
		return nil, err
	}
	if err := m.addSkel(ctx, mk); err != nil {
		return nil, err
	}
	t := &torpor.Template{
		Name:      name,
		Source:    mk.source,
		Digest:    mk.digest,
		Defaults:  applyOptions(mk.defaults, opts),
		CreatedAt: m.now().UTC(),
	}
	for _, l := range mk.layers {
		t.Layers = append(t.Layers, l.FS())
		t.SizeBytes += l.Size
	}
	if err := m.store.PutTemplate(context.WithoutCancel(ctx), *t); err != nil {
		return nil, err
	}
	return t, nil
}

// applyOptions puts a caller's options over the image's defaults.
func applyOptions(d torpor.TemplateDefaults, o torpor.TemplateOptions) torpor.TemplateDefaults {
	if len(o.Env) > 0 {
		env := map[string]string{}
		for k, v := range d.Env {
			env[k] = v
		}
		for k, v := range o.Env {
			env[k] = v
		}
		d.Env = env
	}
	if len(o.Setup) > 0 {
		d.Setup = o.Setup
	}
	if len(o.Entrypoint) > 0 {
		d.Entrypoint = o.Entrypoint
	}
	if o.Resources != nil {
		r := *o.Resources
		d.Resources = &r
	}
	if o.Isolation != "" {
		d.Isolation = o.Isolation
	}
	return d
}

// reserve makes sure no template called name exists or is being made,
// and holds the name until release.
func (m *Manager) reserve(ctx context.Context, name string) (release func(), err error) {
	m.mu.Lock()
	if m.busy[name] {
		m.mu.Unlock()
		return nil, &torpor.Error{Code: torpor.EConflict, Reason: "busy", Message: fmt.Sprintf("template %q is being made by another request", name)}
	}
	m.busy[name] = true
	m.mu.Unlock()
	release = func() {
		m.mu.Lock()
		delete(m.busy, name)
		m.mu.Unlock()
	}
	_, err = m.store.GetTemplate(ctx, name)
	switch {
	case err == nil:
		release()
		return nil, &torpor.Error{Code: torpor.EConflict, Reason: "exists",
			Message: fmt.Sprintf("template %q already exists; remove it first (torpor template rm %s)", name, name)}
	case !torpor.IsCode(err, torpor.ENotFound):
		release()
		return nil, err
	}
	return release, nil
}

// fromImage unpacks the layers of the image a request names.
func (m *Manager) fromImage(ctx context.Context, req torpor.TemplateImportRequest, progress Progress, mk *made) error {
	progress("reading the image manifest")
	img, src, err := openImage(ctx, req)
	if err != nil {
		return m.imageError(ctx, req, err)
	}
	mk.source = src
	digest, err := img.Digest()
	if err != nil {
		return m.imageError(ctx, req, err)
	}
	mk.digest = digest.String()
	cfg, err := img.ConfigFile()
	if err != nil {
		return m.imageError(ctx, req, err)
	}
	if err := checkPlatform(cfg); err != nil {
		return err
	}
	mk.defaults = imageDefaults(cfg)
	layers, err := img.Layers()
	if err != nil {
		return m.imageError(ctx, req, err)
	}
	if len(layers) > m.lim.MaxLayers {
		return badLayer("the image has %d layers; at most %d are allowed", len(layers), m.lim.MaxLayers)
	}
	// The configuration's diff ids (covered by the manifest's digest) are
	// what each layer's uncompressed content must hash to.
	if len(cfg.RootFS.DiffIDs) != len(layers) {
		return badLayer("the image has %d layers but its configuration lists %d", len(layers), len(cfg.RootFS.DiffIDs))
	}
	budget := m.lim.MaxImageBytes
	for i, l := range layers {
		if err := m.imageLayer(ctx, req, l, cfg.RootFS.DiffIDs[i], i, len(layers), &budget, progress, mk); err != nil {
			return err
		}
	}
	return nil
}

// imageLayer unpacks the i-th of n layers (or finds it unpacked), checking
// that its content hashes to diffID.
func (m *Manager) imageLayer(ctx context.Context, req torpor.TemplateImportRequest, l v1.Layer, diffID v1.Hash, i, n int, budget *int64, progress Progress, mk *made) error {
	what := fmt.Sprintf("layer %d/%d %s", i+1, n, shortDigest(diffID.String()))
	if _, ok := m.layers.get(diffID.Hex); ok {
		progress(what + ": already unpacked, shared")
	} else if size, err := l.Size(); err == nil {
		progress(fmt.Sprintf("%s: fetching and unpacking %s", what, humanBytes(size)))
	}
	open := func() (io.ReadCloser, error) {
		rc, err := l.Uncompressed()
		if err != nil {
			return nil, m.imageError(ctx, req, err)
		}
		return newTicker(rc, func(n int64) { progress(fmt.Sprintf("%s: %s unpacked", what, humanBytes(n))) }), nil
	}
	lay, err := m.layers.ensure(ctx, diffID.String(), budget, open)
	if err != nil {
		if te := (*torpor.Error)(nil); !errors.As(err, &te) {
			err = m.imageError(ctx, req, err)
		}
		return err
	}
	mk.layers = append(mk.layers, lay)
	return nil
}

// imageError classifies a failure to read an image: a registry's answer
// or the network for registry images, a bad file otherwise. Errors
// already classified pass through. What the registry or the network said
// is logged whole, since the caller is shown only registryError's words.
func (m *Manager) imageError(ctx context.Context, req torpor.TemplateImportRequest, err error) error {
	var te *torpor.Error
	if errors.As(err, &te) {
		return err
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if req.Image != "" {
		m.log.Warn("template: reading an image from its registry", "image", req.Image, "err", err)
		return registryError(req.Image, err)
	}
	param := "oci_layout"
	if req.DockerArchive != "" {
		param = "docker_archive"
	}
	return torpor.Invalid(param, "cannot read the image: %v", err)
}

// fromRootFS unpacks a root filesystem directory or tarball as one layer.
func (m *Manager) fromRootFS(ctx context.Context, p string, progress Progress, mk *made) error {
	open, err := rootfsOpener(p)
	if err != nil {
		return err
	}
	progress("unpacking the root filesystem " + p)
	mk.source = torpor.TemplateSource{Kind: torpor.SourceRootFS, Ref: p}
	return m.oneLayer(ctx, open, progress, mk)
}

// oneLayer unpacks a stream of unknown digest as the template's layer.
func (m *Manager) oneLayer(ctx context.Context, open func() (io.ReadCloser, error), progress Progress, mk *made) error {
	budget := m.lim.MaxImageBytes
	ticking := func() (io.ReadCloser, error) {
		rc, err := open()
		if err != nil {
			return nil, err
		}
		return newTicker(rc, func(n int64) { progress(humanBytes(n) + " unpacked") }), nil
	}
	lay, err := m.layers.ensure(ctx, "", &budget, ticking)
	if err != nil {
		return err
	}
	mk.layers = append(mk.layers, lay)
	mk.digest = lay.Digest
	return nil
}

// addSkel adds the layer of missing mount points on top, when needed.
func (m *Manager) addSkel(ctx context.Context, mk *made) error {
	var lowers []string
	for _, l := range mk.layers {
		lowers = append(lowers, l.FS())
	}
	data, err := skelTar(lowers)
	if err != nil || data == nil {
		return err
	}
	lay, err := m.layers.ensure(ctx, "", nil, func() (io.ReadCloser, error) { return io.NopCloser(bytesReader(data)), nil })
	if err != nil {
		return fmt.Errorf("template: mount point layer: %w", err)
	}
	mk.layers = append(mk.layers, lay)
	return nil
}

func (m *Manager) unpinAll(ls []layer) {
	for _, l := range ls {
		m.layers.unpin(filepath.Base(l.dir)[len(layerPrefix):])
	}
}

// Delete removes a template that no live sandbox uses, and the layers no
// other template shares. A built-in template cannot be removed.
func (m *Manager) Delete(ctx context.Context, name string) error {
	t, err := m.store.GetTemplate(ctx, name)
	if err != nil {
		return err
	}
	if len(t.Layers) == 0 {
		return torpor.Errorf(torpor.EForbidden, "template %q is built in and cannot be removed", name)
	}
	if err := m.store.DeleteTemplate(ctx, name); err != nil {
		return err
	}
	if err := m.collect(context.WithoutCancel(ctx)); err != nil {
		m.log.Warn("template: removing unused layers", "err", err)
	}
	return nil
}

// collect removes the layers that no stored template uses.
func (m *Manager) collect(ctx context.Context) error {
	ts, err := m.store.ListTemplates(ctx)
	if err != nil {
		return err
	}
	keep := map[string]bool{}
	for _, t := range ts {
		for _, l := range t.Layers {
			if h, ok := m.layers.digestOf(l); ok {
				keep[h] = true
			}
		}
	}
	n, err := m.layers.gc(keep)
	if n > 0 {
		m.log.Info("template: removed unused layers", "count", n)
	}
	return err
}

func shortDigest(d string) string {
	if len(d) > 19 {
		return d[:19]
	}
	return d
}

// humanBytes prints n in binary units.
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	div, exp := int64(unit), 0
	for v := n / unit; v >= unit; v /= unit {
		div *= unit
		exp++
	}
	return fmt.Sprintf("%.1f %ciB", float64(n)/float64(div), "KMGTPE"[exp])
}
