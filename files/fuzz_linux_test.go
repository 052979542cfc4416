package files

import (
	"strings"
	"testing"

	"github.com/torpor-dev/torpor"
)

// FuzzPaths sends arbitrary paths to every operation over a root full of
// escapes: none answers with an internal error, and the host's secret is
// never read or changed.
func FuzzPaths(f *testing.F) {
	for _, s := range []string{"/", "/a", "../../x", "/abs/secret", "rel", "a/../../b", "/proc/x", "\x00", "//./.././a//b/", strings.Repeat("a/", 100)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		s := newSandbox(t)
		s.symlink(t, s.secret, "abs")
		s.symlink(t, "../outside", "rel")
		s.host(t, "a/b", "b")
		check := func(op string, err error) {
			if err != nil && torpor.ErrorCodeOf(err) == torpor.EInternal {
				t.Fatalf("%s %q: internal error %v", op, p, err)
			}
		}
		got, err := s.read(p)
		check("read", err)
		if strings.Contains(got, secretText) {
			t.Fatalf("read %q returned the secret", p)
		}
		_, err = s.root.Stat(p)
		check("stat", err)
		_, err = s.root.List(p, 3, 0)
		check("list", err)
		_, err = s.root.Write(p, strings.NewReader("w"), WriteOptions{})
		check("write", err)
		_, err = s.root.Mkdir(p, MkdirOptions{Parents: true})
		check("mkdir", err)
		_, err = s.root.Rename(p, "/renamed", true)
		check("rename", err)
		check("remove", s.root.Remove(p, true))
		s.secretIntact(t)
	})
}
