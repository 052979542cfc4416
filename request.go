package torpor

import (
	"fmt"
	"regexp"
	"strings"
)

// CreateRequest is what a caller asks for when creating a sandbox.
type CreateRequest struct {
	Template  string            `json:"template"`
	Resources *Resources        `json:"resources,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	Runtime   RuntimeConfig     `json:"runtime"`
	PolicyRequest
	Hooks            []Hook `json:"hooks,omitempty"`
	IgnoreImageHooks bool   `json:"ignore_image_hooks,omitempty"`
	// Ports lists the ports the proxy opens to anyone (public).
	Ports []PortSpec `json:"ports,omitempty"`
	// AllowInternet lets the sandbox reach the internet (off by default).
	AllowInternet bool `json:"allow_internet,omitempty"`
	// Network holds the sandbox's egress rules (docs/egress.md); none:
	// AllowInternet alone says where it may go.
	Network *NetworkRules `json:"network,omitempty"`
	// Secrets are the tenant's secrets the sandbox gets, as environment
	// variables or files (docs/secrets.md); each must exist.
	Secrets []SecretRef `json:"secrets,omitempty"`
	// VolumeMounts are the tenant's volumes the sandbox mounts
	// (docs/volumes.md); each must exist.
	VolumeMounts []VolumeMount `json:"volume_mounts,omitempty"`
	// Isolation picks the kind of runtime: "container" or "vm" (empty:
	// runtime.kind, else the server's default).
	Isolation string `json:"isolation,omitempty"`
	// Accel asks for a GPU lease (docs/gpu.md).
	Accel *AccelRequest `json:"accel,omitempty"`
	// Wakeups are the sandbox's scheduled wake-ups (docs/schedule.md),
	// checked by the engine against its clock.
	Wakeups []WakeupSpec `json:"wakeups,omitempty"`
	// NodeLabels places the sandbox, in a fleet, on a node that has every
	// one of these labels (torpor serve --node-label; docs/fleet.md).
	NodeLabels map[string]string `json:"node_labels,omitempty"`
	// Caller is who asks: set by the API from the request's key, never
	// read from the body.
	Caller Caller `json:"-"`
}

// Caller is the API key a request came with.
type Caller struct {
	KeyID string
	// Tier is the key's tier (TierStandard when empty).
	Tier string
}

// AccelRequest is the `accel` object of a create request: a GPU lease of
// VRAMMiB of VRAM on GPUs GPUs (see gpu.AccelRequest for the rules).
type AccelRequest struct {
	GPUs        int    `json:"gpus,omitempty"`
	VRAMMiB     int64  `json:"vram_mib"`
	SuspendMode string `json:"suspend_mode,omitempty"`
	// IdleTimeoutS: omitted or null is the default (600 s), 0 turns idle
	// auto-pause off, else 60 to 86400.
	IdleTimeoutS *float64 `json:"idle_timeout_s,omitempty"`
}

// Accel is a sandbox's validated GPU lease request.
type Accel struct {
	GPUs         int    `json:"gpus"`
	VRAMMiB      int64  `json:"vram_mib"`
	SuspendMode  string `json:"suspend_mode"`
	IdleTimeoutS int    `json:"idle_timeout_s"`
}

// UpdateRequest changes a sandbox in place (PATCH). Absent fields stay as
// they are; a metadata value of null or "" removes the key; a policy field
// of null turns that rule off.
type UpdateRequest struct {
	Metadata map[string]*string `json:"metadata,omitempty"`
	PolicyRequest
	// Hooks, when given, replace the sandbox's hooks ([] removes them).
	Hooks *[]Hook `json:"hooks,omitempty"`
	// Ports, when given, replace the sandbox's port settings.
	Ports *[]PortSpec `json:"ports,omitempty"`
	// Wakeups, when given, replace the sandbox's wake-ups ([] removes
	// them).
	Wakeups *[]WakeupSpec `json:"wakeups,omitempty"`
	// Network, when given, replaces the sandbox's egress rules
	// (docs/egress.md; {} removes them), enforced at once on a running
	// or paused sandbox.
	Network *NetworkRules `json:"network,omitempty"`
}

// Limits bound what a caller may ask for.
type Limits struct {
	// Default fills the resources a request leaves at zero.
	Default Resources
	// Max is the most of each resource one sandbox may have.
	Max Resources
}

// DefaultLimits are the limits of a server with no configuration.
var DefaultLimits = Limits{
	Default: Resources{VCPUs: 1, MemoryMiB: 512, Pids: 1024, DiskMiB: 2048},
	Max:     Resources{VCPUs: 64, MemoryMiB: 256 * 1024, Pids: 1 << 20, DiskMiB: 4 << 20},
}

const (
	maxMapEntries   = 64
	maxEnvEntries   = 256
	maxKeyLen       = 128
	maxValueLen     = 1024
	maxEnvValueLen  = 32 * 1024
	maxSetupCmds    = 64
	maxCommandBytes = 64 * 1024
	maxArgs         = 1024
	minMemoryMiB    = 16
)

var (
	metadataKeyRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._/-]*$`)
	envKeyRe      = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)
	templateRe    = regexp.MustCompile(`^[a-z0-9][a-z0-9._-]{0,62}$`)
)

// Validate checks every field of r and returns the resources the sandbox
// gets (defaults filled in). The error is an invalid_argument naming the
// first offending field.
func (r *CreateRequest) Validate(l Limits) (Resources, error) {
	if r.Template == "" {
		return Resources{}, Invalid("template", "template is required")
	}
	if !templateRe.MatchString(r.Template) {
		return Resources{}, Invalid("template", "template name %q is not valid", r.Template)
	}
	res, err := r.resources(l)
	if err != nil {
		return Resources{}, err
	}
	if err := ValidateEnv(r.Env); err != nil {
		return Resources{}, err
	}
	if err := ValidateMetadata("metadata", r.Metadata); err != nil {
		return Resources{}, err
	}
	if err := validateRuntime(r.Runtime); err != nil {
		return Resources{}, err
	}
	if err := validateIsolation(r.Isolation); err != nil {
		return Resources{}, err
	}
	if err := r.PolicyRequest.Validate(); err != nil {
		return Resources{}, err
	}
	if err := ValidateHooks(r.Hooks); err != nil {
		return Resources{}, err
	}
	if err := ValidatePorts(r.Ports); err != nil {
		return Resources{}, err
	}
	if err := ValidateNodeLabels("node_labels", r.NodeLabels); err != nil {
		return Resources{}, err
	}
	if err := ValidateSecretRefs(r.Secrets); err != nil {
		return Resources{}, err
	}
	if err := ValidateVolumeMounts(r.VolumeMounts); err != nil {
		return Resources{}, err
	}
	if err := ValidateNetworkRules("network", r.Network); err != nil {
		return Resources{}, err
	}
	for _, ref := range r.Secrets {
		if _, ok := r.Env[ref.Env]; ok && ref.Env != "" {
			return Resources{}, Invalid("secrets."+ref.Name, "variable %q is also set in env", ref.Env)
		}
	}
	return res, nil
}

func (r *CreateRequest) resources(l Limits) (Resources, error) {
	res := l.Default
	if r.Resources == nil {
		return res, nil
	}
	q := *r.Resources
	type check struct {
		param       string
		val, max    float64
		min         float64
		set         func()
		unit        string
		integerOnly bool
	}
	checks := []check{
		{"resources.vcpus", q.VCPUs, l.Max.VCPUs, 0.01, func() { res.VCPUs = q.VCPUs }, "vCPUs", false},
		{"resources.memory_mib", float64(q.MemoryMiB), float64(l.Max.MemoryMiB), minMemoryMiB, func() { res.MemoryMiB = q.MemoryMiB }, "MiB", true},
		{"resources.pids", float64(q.Pids), float64(l.Max.Pids), 8, func() { res.Pids = q.Pids }, "processes", true},
		{"resources.disk_mib", float64(q.DiskMiB), float64(l.Max.DiskMiB), 64, func() { res.DiskMiB = q.DiskMiB }, "MiB", true},
	}
	for _, c := range checks {
		switch {
		case c.val == 0:
			continue // default
		case c.val < 0:
			return Resources{}, Invalid(c.param, "must not be negative")
		case c.val < c.min:
			return Resources{}, Invalid(c.param, "must be at least %v %s", c.min, c.unit)
		case c.val > c.max:
			return Resources{}, Invalid(c.param, "must be at most %v %s on this server", c.max, c.unit)
		}
		c.set()
	}
	return res, nil
}

// ValidateMetadata checks a metadata map (string keys and values, bounded).
func ValidateMetadata(param string, m map[string]string) error {
	if len(m) > maxMapEntries {
		return Invalid(param, "at most %d entries", maxMapEntries)
	}
	for k, v := range m {
		if len(k) > maxKeyLen || !metadataKeyRe.MatchString(k) {
			return Invalid(param, "key %q must be 1-%d letters, digits, '.', '_', '/' or '-'", truncate(k), maxKeyLen)
		}
		if len(v) > maxValueLen || strings.ContainsRune(v, 0) {
			return Invalid(param+"."+k, "value must be at most %d bytes of text", maxValueLen)
		}
	}
	return nil
}

// MaxNodeLabels bounds the node labels a create may ask for.
const MaxNodeLabels = 16

// nodeLabelRe is what a node label's key and value may be (a value may
// also be empty): the rule of torpor serve --node-label, so that a create
// can ask for any label a node can have and for no other.
var nodeLabelRe = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9._/-]{0,62})?$`)

// ValidateNodeLabels checks the node labels a create asks for: at most
// MaxNodeLabels pairs, keys and values as a node's labels are.
func ValidateNodeLabels(param string, m map[string]string) error {
	if len(m) > MaxNodeLabels {
		return Invalid(param, "at most %d labels", MaxNodeLabels)
	}
	for k, v := range m {
		if !nodeLabelRe.MatchString(k) {
			return Invalid(param, "label %q must be 1-63 letters, digits, '.', '_', '/' or '-', starting with a letter or digit", truncate(k))
		}
		if v != "" && !nodeLabelRe.MatchString(v) {
			return Invalid(param, "the value of label %s must be up to 63 letters, digits, '.', '_', '/' or '-', starting with a letter or digit", k)
		}
	}
	return nil
}

// ValidateEnv checks environment variables: POSIX names, no NUL bytes.
func ValidateEnv(env map[string]string) error {
	if len(env) > maxEnvEntries {
		return Invalid("env", "at most %d variables", maxEnvEntries)
	}
	for k, v := range env {
		if len(k) > maxKeyLen || !envKeyRe.MatchString(k) {
			return Invalid("env", "variable name %q is not valid", truncate(k))
		}
		if len(v) > maxEnvValueLen || strings.ContainsRune(v, 0) {
			return Invalid("env."+k, "value must be at most %d bytes without NUL", maxEnvValueLen)
		}
	}
	return nil
}

func validateRuntime(rc RuntimeConfig) error {
	if len(rc.Setup) > maxSetupCmds {
		return Invalid("runtime.setup", "at most %d commands", maxSetupCmds)
	}
	for i, c := range rc.Setup {
		if strings.TrimSpace(c) == "" || len(c) > maxCommandBytes || strings.ContainsRune(c, 0) {
			return Invalid(fmt.Sprintf("runtime.setup[%d]", i), "must be a non-empty command of at most %d bytes", maxCommandBytes)
		}
	}
	return ValidateArgv("runtime.entrypoint", rc.Entrypoint, true)
}

// ValidateArgv checks a command line: at most maxArgs arguments without
// NUL bytes, and a non-empty program name unless the whole argv may be empty.
func ValidateArgv(param string, argv []string, emptyOK bool) error {
	if len(argv) == 0 {
		if emptyOK {
			return nil
		}
		return Invalid(param, "a command is required")
	}
	if len(argv) > maxArgs {
		return Invalid(param, "at most %d arguments", maxArgs)
	}
	if argv[0] == "" {
		return Invalid(param, "the program name must not be empty")
	}
	total := 0
	for _, a := range argv {
		total += len(a)
		if strings.ContainsRune(a, 0) {
			return Invalid(param, "arguments must not contain NUL bytes")
		}
	}
	if total > maxCommandBytes {
		return Invalid(param, "at most %d bytes in all", maxCommandBytes)
	}
	return nil
}

func truncate(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

func validateIsolation(isolation string) error {
	switch isolation {
	case "", IsolationContainer, IsolationVM:
		return nil
	}
	return Invalid("isolation", "must be %s or %s", IsolationContainer, IsolationVM)
}
