package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
)

// `torpor store copy` checks its arguments before it touches a database,
// and never repeats a password it was given.
func TestStoreCopyArguments(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "missing.db")
	for _, c := range []struct {
		name string
		args []string
		env  string
		want string
	}{
		{"no --from", []string{"store", "copy", "--to", "postgres://u@h/db"}, "", "--from FILE.db is required"},
		{"not postgres", []string{"store", "copy", "--from", "x.db", "--to", "mysql://u:s3cret@h/db"}, "", `--to must be a postgres:// URL, got "mysql://u:xxxxx@h/db"`},
		{"no --to", []string{"store", "copy", "--from", "x.db"}, "", "--to must be a postgres:// URL"},
		{"missing file", []string{"store", "copy", "--from", missing}, "postgres://u:s3cret@127.0.0.1:1/db", "no such file"},
	} {
		t.Run(c.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			getenv := func(k string) string {
				if k == "TORPOR_STORE" {
					return c.env
				}
				return ""
			}
			code := Run(context.Background(), c.args, strings.NewReader(""), &stdout, &stderr, getenv)
			if code == 0 || !strings.Contains(stderr.String(), c.want) || strings.Contains(stderr.String(), "s3cret") {
				t.Fatalf("exit %d, stderr %q; want a failure saying %q without the password", code, stderr.String(), c.want)
			}
		})
	}
}
