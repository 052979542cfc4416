package runc

import (
	"context"
	"os"
	"path/filepath"
	"testing"
)

// TestCleanupRemovesTheEmptyCgroupParent: the cgroup parent stays while a
// sandbox runs or is frozen under it, and goes from every hierarchy once
// none is left; a boot makes it again.
func TestCleanupRemovesTheEmptyCgroupParent(t *testing.T) {
	needHost(t)
	ctx := context.Background()
	r, base := newTestRuntime(t)
	parentDirs := func() (have []string) {
		for _, h := range r.cg.hierarchies {
			if _, err := os.Stat(filepath.Join(h, r.parent)); err == nil {
				have = append(have, filepath.Join(h, r.parent))
			}
		}
		return have
	}
	ref := bootOne(t, r, base, nil)
	if err := r.Freeze(ctx, ref); err != nil {
		t.Fatal(err)
	}
	if err := r.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	if got := parentDirs(); len(got) != len(r.cg.hierarchies) {
		t.Fatalf("with a frozen sandbox the parent is in %d of %d hierarchies: %q", len(got), len(r.cg.hierarchies), got)
	}
	if err := r.Stop(ctx, ref); err != nil {
		t.Fatal(err)
	}
	if err := r.Cleanup(ctx); err != nil {
		t.Fatal(err)
	}
	if got := parentDirs(); len(got) > 0 {
		t.Fatalf("with no sandbox left the parent stays: %q", got)
	}
	bootOne(t, r, base, nil)
	if got := parentDirs(); len(got) != len(r.cg.hierarchies) {
		t.Fatalf("after a new boot the parent is in %d of %d hierarchies", len(got), len(r.cg.hierarchies))
	}
}
