package lifecycle

import (
	"testing"

	"github.com/torpor-dev/torpor"
)

// The sandbox files API refuses paths on a mounted volume (it would reach
// the directory under the mount point), and only those.
func TestFilesRefusePathsOnVolumes(t *testing.T) {
	o := outsideVolumes{mounts: []torpor.VolumeMount{{Name: "data", Path: "/mnt/data"}, {Name: "ro", Path: "/srv/ro/", ReadOnly: true}}}
	for _, c := range []struct {
		p      string
		refuse bool
	}{
		{"/mnt/data", true},
		{"/mnt/data/x.txt", true},
		{"mnt/data/sub/y", true},
		{"/mnt/./data/../data/z", true},
		{"/srv/ro", true},
		{"/srv/ro/a", true},
		{"/mnt", false},
		{"/mnt/database", false},
		{"/root/data", false},
		{"/srv/rot", false},
		{"/", false},
	} {
		err := o.check("path", c.p)
		if got := err != nil; got != c.refuse {
			t.Errorf("%q: refused %v (%v), want %v", c.p, got, err, c.refuse)
		}
		if err != nil && !torpor.IsCode(err, torpor.EInvalid) {
			t.Errorf("%q: %v, want invalid_argument", c.p, err)
		}
	}
}
