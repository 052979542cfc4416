package template

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	goruntime "runtime"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/tarball"

	"github.com/torpor-dev/torpor"
)

// hostPlatform is the platform picked from multi-platform images.
var hostPlatform = v1.Platform{OS: "linux", Architecture: goruntime.GOARCH}

// openImage returns the image a request names and its source.
func openImage(ctx context.Context, req torpor.TemplateImportRequest) (v1.Image, torpor.TemplateSource, error) {
	switch {
	case req.Image != "":
		img, err := registryImage(ctx, req.Image, req.Insecure)
		return img, torpor.TemplateSource{Kind: torpor.SourceRegistry, Ref: req.Image}, err
	case req.OCILayout != "":
		img, err := layoutImage(req.OCILayout, req.Tag)
		return img, torpor.TemplateSource{Kind: torpor.SourceOCILayout, Ref: req.OCILayout}, err
	case req.DockerArchive != "":
		img, err := archiveImage(req.DockerArchive, req.Tag)
		return img, torpor.TemplateSource{Kind: torpor.SourceDockerArchive, Ref: req.DockerArchive}, err
	}
	return nil, torpor.TemplateSource{}, torpor.Invalid("image", "no image source")
}

// registryImage fetches the manifest of an image from its registry (for
// this host's platform when the reference names an index).
func registryImage(ctx context.Context, ref string, insecure bool) (v1.Image, error) {
	var opts []name.Option
	if insecure {
		opts = append(opts, name.Insecure)
	}
	r, err := name.ParseReference(ref, opts...)
	if err != nil {
		return nil, torpor.Invalid("image", "%q is not an image reference: %v", ref, err)
	}
	ropts := []remote.Option{
		remote.WithContext(ctx),
		remote.WithPlatform(hostPlatform),
		remote.WithAuthFromKeychain(authn.DefaultKeychain),
	}
	if insecure {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.TLSClientConfig = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // asked for with insecure
		ropts = append(ropts, remote.WithTransport(t))
	}
	img, err := remote.Image(r, ropts...)
	if err != nil {
		return nil, registryError(ctx, ref, err)
	}
	return img, nil
}

// registryError turns a registry failure into an error a caller can act
// on: the registry's refusals are the request's fault (400), an
// unreachable registry is unavailable (503).
func registryError(ctx context.Context, ref string, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	var te *transport.Error
	if errors.As(err, &te) {
		switch {
		case te.StatusCode == http.StatusNotFound:
			return torpor.Invalid("image", "%s: no such image in the registry", ref)
		case te.StatusCode == http.StatusUnauthorized || te.StatusCode == http.StatusForbidden:
			return torpor.Invalid("image", "%s: the registry refused access (%d)", ref, te.StatusCode)
		case te.StatusCode >= 500:
			return &torpor.Error{Code: torpor.EUnavailable, Message: fmt.Sprintf("%s: the registry failed (%d)", ref, te.StatusCode)}
		}
		return torpor.Invalid("image", "%s: the registry refused the request: %v", ref, te)
	}
	var ne net.Error
	var ue *url.Error
	if errors.As(err, &ne) || errors.As(err, &ue) {
		return &torpor.Error{Code: torpor.EUnavailable, Message: fmt.Sprintf("%s: cannot reach the registry: %v", ref, err)}
	}
	return torpor.Invalid("image", "%s: %v", ref, err)
}

// layoutImage reads an image from an OCI image layout: the one image it
// holds, the one whose ref name is tag, or the one for this platform.
func layoutImage(dir, tag string) (v1.Image, error) {
	if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
		return nil, torpor.Invalid("oci_layout", "%s is not a directory on the server", dir)
	}
	p, err := layout.FromPath(dir)
	if err != nil {
		return nil, torpor.Invalid("oci_layout", "%s is not an OCI image layout: %v", dir, err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		return nil, torpor.Invalid("oci_layout", "%s: %v", dir, err)
	}
	img, err := pickImage(idx, tag, 0)
	if err != nil {
		return nil, torpor.Invalid("oci_layout", "%s: %v", dir, err)
	}
	return img, nil
}

const refNameAnnotation = "org.opencontainers.image.ref.name"

// pickImage chooses an image of an index, descending into nested ones.
func pickImage(idx v1.ImageIndex, tag string, depth int) (v1.Image, error) {
	if depth > 4 {
		return nil, errors.New("indexes nested too deep")
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, err
	}
	var cands []v1.Descriptor
	for _, d := range im.Manifests {
		if tag != "" && depth == 0 && d.Annotations[refNameAnnotation] != tag {
			continue
		}
		if d.MediaType.IsImage() || d.MediaType.IsIndex() {
			cands = append(cands, d)
		}
	}
	if len(cands) == 0 {
		if tag != "" {
			return nil, fmt.Errorf("no image tagged %q", tag)
		}
		return nil, errors.New("no image in it")
	}
	d := cands[0]
	if len(cands) > 1 {
		found := false
		for _, c := range cands {
			if c.Platform != nil && c.Platform.Satisfies(hostPlatform) {
				d, found = c, true
				break
			}
		}
		if !found {
			return nil, fmt.Errorf("%d images and none for %s: give a tag", len(cands), hostPlatform)
		}
	}
	if d.MediaType.IsIndex() {
		child, err := idx.ImageIndex(d.Digest)
		if err != nil {
			return nil, err
		}
		return pickImage(child, "", depth+1)
	}
	return idx.Image(d.Digest)
}

// archiveImage reads an image from a `docker save` tarball (plain or
// gzip); tag picks one when it holds several.
func archiveImage(p, tag string) (v1.Image, error) {
	if fi, err := os.Stat(p); err != nil || !fi.Mode().IsRegular() {
		return nil, torpor.Invalid("docker_archive", "%s is not a file on the server", p)
	}
	var t *name.Tag
	if tag != "" {
		nt, err := name.NewTag(tag)
		if err != nil {
			return nil, torpor.Invalid("tag", "%q is not an image tag: %v", tag, err)
		}
		t = &nt
	}
	img, err := tarball.Image(func() (io.ReadCloser, error) { return openTarball(p) }, t)
	if err != nil {
		return nil, torpor.Invalid("docker_archive", "%s is not a docker save archive: %v", p, err)
	}
	return img, nil
}

// imageDefaults turns an image's configuration into template defaults.
// Environment variables whose names a sandbox would refuse are dropped.
func imageDefaults(cfg *v1.ConfigFile) torpor.TemplateDefaults {
	c := cfg.Config
	d := torpor.TemplateDefaults{WorkingDir: c.WorkingDir, ImageUser: c.User}
	for _, kv := range c.Env {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || torpor.ValidateEnv(map[string]string{k: v}) != nil {
			continue
		}
		if d.Env == nil {
			d.Env = map[string]string{}
		}
		d.Env[k] = v
	}
	d.ImageCmd = append(append([]string(nil), c.Entrypoint...), c.Cmd...)
	if torpor.ValidateArgv("image_cmd", d.ImageCmd, true) != nil {
		d.ImageCmd = nil
	}
	d.Hooks = imageHooks(c.Labels[torpor.HooksLabel])
	return d
}

// imageHooks reads the hooks an image ships in its label; a label that is
// not a valid list of hooks ships none.
func imageHooks(label string) []torpor.Hook {
	if label == "" {
		return nil
	}
	var hooks []torpor.Hook
	dec := json.NewDecoder(strings.NewReader(label))
	dec.DisallowUnknownFields()
	if dec.Decode(&hooks) != nil || torpor.ValidateHooks(hooks) != nil {
		return nil
	}
	return hooks
}

// checkPlatform refuses an image built for another OS or architecture.
func checkPlatform(cfg *v1.ConfigFile) error {
	if cfg.OS != "" && cfg.OS != "linux" {
		return torpor.Invalid("image", "the image is for %s, not linux", cfg.OS)
	}
	if cfg.Architecture != "" && cfg.Architecture != hostPlatform.Architecture {
		return torpor.Invalid("image", "the image is for %s; this server runs %s", cfg.Architecture, hostPlatform.Architecture)
	}
	return nil
}
