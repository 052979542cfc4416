package lifecycle_test

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/lifecycle"
)

// secretEnv is an env whose fake host keeps files and whose tenants acme
// and other exist, acme with the secret db.
func secretEnv(t *testing.T, value string) *env {
	t.Helper()
	e := newEnv(t)
	e.host.FilesDir = t.TempDir()
	for _, tn := range []string{"acme", "other"} {
		if err := e.store.CreateTenant(ctx, torpor.Tenant{Name: tn, CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	e.setSecret("db", value)
	return e
}

func (e *env) setSecret(name, value string) {
	e.t.Helper()
	if _, err := e.store.SetSecret(ctx, "acme", name, []byte(value), time.Now()); err != nil {
		e.t.Fatal(err)
	}
}

// secretFile returns the content and mode of a file the engine wrote in
// sandbox id.
func (e *env) secretFile(id, p string) (string, os.FileMode) {
	e.t.Helper()
	f := filepath.Join(e.host.FilesDir, id, p)
	b, err := os.ReadFile(f)
	if err != nil {
		e.t.Fatal(err)
	}
	st, err := os.Stat(f)
	if err != nil {
		e.t.Fatal(err)
	}
	return string(b), st.Mode().Perm()
}

var dbRefs = []torpor.SecretRef{{Name: "db", Env: "DB_PASSWORD"}, {Name: "db", Path: "/run/secrets/db"}}

// A sandbox gets its secrets' values as they are at each boot (env and a
// 0400 file) and in each exec: a rotation reaches the next exec and the
// next boot, never the record, the view or the events.
func TestSecretsReachBootsAndExecs(t *testing.T) {
	const v1, v2 = "s3cret-value-one-9d2f", "s3cret-value-two-4b7e"
	e := secretEnv(t, v1)
	var mu sync.Mutex
	var execEnv map[string]string
	e.host.ExecFunc = func(ctx context.Context, id string, req torpor.ExecRequest) (torpor.ExecResult, error) {
		mu.Lock()
		defer mu.Unlock()
		execEnv = req.Env
		return torpor.ExecResult{}, nil
	}
	sb := e.create(torpor.CreateRequest{Secrets: dbRefs, Env: map[string]string{"PLAIN": "x"}})
	exec := func(env map[string]string) map[string]string {
		t.Helper()
		if _, err := e.eng.Exec(ctx, "acme", sb.ID, torpor.ExecRequest{Cmd: []string{"env"}, Env: env}); err != nil {
			t.Fatal(err)
		}
		mu.Lock()
		defer mu.Unlock()
		return execEnv
	}
	if got := e.host.Spec(sb.ID).Env; got["DB_PASSWORD"] != v1 || got["PLAIN"] != "x" {
		t.Fatalf("boot env = %v, want DB_PASSWORD=%s beside PLAIN", got, v1)
	}
	if c, mode := e.secretFile(sb.ID, "run/secrets/db"); c != v1 || mode != 0o400 {
		t.Fatalf("secret file = %q mode %o, want %q mode 0400", c, mode, v1)
	}
	if got := exec(map[string]string{"X": "1"}); got["DB_PASSWORD"] != v1 || got["X"] != "1" {
		t.Fatalf("exec env = %v, want DB_PASSWORD=%s and X", got, v1)
	}
	// The exec's own variable wins over the secret.
	if got := exec(map[string]string{"DB_PASSWORD": "mine"}); got["DB_PASSWORD"] != "mine" {
		t.Fatalf("exec env = %v, want the exec's own DB_PASSWORD", got)
	}

	// A background process gets it too, and its description never shows it.
	info, err := e.eng.StartProcess(ctx, "acme", sb.ID, torpor.ProcessRequest{Cmd: []string{"sleep", "9"}, Env: map[string]string{"Y": "2"}})
	if err != nil {
		t.Fatal(err)
	}
	procs, err := e.eng.ListProcesses(ctx, "acme", sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if _, shown := info.Env["DB_PASSWORD"]; shown || info.Env["Y"] != "2" || len(procs) != 1 {
		t.Fatalf("the started process = %+v, %d listed; want its own env only", info, len(procs))
	}
	if _, shown := procs[0].Env["DB_PASSWORD"]; shown {
		t.Fatalf("the listed process shows the secret: %+v", procs[0])
	}
	e.setSecret("db", v2)
	if got := exec(nil); got["DB_PASSWORD"] != v2 {
		t.Fatalf("exec env after a rotation = %v, want %s", got, v2)
	}
	if got := e.host.Spec(sb.ID).Env["DB_PASSWORD"]; got != v1 {
		t.Fatalf("the running boot's env = %q: a rotation changes nothing until the next boot", got)
	}
	if _, err := e.eng.Restart(ctx, "acme", sb.ID); err != nil {
		t.Fatal(err)
	}
	if got := e.host.Spec(sb.ID).Env["DB_PASSWORD"]; got != v2 {
		t.Fatalf("boot env after a restart = %q, want %s", got, v2)
	}
	if c, _ := e.secretFile(sb.ID, "run/secrets/db"); c != v2 {
		t.Fatalf("secret file after a restart = %q, want %s", c, v2)
	}

	view := e.get(sb.ID)
	if len(view.Secrets) != 2 || view.Secrets[0] != dbRefs[0] || view.Secrets[1] != dbRefs[1] {
		t.Fatalf("the sandbox's secrets = %+v, want the references %+v", view.Secrets, dbRefs)
	}
	stored, err := e.store.GetSandbox(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	evs, err := e.eng.Events(ctx, "acme", torpor.EventFilter{})
	if err != nil {
		t.Fatal(err)
	}
	for what, v := range map[string]any{"the view": view, "the record": stored, "the record's env": stored.Env, "the events": evs} {
		b, _ := json.Marshal(v)
		if bytes.Contains(b, []byte(v1)) || bytes.Contains(b, []byte(v2)) {
			t.Errorf("%s holds a secret's value: %s", what, b)
		}
	}
}

// A create names only secrets its tenant has, in places the sandbox can
// take them.
func TestCreateChecksSecretRefs(t *testing.T) {
	e := secretEnv(t, "v")
	if _, err := e.store.SetSecret(ctx, "other", "theirs", []byte("x"), time.Now()); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		refs  []torpor.SecretRef
		env   map[string]string
		param string
	}{
		{refs: []torpor.SecretRef{{Name: "missing", Env: "X"}}, param: "secrets.missing"},
		{refs: []torpor.SecretRef{{Name: "theirs", Env: "X"}}, param: "secrets.theirs"},
		{refs: []torpor.SecretRef{{Name: "db", Env: "X"}}, env: map[string]string{"X": "1"}, param: "secrets.db"},
		{refs: []torpor.SecretRef{{Name: "db", Path: "/.torpor/x"}}, param: "secrets.db"},
		{refs: []torpor.SecretRef{{Name: "db", Env: "PATH"}}, param: "secrets.db"},
	} {
		_, err := e.eng.Create(ctx, "acme", torpor.CreateRequest{Template: "base", Secrets: c.refs, Env: c.env})
		te := torpor.AsError(err)
		if !torpor.IsCode(err, torpor.EInvalid) || te.Param != c.param {
			t.Errorf("create with %+v: %v (param %q), want invalid naming %s", c.refs, err, te.Param, c.param)
		}
	}
	if sbs, _ := e.eng.List(ctx, "acme", torpor.SandboxFilter{IncludeTerminated: true}); len(sbs) != 0 {
		t.Fatalf("refused creates left sandboxes: %d", len(sbs))
	}
}

// A secret deleted after the create: execs are refused saying which, and
// the next boot fails as secret_unavailable; setting it again mends both.
func TestDeletedSecret(t *testing.T) {
	e := secretEnv(t, "v1-value")
	sb := e.create(torpor.CreateRequest{Secrets: dbRefs})
	if err := e.store.DeleteSecret(ctx, "acme", "db"); err != nil {
		t.Fatal(err)
	}
	_, err := e.eng.Exec(ctx, "acme", sb.ID, torpor.ExecRequest{Cmd: []string{"true"}})
	if !torpor.IsCode(err, torpor.EConflict) || !strings.Contains(err.Error(), `"db"`) {
		t.Fatalf("exec with a deleted secret: %v, want a conflict naming it", err)
	}
	if _, err := e.eng.Restart(ctx, "acme", sb.ID); err != nil {
		t.Fatal(err)
	}
	got := e.get(sb.ID)
	if got.State != torpor.StateFailed || got.Failure == nil || got.Failure.Code != lifecycle.FailureSecret {
		t.Fatalf("after a restart without the secret: %s %+v, want failed with %s", got.State, got.Failure, lifecycle.FailureSecret)
	}
	e.setSecret("db", "v2-value")
	if _, err := e.eng.Start(ctx, "acme", sb.ID); err != nil {
		t.Fatal(err)
	}
	if got := e.host.Spec(sb.ID).Env["DB_PASSWORD"]; got != "v2-value" {
		t.Fatalf("boot env after the secret is back = %q", got)
	}
}

// A create with secrets boots cold rather than claim a warm pool member,
// which booted without them.
func TestSecretsSkipTheWarmPool(t *testing.T) {
	e := newEnv(t, withPools(map[string]int{"base": 1}))
	e.host.FilesDir = t.TempDir()
	if err := e.store.CreateTenant(ctx, torpor.Tenant{Name: "acme", CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	e.setSecret("db", "pool-secret-value")
	e.waitReady("base", 1)
	sb := e.create(torpor.CreateRequest{Secrets: dbRefs})
	if sb.FromPool || e.host.Spec(sb.ID).Env["DB_PASSWORD"] != "pool-secret-value" {
		t.Fatalf("a create with secrets: from_pool %v, boot env %v; want a cold boot with the secret", sb.FromPool, e.host.Spec(sb.ID).Env)
	}
	if e.pool("base").Ready != 1 {
		t.Fatalf("the pool's member was taken: %+v", e.pool("base"))
	}
}
