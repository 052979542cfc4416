package e2e

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/torpor-dev/torpor/network"
	"github.com/torpor-dev/torpor/network/networktest"
)

// hostNetwork reports whether the bridge exists (`ip link show`) and
// which of its nftables tables do.
func hostNetwork(t *testing.T, bridge string) (bool, []string) {
	t.Helper()
	return exec.Command("ip", "link", "show", bridge).Run() == nil, networktest.Tables(t, bridge)
}

// cgroupParents returns the directories of the running sandbox's cgroup
// parent, in every hierarchy.
func cgroupParents(t *testing.T, id string) []string {
	t.Helper()
	v1, _ := filepath.Glob("/sys/fs/cgroup/*/torpor/*/" + id)
	v2, _ := filepath.Glob("/sys/fs/cgroup/torpor/*/" + id)
	var out []string
	for _, d := range append(v1, v2...) {
		out = append(out, filepath.Dir(d))
	}
	if len(out) == 0 {
		t.Fatalf("no cgroup of %s under /sys/fs/cgroup", id)
	}
	return out
}

func existing(dirs []string) []string {
	var out []string
	for _, d := range dirs {
		if _, err := os.Stat(d); err == nil {
			out = append(out, d)
		}
	}
	return out
}

// TestStopRemovesWhatNoSandboxUses: a daemon that stops with no sandbox
// left removes its bridge, the bridge's nftables tables and its empty
// cgroup parents; one that stops with a sandbox running leaves them all
// for it, until a later daemon stops with that sandbox deleted.
func TestStopRemovesWhatNoSandboxUses(t *testing.T) {
	needs(t)
	bridge, env := privateNetwork(t, "tpe", func(b byte) string { return fmt.Sprintf("10.217.%d.0/24", b) })
	bin, dataDir := torporBin(t), t.TempDir()
	gone := func(what string, parents []string) {
		t.Helper()
		if link, tables := hostNetwork(t, bridge); link || len(tables) > 0 {
			t.Errorf("%s: bridge %s left: %v, its nftables tables: %q", what, bridge, link, tables)
		}
		if left := existing(parents); len(left) > 0 {
			t.Errorf("%s: cgroup parents left: %q", what, left)
		}
	}
	kept := func(what string, parents []string) {
		t.Helper()
		if link, tables := hostNetwork(t, bridge); !link || len(tables) != 2 {
			t.Errorf("%s: bridge %s there: %v, its nftables tables: %q; want both", what, bridge, link, tables)
		}
		if left := existing(parents); !slices.Equal(left, parents) {
			t.Errorf("%s: cgroup parents %q, want %q", what, left, parents)
		}
	}

	d := startDaemon(t, bin, dataDir, env...)
	id := strings.TrimSpace(d.ok("create", "--template", "base"))
	parents := cgroupParents(t, id)
	kept("with a sandbox running", parents)
	d.ok("rm", id)
	d.stop()
	gone("stopped with no sandbox", parents)

	// A sandbox that runs on when the daemon stops keeps everything.
	d = startDaemon(t, bin, dataDir, env...)
	id = strings.TrimSpace(d.ok("create", "--template", "base"))
	parents = cgroupParents(t, id)
	d.stop()
	kept("stopped with a sandbox running", parents)

	// Hibernated sandboxes need none of it: their disk and address stay.
	d = startDaemon(t, bin, dataDir, env...)
	addr := d.get(id).Address
	d.ok("hibernate", id)
	d.stop()
	gone("stopped with a sandbox hibernated", parents)
	if _, err := os.Stat(filepath.Join(network.DefaultStateDir, bridge, "leases", addr)); addr == "" || err != nil {
		t.Errorf("the hibernated sandbox's lease of %q: %v", addr, err)
	}

	d = startDaemon(t, bin, dataDir, env...)
	d.ok("start", id)
	if got := d.get(id).Address; got != addr {
		t.Errorf("address after the bridge was made again: %s, want %s", got, addr)
	}
	if out := d.ok("exec", id, "--", "echo", "ok"); out != "ok\n" {
		t.Errorf("exec: %q", out)
	}
	d.ok("rm", id)
	d.stop()
	gone("stopped after the last sandbox was deleted", parents)
}
