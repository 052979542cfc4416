package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// A verb that a group of verbs does not have is an error, as an unknown
// verb of torpor itself is, and a group alone prints its help.
func TestUnknownSubcommandsFail(t *testing.T) {
	getenv := func(string) string { return "" }
	for _, c := range []struct {
		args []string
		code int
		err  string
	}{
		{[]string{"frobnicate"}, 1, `unknown command "frobnicate" for "torpor"`},
		{[]string{"files", "write", "/x"}, 1, `unknown command "write" for "torpor files"`},
		{[]string{"keys", "frob"}, 1, `unknown command "frob" for "torpor keys"`},
		{[]string{"webhooks", "frob"}, 1, `unknown command "frob" for "torpor webhooks"`},
		{[]string{"tenants", "frob"}, 1, `unknown command "frob" for "torpor tenants"`},
		{[]string{"template", "frob"}, 1, `unknown command "frob" for "torpor template"`},
		{[]string{"keys"}, 0, ""},
		{[]string{"files"}, 0, ""},
	} {
		t.Run(strings.Join(c.args, " "), func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := Run(context.Background(), c.args, strings.NewReader(""), &stdout, &stderr, getenv)
			if code != c.code || !strings.Contains(stderr.String(), c.err) {
				t.Fatalf("exit %d, stderr %q; want exit %d and %q", code, stderr.String(), c.code, c.err)
			}
			if c.code == 0 && !strings.Contains(stdout.String(), "Available Commands") {
				t.Fatalf("a group alone should print its help, got %q", stdout.String())
			}
		})
	}
}
