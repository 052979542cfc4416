package daemon

import (
	"strings"
	"testing"

	"github.com/spf13/pflag"
)

// The store setting comes from the flag, TORPOR_STORE or the file; it is
// empty (SQLite) or a postgres:// URL, and a refusal never repeats the
// password.
func TestStoreSetting(t *testing.T) {
	for _, c := range []struct {
		env, flag string
		want      string
		bad       bool
	}{
		{want: ""},
		{env: "postgres://torpor@db/torpor", want: "postgres://torpor@db/torpor"},
		{env: "postgres://a@db/x", flag: "postgresql://b@db/y?sslmode=require", want: "postgresql://b@db/y?sslmode=require"},
		{flag: "mysql://torpor:s3cret@db/torpor", bad: true},
		{flag: "/var/lib/torpor/other.db", bad: true},
	} {
		fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
		AddFlags(fs)
		args := []string{"--data-dir", t.TempDir()}
		if c.flag != "" {
			args = append(args, "--store", c.flag)
		}
		if err := fs.Parse(args); err != nil {
			t.Fatal(err)
		}
		cfg, err := LoadConfig(fs, func(k string) string {
			if k == "TORPOR_STORE" {
				return c.env
			}
			return ""
		})
		switch {
		case c.bad && err == nil:
			t.Errorf("store %q: accepted", c.flag)
		case c.bad && strings.Contains(err.Error(), "s3cret"):
			t.Errorf("store %q: the error %q repeats the password", c.flag, err)
		case !c.bad && err != nil:
			t.Errorf("env %q flag %q: %v", c.env, c.flag, err)
		case !c.bad && cfg.Store != c.want:
			t.Errorf("env %q flag %q: store %q, want %q", c.env, c.flag, cfg.Store, c.want)
		}
	}
}
