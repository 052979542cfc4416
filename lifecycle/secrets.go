package lifecycle

import (
	"bytes"
	"context"
	"fmt"
	"maps"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/files"
)

// Tenants' secrets (docs/secrets.md) reach a sandbox through its
// references (Sandbox.Secrets), never through its record: the engine
// reads each value from the store when it boots the sandbox and when it
// starts a process in it, so that a rotated secret reaches the next boot
// and the next exec, and hands it to the runtime only. No value is ever
// put in a sandbox, an event, a log line or an error.

// FailureSecret is the failure of a boot that could not give the sandbox
// one of its secrets: one deleted since the create, or a file that could
// not be written.
const FailureSecret = "secret_unavailable"

// checkSecrets refuses a create whose secret references name a secret the
// tenant does not have, or a file the runtime cannot write.
func (e *Engine) checkSecrets(ctx context.Context, tenant string, rt torpor.Runtime, refs []torpor.SecretRef) error {
	for _, r := range refs {
		if _, err := e.store.GetSecret(ctx, tenant, r.Name); err != nil {
			if torpor.IsCode(err, torpor.ENotFound) {
				return torpor.Invalid("secrets."+r.Name, "no secret %q: set it first (torpor secrets set)", r.Name)
			}
			return err
		}
		if r.Path == "" {
			continue
		}
		if _, err := files.Clean("secrets."+r.Name, r.Path); err != nil {
			return err
		}
		_, onHost := rt.(torpor.FileRoot)
		if _, inside := rt.(SandboxFS); !onHost && !inside {
			return torpor.Invalid("secrets."+r.Name, "the %s runtime cannot give secrets as files; use env", rt.Kind())
		}
	}
	return nil
}

// secretValue reads the value of one of sb's secrets now. A secret
// deleted since the create is a conflict that says so.
func (e *Engine) secretValue(ctx context.Context, sb *torpor.Sandbox, r torpor.SecretRef) ([]byte, error) {
	v, err := e.store.SecretValue(ctx, sb.Tenant, r.Name)
	if torpor.IsCode(err, torpor.ENotFound) {
		return nil, &torpor.Error{Code: torpor.EConflict, Param: "secrets." + r.Name,
			Message: fmt.Sprintf("sandbox %s uses secret %q, which no longer exists: set it again", sb.ID, r.Name)}
	}
	if err != nil {
		return nil, err
	}
	if r.Env != "" && bytes.IndexByte(v, 0) >= 0 {
		return nil, torpor.Invalid("secrets."+r.Name, "secret %q holds a NUL byte and cannot be the variable %s; use path", r.Name, r.Env)
	}
	return v, nil
}

// secretEnv returns env with sb's env secrets added at their current
// values; env's own variables win. It returns env itself when sb has no
// env secret.
func (e *Engine) secretEnv(ctx context.Context, sb *torpor.Sandbox, env map[string]string) (map[string]string, error) {
	var out map[string]string
	for _, r := range sb.Secrets {
		if r.Env == "" {
			continue
		}
		v, err := e.secretValue(ctx, sb, r)
		if err != nil {
			return nil, err
		}
		if out == nil {
			out = map[string]string{}
		}
		out[r.Env] = string(v)
	}
	if out == nil {
		return env, nil
	}
	maps.Copy(out, env)
	return out, nil
}

// execEnv is the environment a process started in sb runs with: the
// request's env over what a claimed pool member needs (claimEnv), over
// sb's env secrets read now.
func (e *Engine) execEnv(ctx context.Context, sb *torpor.Sandbox, env map[string]string) (map[string]string, error) {
	return e.secretEnv(ctx, sb, claimEnv(sb, env))
}

// secretFileMode is the mode of a secret's file: its owner (root) reads
// it, no one else.
var secretFileMode = files.Mode(0o400)

// writeSecretFiles writes sb's file secrets, at their current values,
// into its booted instance, each mode 0400, replacing what an earlier
// boot wrote.
func (e *Engine) writeSecretFiles(ctx context.Context, rt torpor.Runtime, sb *torpor.Sandbox) error {
	var fsys files.FS
	for _, r := range sb.Secrets {
		if r.Path == "" {
			continue
		}
		v, err := e.secretValue(ctx, sb, r)
		if err != nil {
			return err
		}
		if fsys == nil {
			if fsys, err = instanceFS(ctx, rt, sb); err != nil {
				return err
			}
			defer fsys.Close()
		}
		if _, err := fsys.Write(r.Path, bytes.NewReader(v), files.WriteOptions{Mode: &secretFileMode}); err != nil {
			return fmt.Errorf("write secret %q to %s: %w", r.Name, r.Path, err)
		}
	}
	return nil
}

// instanceFS returns the files of sb's running instance, as Files does
// for the files API.
func instanceFS(ctx context.Context, rt torpor.Runtime, sb *torpor.Sandbox) (files.FS, error) {
	if fr, ok := rt.(torpor.FileRoot); ok {
		dir, err := fr.RootFS(ctx, ref(sb))
		if err != nil {
			return nil, err
		}
		root, err := files.OpenRoot(dir)
		if err != nil {
			return nil, err
		}
		return files.HostFS(root), nil
	}
	if sfs, ok := rt.(SandboxFS); ok {
		return sfs.SandboxFS(ctx, ref(sb))
	}
	return nil, torpor.Errorf(torpor.EInvalid, "the %s runtime does not give access to files", rt.Kind())
}

// secretFailure is the failure recorded for a boot that could not give
// sb its secrets; err never holds a value.
func secretFailure(err error) *torpor.Failure {
	return &torpor.Failure{Code: FailureSecret, Message: "secrets: " + err.Error()}
}

// SetSecret creates or rotates tenant's secret name and answers its
// metadata. Sandboxes that use it get the new value at their next boot
// and in their next exec.
func (e *Engine) SetSecret(ctx context.Context, tenant, name string, value []byte) (torpor.Secret, error) {
	if err := torpor.ValidateSecretName(name); err != nil {
		return torpor.Secret{}, err
	}
	if err := torpor.ValidateSecretValue(value); err != nil {
		return torpor.Secret{}, err
	}
	return e.store.SetSecret(ctx, tenant, name, value, e.now())
}

// ListSecrets answers tenant's secrets by name, without values.
func (e *Engine) ListSecrets(ctx context.Context, tenant string) ([]torpor.Secret, error) {
	return e.store.ListSecrets(ctx, tenant)
}

// GetSecret answers one of tenant's secrets, without its value.
func (e *Engine) GetSecret(ctx context.Context, tenant, name string) (torpor.Secret, error) {
	if err := torpor.ValidateSecretName(name); err != nil {
		return torpor.Secret{}, err
	}
	return e.store.GetSecret(ctx, tenant, name)
}

// DeleteSecret removes one of tenant's secrets. The sandboxes that use
// it keep running; their execs are refused and their next boot fails
// until it is set again.
func (e *Engine) DeleteSecret(ctx context.Context, tenant, name string) error {
	if err := torpor.ValidateSecretName(name); err != nil {
		return err
	}
	return e.store.DeleteSecret(ctx, tenant, name)
}

// hideSecretEnv returns env, what a runtime says a process was started
// with, without the variables sb's secrets set, but for those the caller
// gave itself (asked): a process's description never shows a value.
func hideSecretEnv(sb *torpor.Sandbox, env, asked map[string]string) map[string]string {
	var out map[string]string
	for _, r := range sb.Secrets {
		if r.Env == "" {
			continue
		}
		if _, set := env[r.Env]; !set {
			continue
		}
		if _, own := asked[r.Env]; own {
			continue
		}
		if out == nil {
			out = maps.Clone(env)
		}
		delete(out, r.Env)
	}
	if out == nil {
		return env
	}
	return out
}
