package api_test

import (
	"strings"
	"testing"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/client"
)

func TestRunCodeThroughTheAPI(t *testing.T) {
	f := newFixture(t)
	sb, err := f.tenantCl.Create(ctx, torpor.CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	res, err := f.tenantCl.RunCode(ctx, sb.ID, client.CodeRequest{Language: "python", Code: "print hi"})
	if err != nil || res.Stdout != "hi\n" || res.Context != torpor.ContextNew {
		t.Fatalf("first: %+v %v", res, err)
	}
	// A snippet's error is a 200 with a structured error.
	res, err = f.tenantCl.RunCode(ctx, sb.ID, client.CodeRequest{Language: "python", Code: "raise ValueError"})
	if err != nil || res.Error == nil || res.Error.Name != "ValueError" || res.Context != torpor.ContextExisting {
		t.Fatalf("error: %+v %v", res, err)
	}
	// Pause keeps the interpreter (auto_resume wakes the sandbox);
	// hibernate starts a new one.
	if _, err := f.tenantCl.Pause(ctx, sb.ID, ""); err != nil {
		t.Fatal(err)
	}
	res, err = f.tenantCl.RunCode(ctx, sb.ID, client.CodeRequest{Language: "python", Code: "print x"})
	if err != nil || res.Context != torpor.ContextExisting {
		t.Fatalf("after pause: %+v %v", res, err)
	}
	if _, err := f.tenantCl.Hibernate(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	res, err = f.tenantCl.RunCode(ctx, sb.ID, client.CodeRequest{Language: "python", Code: "print x"})
	if err != nil || res.Context != torpor.ContextNew {
		t.Fatalf("after hibernate: %+v %v", res, err)
	}
	res, err = f.tenantCl.RunCode(ctx, sb.ID, client.CodeRequest{Language: "sh", Code: "exit 42"})
	if err != nil || res.ExitCode == nil || *res.ExitCode != 2 {
		t.Fatalf("sh: %+v %v", res, err)
	}
	f.host.NoPython = true
	_, err = f.tenantCl.RunCode(ctx, sb.ID, client.CodeRequest{Language: "python", Code: "1"})
	if !client.IsInvalid(err) || !strings.Contains(err.Error(), "python3") {
		t.Fatalf("no python: %v", err)
	}
}

func TestRunCodeBadInput(t *testing.T) {
	f := newFixture(t)
	sb, err := f.tenantCl.Create(ctx, torpor.CreateRequest{Template: "base"})
	if err != nil {
		t.Fatal(err)
	}
	path := "/v1/sandboxes/" + sb.ID + "/code"
	for _, tc := range []struct{ body, param string }{
		{`{"language": "ruby", "code": "1"}`, "language"},
		{`{"code": "1"}`, "language"},
		{`{"language": "python", "code": "1", "timeout_seconds": -1}`, "timeout_seconds"},
		{`{"language": "python", "code": "1", "timeout_seconds": 1e9}`, "timeout_seconds"},
		{`{"language": "python", "code": "` + strings.Repeat("x", torpor.MaxCodeSize+1) + `"}`, "code"},
		{`{"language": "python", "code": "1", "bogus": 1}`, "bogus"},
	} {
		code, eb := f.raw(t, "POST", path, f.acmeKey, "application/json", tc.body)
		if code != 400 || eb.Error.Param != tc.param {
			t.Errorf("%.60s: %d %+v", tc.body, code, eb)
		}
	}
	code, _ := f.raw(t, "POST", "/v1/sandboxes/nope/code", f.acmeKey, "application/json", `{"language": "sh", "code": "true"}`)
	if code != 404 {
		t.Errorf("unknown sandbox: %d", code)
	}
}
