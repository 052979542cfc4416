package e2e

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

// cliIn runs the CLI as the key with stdin, and returns stdout, stderr
// and the exit code.
func (d *daemon) cliIn(key, stdin string, args ...string) (string, string, int) {
	d.t.Helper()
	cmd := exec.Command(d.bin, args...)
	cmd.Env = append(os.Environ(), "TORPOR_URL=http://"+d.addr, "TORPOR_API_KEY="+key)
	cmd.Stdin = strings.NewReader(stdin)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		d.t.Fatal(err)
	}
	return out.String(), errb.String(), code
}

// TestSecrets: a tenant's secret, set through the CLI from stdin, reaches
// a real runc sandbox as an environment variable and as a 0400 file; a
// rotation reaches the next exec at once and the file at the next boot;
// and the value shows in no answer of any verb (get, ls, events, pause,
// start, hibernate, the secrets' own verbs, rm), in neither output of the
// CLI, nor in the daemon's log. Another tenant can neither see the secret
// nor name it in a create.
func TestSecrets(t *testing.T) {
	needs(t)
	d := startDaemon(t, torporBin(t), t.TempDir())
	v1 := "tv-e2e-one-" + torpor.NewID("", 16)
	v2 := "tv-e2e-two-" + torpor.NewID("", 16)
	acme := strings.TrimSpace(d.ok("keys", "create", "--tenant", "acme"))
	bravo := strings.TrimSpace(d.ok("keys", "create", "--tenant", "bravo"))

	// Every output that must not hold a value, with what made it.
	var shown []string
	run := func(key, stdin string, args ...string) string {
		t.Helper()
		out, errs, code := d.cliIn(key, stdin, args...)
		shown = append(shown, "torpor "+strings.Join(args, " ")+":\n"+out+errs)
		if code != 0 {
			t.Fatalf("torpor %s: exit %d\n%s%s\ndaemon log:\n%s", strings.Join(args, " "), code, out, errs, d.logs.String())
		}
		return out
	}
	// inside runs a command in the sandbox: its output is the sandbox's
	// own, which holds the value by design.
	inside := func(id string, cmd ...string) string {
		t.Helper()
		out, errs, code := d.cliIn(acme, "", append([]string{"exec", id, "--"}, cmd...)...)
		if code != 0 {
			t.Fatalf("exec %v: exit %d\n%s%s", cmd, code, out, errs)
		}
		return strings.TrimSpace(out)
	}

	if out := run(acme, v1+"\n", "secrets", "set", "db"); !strings.Contains(out, "db version 1") {
		t.Fatalf("secrets set printed %q", out)
	}
	id := strings.TrimSpace(run(acme, "", "create", "--secret", "db=env:DB_PASSWORD", "--secret", "db=path:/run/secrets/db"))
	if got := inside(id, "sh", "-c", "echo $DB_PASSWORD"); got != v1 {
		t.Fatalf("$DB_PASSWORD in an exec = %q, want the secret", got)
	}
	if got := inside(id, "cat", "/run/secrets/db"); got != v1 {
		t.Fatalf("/run/secrets/db = %q, want the secret", got)
	}
	if got := inside(id, "stat", "-c", "%a %u", "/run/secrets/db"); got != "400 0" {
		t.Fatalf("the file's mode and owner = %q, want 400 0", got)
	}
	// The entrypoint's environment (the boot's) has it too.
	if got := inside(id, "sh", "-c", "tr '\\0' '\\n' < /proc/1/environ | grep ^DB_PASSWORD="); got != "DB_PASSWORD="+v1 {
		t.Fatalf("pid 1's DB_PASSWORD = %q", got)
	}

	// A rotation reaches the next exec at once, the file at the next boot.
	if out := run(acme, v2, "secrets", "set", "db"); !strings.Contains(out, "db version 2") {
		t.Fatalf("the rotation printed %q", out)
	}
	if got := inside(id, "sh", "-c", "echo $DB_PASSWORD"); got != v2 {
		t.Fatalf("$DB_PASSWORD after a rotation = %q, want the new value", got)
	}
	if got := inside(id, "cat", "/run/secrets/db"); got != v1 {
		t.Fatalf("/run/secrets/db before the next boot = %q, want the value it booted with", got)
	}

	// A background process gets it, and no description of it shows it.
	run(acme, "", "spawn", id, "--", "sh", "-c", "echo $DB_PASSWORD > /tmp/from-spawn; sleep 60")
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		out, _, _ := d.cliIn(acme, "", "exec", id, "--", "cat", "/tmp/from-spawn")
		if got := strings.TrimSpace(out); got == v2 {
			break
		} else if time.Now().After(deadline) {
			t.Fatalf("a spawned process's $DB_PASSWORD = %q, want the secret", got)
		}
	}
	run(acme, "", "ps", id)
	run(acme, "", "ps", id, "--json")

	// Every verb, with the CLI's human and JSON outputs.
	run(acme, "", "get", id)
	var sb torpor.Sandbox
	if err := json.Unmarshal([]byte(run(acme, "", "get", id, "--json")), &sb); err != nil {
		t.Fatal(err)
	}
	want := []torpor.SecretRef{{Name: "db", Env: "DB_PASSWORD"}, {Name: "db", Path: "/run/secrets/db"}}
	if !slices.Equal(sb.Secrets, want) {
		t.Errorf("the sandbox object's secrets = %+v, want %+v", sb.Secrets, want)
	}
	run(acme, "", "ls")
	run(acme, "", "ls", "--json")
	run(acme, "", "secrets", "list")
	run(acme, "", "secrets", "list", "--json")
	run(acme, "", "secrets", "get", "db")
	var sec torpor.Secret
	if err := json.Unmarshal([]byte(run(acme, "", "secrets", "get", "db", "--json")), &sec); err != nil || sec.Version != 2 || sec.Tenant != "acme" {
		t.Errorf("secrets get --json: %+v, %v", sec, err)
	}
	run(acme, "", "pause", id)
	run(acme, "", "get", id, "--json")
	run(acme, "", "start", id)
	run(acme, "", "hibernate", id)
	run(acme, "", "start", id)
	if got := inside(id, "cat", "/run/secrets/db"); got != v2 {
		t.Fatalf("/run/secrets/db after a cold boot = %q, want the rotated value", got)
	}
	if got := inside(id, "sh", "-c", "tr '\\0' '\\n' < /proc/1/environ | grep ^DB_PASSWORD="); got != "DB_PASSWORD="+v2 {
		t.Fatalf("pid 1's DB_PASSWORD after a cold boot = %q", got)
	}
	run(acme, "", "events", id)
	run(acme, "", "events", id, "--json")
	run(acme, "", "events", "--json")
	run(acme, "", "usage", "--json")

	// Another tenant sees nothing and names nothing.
	if out, errs, code := d.cliIn(bravo, "", "secrets", "get", "db"); code == 0 || !strings.Contains(errs, "not_found") {
		t.Errorf("bravo's secrets get: exit %d %s%s", code, out, errs)
	}
	if out := run(bravo, "", "secrets", "list", "--json"); strings.Contains(out, `"db"`) {
		t.Errorf("bravo's secrets list: %s", out)
	}
	out, errs, code := d.cliIn(bravo, "", "create", "--secret", "db=env:DB_PASSWORD")
	shown = append(shown, "bravo's create:\n"+out+errs)
	if code == 0 || !strings.Contains(errs, "secrets.db") {
		t.Errorf("bravo's create naming acme's secret: exit %d %s%s", code, out, errs)
	}
	if out, errs, code := d.cliIn(bravo, "", "secrets", "delete", "db"); code == 0 || !strings.Contains(errs, "not_found") {
		t.Errorf("bravo's secrets delete: exit %d %s%s", code, out, errs)
	}
	// The admin sees acme's sandbox, not the value.
	run(d.key, "", "ls", "--all-tenants", "--json")

	run(acme, "", "rm", id)
	run(acme, "", "get", id, "--json")
	run(acme, "", "secrets", "delete", "db")
	run(acme, "", "secrets", "list")

	for _, s := range shown {
		if strings.Contains(s, v1) || strings.Contains(s, v2) {
			t.Errorf("an output holds the secret's value:\n%s", s)
		}
	}
	if log := d.logs.String(); strings.Contains(log, v1) || strings.Contains(log, v2) {
		t.Errorf("the daemon's log holds the secret's value:\n%s", log)
	}
}
