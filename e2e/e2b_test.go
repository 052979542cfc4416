package e2e

import (
	"bufio"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

// The E2B compatibility suite: the official `e2b` and
// `@e2b/code-interpreter` npm packages, at the versions pinned in
// e2e/e2b/package-lock.json, drive a real daemon with real runc
// sandboxes, configured only by the environment `torpor serve` prints.

// needsE2BSDK skips unless node and the npm packages are there.
func needsE2BSDK(t *testing.T) string {
	t.Helper()
	needs(t)
	needsDebootstrap(t)
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("needs Node.js (apt-get install nodejs npm; scripts/test.sh does it)")
	}
	dir, _ := filepath.Abs("e2b")
	for _, pkg := range []string{"e2b", "@e2b/code-interpreter"} {
		if _, err := os.Stat(filepath.Join(dir, "node_modules", pkg, "package.json")); err != nil {
			t.Skipf("needs the npm package %s: run `npm ci` in e2e/e2b (scripts/test.sh does it)", pkg)
		}
	}
	return node
}

var exportRe = regexp.MustCompile(`(?m)^\s*export (E2B_[A-Z_]+)=(.*)$`)

// e2bEnv reads the E2B_* lines that `torpor serve` printed, as a shell
// would evaluate them (the key line reads the admin key file).
func e2bEnv(t *testing.T, d *daemon) []string {
	t.Helper()
	var env []string
	for _, m := range exportRe.FindAllStringSubmatch(d.stdout.String(), -1) {
		v := m[2]
		if f, ok := strings.CutPrefix(v, "$(cat "); ok {
			b, err := os.ReadFile(strings.TrimSuffix(f, ")"))
			if err != nil {
				t.Fatal(err)
			}
			v = strings.TrimSpace(string(b))
		}
		env = append(env, m[1]+"="+v)
	}
	if len(env) != 4 {
		t.Fatalf("torpor serve printed %d E2B_* lines, want 4:\n%s", len(env), d.stdout.String())
	}
	return env
}

// runNode runs node's test runner on files in e2e/e2b with env, logging
// its output as it comes, and fails the test if any of them fails.
func runNode(t *testing.T, node string, env []string, files ...string) {
	t.Helper()
	args := []string{"--test", "--test-concurrency=1", "--test-reporter=spec"}
	if p := os.Getenv("TORPOR_E2B_TEST_PATTERN"); p != "" {
		// Runs only the cases whose names match (node's --test-name-pattern).
		args = append(args, "--test-name-pattern="+p)
	}
	cmd := exec.Command(node, append(args, files...)...)
	cmd.Dir = "e2b"
	cmd.Env = append(os.Environ(), env...)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var all strings.Builder
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		t.Log(sc.Text())
		all.WriteString(sc.Text() + "\n")
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("the E2B SDK suite failed (%v)", err)
	}
	if !strings.Contains(all.String(), "ℹ fail 0") {
		t.Fatalf("the node test runner reported failures or ran nothing")
	}
}

// buildE2BTemplates builds the template E2B programs ask for, once, with
// the CLI (a create would otherwise wait for it); the code interpreter's
// is made from it on first use.
func buildE2BTemplates(t *testing.T, d *daemon) {
	t.Helper()
	start := time.Now()
	out, errs, code := d.cli("template", "build", "--e2b", "e2b-base")
	if code != 0 {
		t.Fatalf("template build --e2b: exit %d\n%s\n%s", code, out, errs)
	}
	t.Logf("built the E2B templates in %s", time.Since(start).Round(time.Second))
}

func TestE2BSDK(t *testing.T) {
	node := needsE2BSDK(t)
	dataDir := t.TempDir()
	// A case that fails before its volume is destroyed leaves it
	// mounted: unmounted after the daemon's shutdown, so that the data
	// dir can be removed.
	t.Cleanup(func() {
		mnts, _ := filepath.Glob(filepath.Join(dataDir, "*", "volumes", "*", "mnt"))
		for _, m := range mnts {
			_ = syscall.Unmount(m, syscall.MNT_DETACH)
		}
	})
	// The suite's tests leave sandboxes running (as E2B's do until their
	// timeout): room for all of them.
	d := startDaemon(t, torporBin(t), dataDir, "TORPOR_CAPACITY_VCPUS=32")
	buildE2BTemplates(t, d)
	env := e2bEnv(t, d)
	if !strings.Contains(strings.Join(env, " "), "E2B_SANDBOX_URL=http://"+d.proxy) {
		t.Fatalf("the printed environment does not name the proxy %s: %v", d.proxy, env)
	}
	// The CLI beside the SDK, on the same daemon.
	cliEnv := append(env, "TORPOR_BIN="+d.bin, "TORPOR_URL=http://"+d.addr, "TORPOR_API_KEY="+d.key)
	runNode(t, node, cliEnv, "sdk.test.mjs", "interp.test.mjs")
	// The secrets test's values (e2b-sdk-secret-*) were in requests only.
	if strings.Contains(d.logs.String(), "e2b-sdk-secret-") {
		t.Fatal("the daemon's log holds a secret's value set through the SDK")
	}

	checkE2BRoutes(t, d)

	// The E2B_DOMAIN form: https://<port>-<id>.<domain>, with a wildcard
	// certificate given to torpor serve and trusted through
	// NODE_EXTRA_CA_CERTS; *.e2b.test resolves to loopback for node only.
	d.shutdown()
	certDir := t.TempDir()
	cert, key := wildcardCert(t, certDir, "e2b.test")
	d = startDaemon(t, torporBin(t), dataDir, "TORPOR_PROXY_DOMAIN=e2b.test", "TORPOR_PROXY_TLS_CERT="+cert, "TORPOR_PROXY_TLS_KEY="+key,
		"TORPOR_E2B_TEMPLATES=base=e2b-base,code-interpreter-v1=e2b-code-interpreter,tiny=base")
	// An alias of the daemon's own: "tiny" is torpor's busybox template.
	var made struct{ SandboxID string }
	if code := e2bCall(t, d, "POST", "/sandboxes", `{"templateID":"tiny","timeout":60}`, &made); code != 201 {
		t.Fatalf("create from an alias: %d", code)
	}
	if sb := d.get(made.SandboxID); sb.Template != "base" {
		t.Fatalf("the alias tiny made a sandbox of %q", sb.Template)
	}
	env = e2bEnv(t, d)
	_, port, _ := net.SplitHostPort(d.proxy)
	if !strings.Contains(strings.Join(env, " "), "E2B_DOMAIN=e2b.test:"+port) {
		t.Fatalf("with TLS, torpor serve should print the E2B_DOMAIN form: %v", env)
	}
	preload, _ := filepath.Abs("e2b/resolve-test-domain.cjs")
	env = append(env, "NODE_EXTRA_CA_CERTS="+cert, "NODE_OPTIONS=--require="+preload)
	runNode(t, node, env, "domain.test.mjs")
}

// wildcardCert writes a self-signed certificate for *.domain and its key.
func wildcardCert(t *testing.T, dir, domain string) (certFile, keyFile string) {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "*." + domain},
		DNSNames: []string{"*." + domain}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(24 * time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature | x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true, IsCA: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &k.PublicKey, k)
	if err != nil {
		t.Fatal(err)
	}
	kd, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		t.Fatal(err)
	}
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kd}), 0o600); err != nil {
		t.Fatal(err)
	}
	return certFile, keyFile
}

// e2bCall sends one request to the daemon's E2B API with its admin key and
// decodes the JSON answer into out (when not nil); it returns the status.
func e2bCall(t *testing.T, d *daemon, method, path, body string, out any) int {
	t.Helper()
	req, err := http.NewRequest(method, "http://"+d.addr+path, strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("X-API-KEY", d.key)
	if body != "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode < 300 && len(b) > 0 {
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s %s: %v: %s", method, path, err, b)
		}
	}
	return resp.StatusCode
}

// checkE2BRoutes calls, through the real daemon, the E2B routes that the
// SDK suite does not: the v1 list, the deprecated resume, v1 connect,
// refreshes and the template list.
func checkE2BRoutes(t *testing.T, d *daemon) {
	var sb struct {
		SandboxID, EnvdAccessToken string
	}
	if code := e2bCall(t, d, "POST", "/sandboxes", `{"templateID":"base","timeout":120,"metadata":{"route":"v1"}}`, &sb); code != 201 || sb.EnvdAccessToken == "" {
		t.Fatalf("POST /sandboxes: %d %+v", code, sb)
	}
	var listed []struct{ SandboxID string }
	if code := e2bCall(t, d, "GET", "/sandboxes?metadata=route%3Dv1", "", &listed); code != 200 || len(listed) != 1 || listed[0].SandboxID != sb.SandboxID {
		t.Fatalf("GET /sandboxes: %d %+v", code, listed)
	}
	if code := e2bCall(t, d, "POST", "/sandboxes/"+sb.SandboxID+"/refreshes", `{"duration":600}`, nil); code != 204 {
		t.Fatalf("refreshes: %d", code)
	}
	var info struct{ EndAt time.Time }
	if e2bCall(t, d, "GET", "/sandboxes/"+sb.SandboxID, "", &info); time.Until(info.EndAt) < 500*time.Second {
		t.Fatalf("a refresh of 600 s left the end at %v", info.EndAt)
	}
	if code := e2bCall(t, d, "POST", "/sandboxes/"+sb.SandboxID+"/pause", "", nil); code != 204 {
		t.Fatalf("pause: %d", code)
	}
	if code := e2bCall(t, d, "POST", "/sandboxes/"+sb.SandboxID+"/resume", `{"timeout":60}`, nil); code != 201 {
		t.Fatalf("resume: %d", code)
	}
	if code := e2bCall(t, d, "POST", "/sandboxes/"+sb.SandboxID+"/resume", `{"timeout":60}`, nil); code != 409 {
		t.Fatalf("resume of a running sandbox: %d, want 409", code)
	}
	e2bCall(t, d, "POST", "/sandboxes/"+sb.SandboxID+"/pause", "", nil)
	if code := e2bCall(t, d, "POST", "/sandboxes/"+sb.SandboxID+"/connect", `{"timeout":60}`, nil); code != 201 {
		t.Fatalf("v1 connect of a paused sandbox: %d", code)
	}
	if got := d.get(sb.SandboxID); got.State != torpor.StateRunning {
		t.Fatalf("after connect: %s", got.State)
	}
	var tmpls []struct{ TemplateID string }
	if code := e2bCall(t, d, "GET", "/templates", "", &tmpls); code != 200 {
		t.Fatalf("GET /templates: %d", code)
	}
	names := ""
	for _, tm := range tmpls {
		names += " " + tm.TemplateID
	}
	if !strings.Contains(names, "e2b-base") {
		t.Fatalf("GET /templates lists%s", names)
	}
	if code := e2bCall(t, d, "DELETE", "/sandboxes/"+sb.SandboxID, "", nil); code != 204 {
		t.Fatalf("kill: %d", code)
	}
}
