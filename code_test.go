package torpor

import (
	"errors"
	"strings"
	"testing"
)

func TestValidateCode(t *testing.T) {
	for _, tc := range []struct {
		name  string
		req   CodeRequest
		param string // "" when valid
	}{
		{"python", CodeRequest{Language: "python", Code: "1"}, ""},
		{"bash", CodeRequest{Language: "bash", Code: "echo"}, ""},
		{"no language", CodeRequest{Code: "1"}, "language"},
		{"unknown language", CodeRequest{Language: "cobol", Code: "1"}, "language"},
		{"NUL", CodeRequest{Language: "sh", Code: "a\x00"}, "code"},
		{"too long", CodeRequest{Language: "sh", Code: strings.Repeat("x", MaxCodeSize+1)}, "code"},
		{"negative timeout", CodeRequest{Language: "sh", Timeout: -1}, "timeout_seconds"},
		{"context without language", CodeRequest{Context: "c1", Code: "1"}, ""},
		{"bad context id", CodeRequest{Context: "../x", Language: "python"}, "context"},
		{"long context id", CodeRequest{Context: strings.Repeat("a", 65), Language: "python"}, "context"},
		{"env", CodeRequest{Language: "python", Env: map[string]string{"A_1": "x"}}, ""},
		{"bad env name", CodeRequest{Language: "python", Env: map[string]string{"A=B": "x"}}, "env"},
		{"relative cwd", CodeRequest{Language: "python", Cwd: "home"}, "cwd"},
		{"create", CodeRequest{Op: CodeCreate, Context: "c1", Language: "python", Cwd: "/home/user"}, ""},
		{"create without id", CodeRequest{Op: CodeCreate, Language: "python"}, "context"},
		{"create a default", CodeRequest{Op: CodeCreate, Context: "python", Language: "python"}, "context"},
		{"create without language", CodeRequest{Op: CodeCreate, Context: "c1"}, "language"},
		{"restart", CodeRequest{Op: CodeRestart, Context: "c1"}, ""},
		{"restart a default", CodeRequest{Op: CodeRestart, Context: "python"}, ""},
		{"delete without id", CodeRequest{Op: CodeDelete}, "context"},
		{"list", CodeRequest{Op: CodeList}, ""},
		{"unknown op", CodeRequest{Op: "explode", Language: "python"}, "op"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := ValidateCode(tc.req)
			if tc.param == "" {
				if err != nil {
					t.Fatalf("want valid, got %v", err)
				}
				return
			}
			var te *Error
			if !errors.As(err, &te) || te.Code != EInvalid || te.Param != tc.param {
				t.Fatalf("want invalid %s, got %v", tc.param, err)
			}
		})
	}
}
