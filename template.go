package torpor

import (
	"fmt"
	"net/url"
	"path"
	"regexp"
	"strings"
)

// Template source kinds.
const (
	// SourceBuiltin: built into the daemon (the busybox base).
	SourceBuiltin = "builtin"
	// SourceRegistry: pulled from an OCI registry; Ref is the reference.
	SourceRegistry = "registry"
	// SourceOCILayout: an OCI image layout directory on the server.
	SourceOCILayout = "oci-layout"
	// SourceDockerArchive: a `docker save` tarball on the server.
	SourceDockerArchive = "docker-archive"
	// SourceRootFS: a root filesystem directory or tarball on the server.
	SourceRootFS = "rootfs"
	// SourceDebootstrap: built by debootstrap; Ref is "SUITE+PKG,PKG".
	SourceDebootstrap = "debootstrap"
)

// TemplateSource says where a template's files came from.
type TemplateSource struct {
	Kind string `json:"kind"`
	// Ref is the image reference, server path or recipe.
	Ref string `json:"ref,omitempty"`
}

// TemplateDefaults are what a sandbox created from a template starts with
// unless its create request says otherwise (see Apply).
type TemplateDefaults struct {
	// Env is merged under the request's env (the request wins a name).
	Env map[string]string `json:"env,omitempty"`
	// Setup runs at each boot before the request's own setup commands.
	Setup []string `json:"setup,omitempty"`
	// Entrypoint is used when the request gives none. An image's command
	// becomes the entrypoint only when the import asks for it: most images'
	// command is a shell, which would exit at once and fail the sandbox.
	Entrypoint []string `json:"entrypoint,omitempty"`
	// Resources fill the fields a request leaves at zero.
	Resources *Resources `json:"resources,omitempty"`
	// WorkingDir is the directory the entrypoint starts in ("" is /).
	WorkingDir string `json:"working_dir,omitempty"`
	// ImageCmd is the image's ENTRYPOINT followed by its CMD, kept for
	// reference (and used as Entrypoint when the import says so).
	ImageCmd []string `json:"image_cmd,omitempty"`
	// ImageUser is the image's USER; sandboxes still run as root.
	ImageUser string `json:"image_user,omitempty"`
	// Hooks the image ships (its HooksLabel label): they run before the
	// sandbox's own, unless the create request says ignore_image_hooks.
	Hooks []Hook `json:"hooks,omitempty"`
	// Isolation is the isolation a sandbox of the template gets when its
	// request names neither isolation nor runtime ("": the server's).
	Isolation string `json:"isolation,omitempty"`
}

// HooksLabel is the image label that carries the hooks an image ships, as
// a JSON list of hooks.
const HooksLabel = "dev.torpor.hooks"

// Apply returns req with the defaults filled in: env merged (the request
// wins), the template's setup commands first, the entrypoint when the
// request has none, and resources for the fields it leaves at zero.
func (d TemplateDefaults) Apply(req CreateRequest) CreateRequest {
	if len(d.Env) > 0 {
		env := make(map[string]string, len(d.Env)+len(req.Env))
		for k, v := range d.Env {
			env[k] = v
		}
		for k, v := range req.Env {
			env[k] = v
		}
		req.Env = env
	}
	if len(d.Setup) > 0 {
		req.Runtime.Setup = append(append([]string(nil), d.Setup...), req.Runtime.Setup...)
	}
	if len(req.Runtime.Entrypoint) == 0 && len(d.Entrypoint) > 0 {
		req.Runtime.Entrypoint = append([]string(nil), d.Entrypoint...)
	}
	if req.Isolation == "" && req.Runtime.Kind == "" {
		req.Isolation = d.Isolation
	}
	if len(d.Hooks) > 0 && !req.IgnoreImageHooks {
		req.Hooks = append(append([]Hook(nil), d.Hooks...), req.Hooks...)
	}
	if d.Resources != nil {
		res := *d.Resources
		if req.Resources != nil {
			q := *req.Resources
			if q.VCPUs != 0 {
				res.VCPUs = q.VCPUs
			}
			if q.MemoryMiB != 0 {
				res.MemoryMiB = q.MemoryMiB
			}
			if q.Pids != 0 {
				res.Pids = q.Pids
			}
			if q.DiskMiB != 0 {
				res.DiskMiB = q.DiskMiB
			}
		}
		req.Resources = &res
	}
	return req
}

// LowerDirs returns the template's read-only directories, lowest first:
// its layers, or its single root filesystem directory.
func (t Template) LowerDirs() []string {
	if len(t.Layers) > 0 {
		return t.Layers
	}
	if t.RootFS == "" {
		return nil
	}
	return []string{t.RootFS}
}

// templateNameRe: lowercase letters, digits, '.' and '-', starting with a
// letter or digit, at most 63 characters.
var templateNameRe = regexp.MustCompile(`^[a-z0-9][a-z0-9.-]{0,62}$`)

// ValidateTemplateName checks the name of a new template.
func ValidateTemplateName(param, name string) error {
	if name == "" {
		return Invalid(param, "a template name is required")
	}
	if !templateNameRe.MatchString(name) {
		return Invalid(param, "template name %q must be 1-63 lowercase letters, digits, '.' or '-', starting with a letter or digit", truncate(name))
	}
	return nil
}

// TemplateOptions are the defaults a caller gives a new template; they
// go over what the image says.
type TemplateOptions struct {
	Env        map[string]string `json:"env,omitempty"`
	Setup      []string          `json:"setup,omitempty"`
	Entrypoint []string          `json:"entrypoint,omitempty"`
	Resources  *Resources        `json:"resources,omitempty"`
	// Isolation is the default isolation of the template's sandboxes.
	Isolation string `json:"isolation,omitempty"`
}

// Validate checks the options like the same fields of a create request.
func (o TemplateOptions) Validate() error {
	if err := ValidateEnv(o.Env); err != nil {
		return err
	}
	if err := validateRuntime(RuntimeConfig{Setup: o.Setup, Entrypoint: o.Entrypoint}); err != nil {
		return err
	}
	if err := validateIsolation(o.Isolation); err != nil {
		return err
	}
	if o.Resources != nil {
		req := CreateRequest{Resources: o.Resources}
		if _, err := req.resources(Limits{Max: Resources{VCPUs: 1 << 20, MemoryMiB: 1 << 40, Pids: 1 << 40, DiskMiB: 1 << 40}}); err != nil {
			return err
		}
	}
	return nil
}

// TemplateImportRequest makes a template from an image or a root
// filesystem. Exactly one source is given; the paths are on the server.
type TemplateImportRequest struct {
	Name string `json:"name"`
	// Image is a registry reference ("registry.example/team/app:1.2").
	Image string `json:"image,omitempty"`
	// Insecure lets Image use plain HTTP or an unverified TLS certificate.
	Insecure bool `json:"insecure,omitempty"`
	// OCILayout is an OCI image layout directory.
	OCILayout string `json:"oci_layout,omitempty"`
	// DockerArchive is a `docker save` tarball (plain or gzip).
	DockerArchive string `json:"docker_archive,omitempty"`
	// RootFS is a root filesystem directory or tarball (plain, gzip, zstd).
	RootFS string `json:"rootfs,omitempty"`
	// Tag picks one image of an OCI layout (its ref name annotation) or of
	// a docker archive holding several.
	Tag string `json:"tag,omitempty"`
	// UseImageCmd makes the image's ENTRYPOINT and CMD the template's
	// default entrypoint.
	UseImageCmd bool `json:"use_image_cmd,omitempty"`
	TemplateOptions
}

const maxRefLen = 1024

// Validate checks the request's fields; it does not look at the paths.
func (r *TemplateImportRequest) Validate() error {
	if err := ValidateTemplateName("name", r.Name); err != nil {
		return err
	}
	var given []string
	for _, s := range []struct{ param, v string }{
		{"image", r.Image}, {"oci_layout", r.OCILayout}, {"docker_archive", r.DockerArchive}, {"rootfs", r.RootFS},
	} {
		if s.v == "" {
			continue
		}
		given = append(given, s.param)
		if len(s.v) > maxRefLen || strings.ContainsRune(s.v, 0) {
			return Invalid(s.param, "must be at most %d bytes without NUL", maxRefLen)
		}
		if s.param != "image" && (!strings.HasPrefix(s.v, "/") || path.Clean(s.v) != s.v) {
			return Invalid(s.param, "must be a clean absolute path on the server")
		}
	}
	switch {
	case len(given) == 0:
		return Invalid("image", "give one source: image, oci_layout, docker_archive or rootfs")
	case len(given) > 1:
		return Invalid(given[1], "give only one source (%s)", strings.Join(given, ", "))
	case r.Insecure && r.Image == "":
		return Invalid("insecure", "applies only to image")
	case r.Tag != "" && r.OCILayout == "" && r.DockerArchive == "":
		return Invalid("tag", "applies only to oci_layout and docker_archive")
	case len(r.Tag) > 256 || strings.ContainsRune(r.Tag, 0):
		return Invalid("tag", "must be at most 256 bytes without NUL")
	case r.UseImageCmd && r.RootFS != "":
		return Invalid("use_image_cmd", "a root filesystem has no image command")
	case r.UseImageCmd && len(r.Entrypoint) > 0:
		return Invalid("use_image_cmd", "give either use_image_cmd or entrypoint")
	}
	return r.TemplateOptions.Validate()
}

// TemplateBuildRequest builds a Debian template with debootstrap.
type TemplateBuildRequest struct {
	Name string `json:"name"`
	// Debian is the suite ("bookworm", the default).
	Debian string `json:"debian,omitempty"`
	// Packages are installed on top of the minimal base.
	Packages []string `json:"packages,omitempty"`
	// Mirror is the Debian mirror URL; default: the server's apt sources.
	Mirror string `json:"mirror,omitempty"`
	// Users are accounts added to the built system, each with a home
	// directory /home/NAME that it owns.
	Users []TemplateUser `json:"users,omitempty"`
	TemplateOptions
}

// TemplateUser is an account a build adds: its group has the same name
// and id, its shell is bash (sh without it), its password is locked.
type TemplateUser struct {
	Name string `json:"name"`
	UID  int    `json:"uid"`
	// Sudo lets it run anything as root without a password (the build
	// needs the sudo package).
	Sudo bool `json:"sudo,omitempty"`
}

var userNameRe = regexp.MustCompile(`^[a-z_][a-z0-9_-]{0,31}$`)

const maxTemplateUsers = 16

// DefaultDebianSuite is the suite a build request without one gets.
const DefaultDebianSuite = "bookworm"

var (
	suiteRe   = regexp.MustCompile(`^[a-z][a-z0-9-]{1,31}$`)
	packageRe = regexp.MustCompile(`^[a-z0-9][a-z0-9+.-]{0,99}$`)
)

const maxPackages = 256

// Validate checks the request and fills in the default suite.
func (r *TemplateBuildRequest) Validate() error {
	if err := ValidateTemplateName("name", r.Name); err != nil {
		return err
	}
	if r.Debian == "" {
		r.Debian = DefaultDebianSuite
	}
	if !suiteRe.MatchString(r.Debian) {
		return Invalid("debian", "%q is not a Debian suite name", truncate(r.Debian))
	}
	if len(r.Packages) > maxPackages {
		return Invalid("packages", "at most %d packages", maxPackages)
	}
	for _, p := range r.Packages {
		if !packageRe.MatchString(p) {
			return Invalid("packages", "%q is not a Debian package name", truncate(p))
		}
	}
	if len(r.Users) > maxTemplateUsers {
		return Invalid("users", "at most %d users", maxTemplateUsers)
	}
	seen := map[string]bool{}
	for _, u := range r.Users {
		switch {
		case !userNameRe.MatchString(u.Name):
			return Invalid("users", "user name %q must be 1-32 lowercase letters, digits, '_' or '-', starting with a letter or '_'", truncate(u.Name))
		case u.UID < 1000 || u.UID > 60000:
			return Invalid("users", "user %s: uid must be between 1000 and 60000", u.Name)
		case seen[u.Name] || seen[fmt.Sprint(u.UID)]:
			return Invalid("users", "user %s or uid %d is given twice", u.Name, u.UID)
		}
		seen[u.Name], seen[fmt.Sprint(u.UID)] = true, true
	}
	if r.Mirror != "" {
		u, err := url.Parse(r.Mirror)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || len(r.Mirror) > maxRefLen ||
			strings.ContainsAny(r.Mirror, " ,\x00") || u.User != nil {
			return Invalid("mirror", "must be an http(s) URL of a Debian mirror")
		}
	}
	return r.TemplateOptions.Validate()
}
