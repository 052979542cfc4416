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
	"strconv"
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
// this host's platform when the reference names an index). A failure to
// reach the registry is returned as it is, for imageError to word.
func registryImage(ctx context.Context, ref string, insecure bool) (v1.Image, error) {
	r, err := parseRef(ref, insecure)
	if err != nil {
		return nil, err
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
	return remote.Image(r, ropts...)
}

// parseRef reads an image reference, [registry/]repository[:tag][@digest].
// The parser takes "file:///etc/shadow" for a registry called "file:", so
// a URL of any scheme and a registry that is not host[:port] are refused
// here, before anything is looked up.
func parseRef(ref string, insecure bool) (name.Reference, error) {
	if strings.Contains(ref, "://") {
		return nil, torpor.Invalid("image", "%q is a URL, not an image reference: give [registry/]repository[:tag], e.g. docker.io/library/alpine:3.20 (with insecure for a registry over plain HTTP)", ref)
	}
	var opts []name.Option
	if insecure {
		opts = append(opts, name.Insecure)
	}
	r, err := name.ParseReference(ref, opts...)
	if err != nil {
		return nil, torpor.Invalid("image", "%q is not an image reference: %v", ref, err)
	}
	if reg := r.Context().RegistryStr(); !validRegistry(reg) {
		return nil, torpor.Invalid("image", "%q is not an image reference: its registry %q is not a host name or address with an optional port", ref, reg)
	}
	return r, nil
}

// validRegistry reports whether reg is host[:port]: a host name (an IPv4
// address is one), or an IPv6 address in brackets, and a port from 1 to
// 65535.
func validRegistry(reg string) bool {
	host := reg
	if i := strings.LastIndex(reg, ":"); i >= 0 && !strings.HasSuffix(reg, "]") {
		port := reg[i+1:]
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 || strconv.Itoa(n) != port {
			return false
		}
		host = reg[:i]
	}
	if addr, ok := strings.CutPrefix(host, "["); ok {
		addr, ok = strings.CutSuffix(addr, "]")
		return ok && strings.Contains(addr, ":") && net.ParseIP(addr) != nil
	}
	if host == "" || len(host) > 253 {
		return false
	}
	for _, label := range strings.Split(host, ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return false
		}
		for _, c := range label {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
				return false
			}
		}
	}
	return true
}

// registryError turns a failure to read an image from its registry into
// an error a caller can act on: the registry's refusals and a host that
// does not exist are the request's fault (400), an unreachable registry is
// unavailable (503). What the network says is not passed on: its errors
// name the server's resolver and the addresses it dialed, which are the
// server's own business (imageError logs them). The message names the
// registry only as the reference does.
func registryError(ref string, err error) error {
	reg := ref
	if r, perr := name.ParseReference(ref, name.Insecure); perr == nil {
		reg = r.Context().RegistryStr()
	}
	var te *transport.Error
	var dnsErr *net.DNSError
	var certErr *tls.CertificateVerificationError
	var ne net.Error
	var ue *url.Error
	switch {
	case errors.As(err, &te):
		switch {
		case te.StatusCode == http.StatusNotFound:
			return torpor.Invalid("image", "%s: no such image in the registry", ref)
		case te.StatusCode == http.StatusUnauthorized || te.StatusCode == http.StatusForbidden:
			return torpor.Invalid("image", "%s: the registry refused access (%d)", ref, te.StatusCode)
		case te.StatusCode >= 500:
			return &torpor.Error{Code: torpor.EUnavailable, Message: fmt.Sprintf("%s: the registry failed (%d)", ref, te.StatusCode)}
		}
		return torpor.Invalid("image", "%s: the registry refused the request: %s", ref, hideAddrs(te.Error(), ref))
	case errors.As(err, &dnsErr) && dnsErr.IsNotFound:
		return torpor.Invalid("image", "%s: the registry host %s does not exist", ref, reg)
	case errors.As(err, &certErr):
		return torpor.Invalid("image", "%s: the registry %s presented a TLS certificate this server does not trust (insecure skips the check)", ref, reg)
	case errors.As(err, &ne) && ne.Timeout():
		return &torpor.Error{Code: torpor.EUnavailable, Message: fmt.Sprintf("%s: the registry %s did not answer in time", ref, reg)}
	case errors.As(err, &dnsErr):
		return &torpor.Error{Code: torpor.EUnavailable, Message: fmt.Sprintf("%s: cannot look up the registry host %s", ref, reg)}
	case errors.As(err, &ne) || errors.As(err, &ue):
		return &torpor.Error{Code: torpor.EUnavailable, Message: fmt.Sprintf("%s: cannot reach the registry %s", ref, reg)}
	}
	return torpor.Invalid("image", "%s: %s", ref, hideAddrs(err.Error(), ref))
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
