package runc

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

func TestUnescapeMountinfo(t *testing.T) {
	for in, want := range map[string]string{
		`/sys/fs/cgroup/memory`:  "/sys/fs/cgroup/memory",
		`/mnt/with\040space`:     "/mnt/with space",
		`/a\134b`:                `/a\b`,
		`/trailing\04`:           `/trailing\04`,
		`/not\9octal`:            `/not\9octal`,
		`/tab\011and\040space\\`: "/tab\tand space\\\\",
	} {
		if got := unescapeMountinfo(in); got != want {
			t.Errorf("unescapeMountinfo(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestEventValue(t *testing.T) {
	b := []byte("oom_kill_disable 0\nunder_oom 0\noom_kill 3\n")
	if got := eventValue(b, "oom_kill"); got != "3" {
		t.Errorf("oom_kill = %q", got)
	}
	if got := eventValue([]byte("populated 1\nfrozen 1\n"), "frozen"); got != "1" {
		t.Errorf("frozen = %q", got)
	}
	if got := eventValue(b, "missing"); got != "" {
		t.Errorf("missing = %q", got)
	}
}

func TestDetectCgroups(t *testing.T) {
	c, err := detectCgroups()
	if err != nil {
		t.Skipf("no usable cgroups: %v", err)
	}
	if len(c.hierarchies) == 0 {
		t.Fatal("no hierarchies")
	}
	if !c.v2 && (c.controllers["freezer"] == "" || c.controllers["memory"] == "") {
		t.Errorf("v1 without freezer or memory: %v", c.controllers)
	}
	t.Logf("v2=%v hierarchies=%v", c.v2, c.hierarchies)
}

// TestFreezerV2 runs the cgroup v2 code on a v2 hierarchy: the host's own
// on a v2 host, or the unified one of a hybrid host (the freezer is part of
// every v2 cgroup).
func TestFreezerV2(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	mounts, err := cgroupMounts()
	if err != nil {
		t.Fatal(err)
	}
	root := ""
	for _, m := range mounts {
		if m.fstype == "cgroup2" {
			root = m.dir
		}
	}
	if root == "" {
		t.Skip("no cgroup v2 hierarchy")
	}
	c := &cgroups{v2: true, root: root, hierarchies: []string{root}}
	rel := torpor.NewID("torpor_test_", 8)
	if err := os.Mkdir(filepath.Join(root, rel), 0o755); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	t.Cleanup(func() { _ = c.remove(ctx, rel) })
	if _, err := os.Stat(filepath.Join(root, rel, "cgroup.freeze")); err != nil {
		t.Skipf("no v2 freezer: %v", err)
	}
	sleep := exec.Command("sleep", "100")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	waited := make(chan error, 1)
	go func() { waited <- sleep.Wait() }()
	if err := os.WriteFile(filepath.Join(root, rel, "cgroup.procs"), []byte(strconv.Itoa(sleep.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	if err := c.freeze(ctx, rel); err != nil {
		t.Fatal(err)
	}
	if frozen, err := c.frozen(rel); err != nil || !frozen {
		t.Errorf("after freeze: frozen=%v, %v", frozen, err)
	}
	if err := c.freeze(ctx, rel); err != nil {
		t.Errorf("second freeze: %v", err)
	}
	if err := c.thaw(ctx, rel); err != nil {
		t.Fatal(err)
	}
	if frozen, err := c.frozen(rel); err != nil || frozen {
		t.Errorf("after thaw: frozen=%v, %v", frozen, err)
	}
	if err := c.freeze(ctx, rel); err != nil {
		t.Fatal(err)
	}
	// Removal kills what is left, frozen or not.
	if err := c.remove(ctx, rel); err != nil {
		t.Fatal(err)
	}
	select {
	case <-waited:
	case <-time.After(10 * time.Second):
		t.Fatal("the process in the removed cgroup still runs")
	}
	if _, err := os.Stat(filepath.Join(root, rel)); !os.IsNotExist(err) {
		t.Errorf("cgroup left: %v", err)
	}
}
