package torpor

import (
	"context"
	"path"
	"regexp"
	"strings"
	"time"
)

// Secret is a tenant's named secret. The value is never part of it: the
// store keeps it sealed and only the engine reads it (SecretStore.SecretValue).
type Secret struct {
	Tenant    string    `json:"tenant"`
	Name      string    `json:"name"`
	CreatedAt time.Time `json:"created_at"`
	UpdatedAt time.Time `json:"updated_at"`
	// Version starts at 1 and moves on each set.
	Version int64 `json:"version"`
}

// SecretRef is how a sandbox uses a secret: as an environment variable
// (Env) or as a file (Path), exactly one of the two.
type SecretRef struct {
	Name string `json:"name"`
	Env  string `json:"env,omitempty"`
	Path string `json:"path,omitempty"`
}

// SecretStore keeps tenants' secrets, the value sealed at rest.
type SecretStore interface {
	// SetSecret creates or rotates tenant's secret name at time at (its
	// creation's, then each rotation's); it answers the metadata with the
	// new version.
	SetSecret(ctx context.Context, tenant, name string, value []byte, at time.Time) (Secret, error)
	// ListSecrets answers tenant's secrets by name.
	ListSecrets(ctx context.Context, tenant string) ([]Secret, error)
	// GetSecret answers one secret's metadata; not_found when absent.
	GetSecret(ctx context.Context, tenant, name string) (Secret, error)
	// DeleteSecret removes it; not_found when absent.
	DeleteSecret(ctx context.Context, tenant, name string) error
	// SecretValue reads the value; only the engine calls it, to inject it.
	SecretValue(ctx context.Context, tenant, name string) ([]byte, error)
}

const (
	// MaxSecretRefs bounds a sandbox's secret references.
	MaxSecretRefs = 64
	// MaxSecretValueLen bounds a secret's value.
	MaxSecretValueLen = 64 * 1024
	maxSecretPathLen  = 1024
)

var secretNameRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$`)

// reservedEnv are variables torpor sets itself; a secret may not take them.
var reservedEnv = map[string]bool{"PATH": true, "HOME": true, "HOSTNAME": true, "TERM": true, "USER": true}

// ValidateSecretName checks a secret's name.
func ValidateSecretName(name string) error {
	if !secretNameRe.MatchString(name) {
		return Invalid("name", "secret name %q is not valid", truncate(name))
	}
	return nil
}

// ValidateSecretValue checks a value: not empty, bounded. The error never
// carries the value.
func ValidateSecretValue(v []byte) error {
	if len(v) == 0 || len(v) > MaxSecretValueLen {
		return Invalid("value", "value must be 1 to %d bytes", MaxSecretValueLen)
	}
	return nil
}

// ValidateSecretRefs checks a create's secret references.
func ValidateSecretRefs(refs []SecretRef) error {
	if len(refs) > MaxSecretRefs {
		return Invalid("secrets", "at most %d secrets", MaxSecretRefs)
	}
	envs, paths := map[string]bool{}, map[string]bool{}
	for _, r := range refs {
		if err := ValidateSecretName(r.Name); err != nil {
			return Invalid("secrets", "secret name %q is not valid", truncate(r.Name))
		}
		switch {
		case (r.Env == "") == (r.Path == ""):
			return Invalid("secrets."+r.Name, "exactly one of env and path")
		case r.Env != "":
			if len(r.Env) > maxKeyLen || !envKeyRe.MatchString(r.Env) {
				return Invalid("secrets."+r.Name, "variable name %q is not valid", truncate(r.Env))
			}
			if reservedEnv[r.Env] || strings.HasPrefix(r.Env, "TORPOR_") || strings.HasPrefix(r.Env, "E2B_") {
				return Invalid("secrets."+r.Name, "variable %q is set by torpor", r.Env)
			}
			if envs[r.Env] {
				return Invalid("secrets."+r.Name, "variable %q used twice", r.Env)
			}
			envs[r.Env] = true
		default:
			p := r.Path
			if len(p) > maxSecretPathLen || !path.IsAbs(p) || path.Clean(p) != p || p == "/" || strings.ContainsRune(p, 0) {
				return Invalid("secrets."+r.Name, "path %q must be absolute and clean", truncate(p))
			}
			for _, bad := range []string{"/proc", "/sys", "/dev"} {
				if p == bad || strings.HasPrefix(p, bad+"/") {
					return Invalid("secrets."+r.Name, "path %q is under %s", truncate(p), bad)
				}
			}
			if paths[p] {
				return Invalid("secrets."+r.Name, "path %q used twice", truncate(p))
			}
			paths[p] = true
		}
	}
	return nil
}
