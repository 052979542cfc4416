package envd_test

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/e2b/envd"
	pb "github.com/torpor-dev/torpor/e2b/envd/proto/filesystem"
	"github.com/torpor-dev/torpor/e2b/envd/proto/process"
	"github.com/torpor-dev/torpor/e2b/interp"
)

// serviceRequest is one request to a service port.
type serviceRequest struct {
	port                      int
	method, path, ctype, body string
}

// serviceRoutes are a request to every route of envd and of the code
// interpreter: each procedure of envd's Connect services, read from their
// descriptors so that a new one is in, envd's HTTP routes and the
// interpreter's.
func serviceRoutes() []serviceRequest {
	var out []serviceRequest
	for _, fd := range []protoreflect.FileDescriptor{process.File_process_process_proto, pb.File_filesystem_filesystem_proto} {
		for i := 0; i < fd.Services().Len(); i++ {
			s := fd.Services().Get(i)
			for j := 0; j < s.Methods().Len(); j++ {
				out = append(out, serviceRequest{envd.Port, "POST", "/" + string(s.FullName()) + "/" + string(s.Methods().Get(j).Name()), "application/json", `{}`})
			}
		}
	}
	return append(out,
		serviceRequest{envd.Port, "GET", "/health", "", ""},
		serviceRequest{envd.Port, "GET", "/files?path=/home/user/secret", "", ""},
		serviceRequest{envd.Port, "POST", "/files?path=/home/user/x", "application/octet-stream", "pwned"},
		serviceRequest{interp.Port, "GET", "/health", "", ""},
		serviceRequest{interp.Port, "POST", "/execute", "application/json", `{"code":"1"}`},
		serviceRequest{interp.Port, "GET", "/contexts", "", ""},
		serviceRequest{interp.Port, "POST", "/contexts", "application/json", `{}`},
		serviceRequest{interp.Port, "DELETE", "/contexts/x", "", ""},
		serviceRequest{interp.Port, "POST", "/contexts/x/restart", "", ""},
	)
}

// TestServicePortsRefuseAnotherSandboxsToken: every route of envd and of
// the code interpreter, sent through the proxy to tenant A's sandbox
// (paused, with auto_resume) with tenant B's sandbox's access token, is
// refused exactly as a wrong token is, and as B's token is on a sandbox
// that does not exist: 403, the same body. A URL signed with B's token is
// refused as a wrongly signed one (401). None of it wakes A or touches
// its files.
func TestServicePortsRefuseAnotherSandboxsToken(t *testing.T) {
	e := newFakeEnv(t, envd.Config{})
	ctx := context.Background()
	a := e.sandbox(t, "acme", true)
	b := e.sandbox(t, "other", true)
	secret := filepath.Join(e.host.FilesDir, a.ID, "home/user/secret")
	if err := os.WriteFile(secret, []byte("a's"), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := e.eng.Pause(ctx, "acme", a.ID, ""); err != nil {
		t.Fatal(err)
	}
	routes := serviceRoutes()
	for _, rt := range routes {
		var bodies []string
		for _, c := range []struct{ id, token string }{{a.ID, b.TrafficToken}, {a.ID, "tt_wrong"}, {"nosuchsandbox0000000", b.TrafficToken}} {
			got, body := status(t, e.client(c.id, c.token, rt.port), rt.method, e.proxy+rt.path, rt.ctype, strings.NewReader(rt.body))
			if got != 403 {
				t.Errorf("port %d %s %s, token %.8s… on %s: %d %s, want 403", rt.port, rt.method, rt.path, c.token, c.id, got, body)
			}
			bodies = append(bodies, body)
		}
		if bodies[0] != bodies[1] || bodies[0] != bodies[2] {
			t.Errorf("port %d %s %s: another sandbox's token, a wrong one and an unknown sandbox are told apart: %q", rt.port, rt.method, rt.path, bodies)
		}
	}
	var signed []string
	for _, sig := range []string{sign("/home/user/secret", "read", "", b.TrafficToken, 0), "v1_wrong"} {
		got, body := status(t, e.client(a.ID, "", envd.Port), "GET", e.proxy+"/files?path=/home/user/secret&signature="+url.QueryEscape(sig), "", nil)
		if got != 401 {
			t.Errorf("a read of A signed with %.8s…: %d %s, want 401", sig, got, body)
		}
		signed = append(signed, body)
	}
	if signed[0] != signed[1] {
		t.Errorf("a URL signed with B's token is told apart from a wrongly signed one: %q", signed)
	}
	if s := e.state(t, "acme", a.ID); s != torpor.StatePaused {
		t.Fatalf("refused requests woke A: %s", s)
	}
	if data, err := os.ReadFile(secret); err != nil || string(data) != "a's" {
		t.Fatalf("A's file after the refusals: %q %v", data, err)
	}
	if _, err := os.Stat(filepath.Join(e.host.FilesDir, a.ID, "home/user/x")); !os.IsNotExist(err) {
		t.Fatalf("a refused upload wrote into A: %v", err)
	}
	t.Logf("%d service routes, %d requests", len(routes), 3*len(routes)+2)
}
