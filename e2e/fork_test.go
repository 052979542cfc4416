package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/client"
)

// TestCheckpointForkRestore runs checkpoints, fork and restore through
// the real daemon and CLI with runc sandboxes (docs/fork.md): files
// written, a checkpoint, more writes, a fork of 3 from the checkpoint
// (each sees the checkpoint's files and not the later ones), a fork of a
// hibernated parent that does not wake it, a restore of a running
// sandbox, a fork that does not fit (it leaves nothing), and no copy left
// once the checkpoints and the sandbox are gone.
func TestCheckpointForkRestore(t *testing.T) {
	needs(t)
	dataDir := t.TempDir()
	// Room for 6 sandboxes of 1 vCPU: the parent and its forks fit, 16
	// more do not.
	d := startDaemon(t, torporBin(t), dataDir, "TORPOR_CAPACITY_VCPUS=6")
	id := strings.TrimSpace(d.ok("create"))
	d.ok("exec", id, "--", "sh", "-c", "mkdir -p /data && echo one > /data/a.txt")
	out := d.ok("checkpoint", id, "--name", "cp1")
	if !strings.HasPrefix(out, "cp1\t") {
		t.Fatalf("torpor checkpoint: %q", out)
	}
	if sb := d.get(id); sb.State != torpor.StateRunning {
		t.Fatalf("the checkpoint left the sandbox %s", sb.State)
	}
	d.ok("exec", id, "--", "sh", "-c", "echo two > /data/b.txt")
	if out := d.ok("checkpoints", id); !strings.Contains(out, "cp1") {
		t.Fatalf("torpor checkpoints:\n%s", out)
	}

	see := "cat /data/a.txt; test -e /data/b.txt && echo b-here || echo b-gone; test -e /data/c.txt && echo c-here || echo c-gone"
	forks := strings.Fields(d.ok("fork", id, "--count", "3", "--checkpoint", "cp1"))
	if len(forks) != 3 {
		t.Fatalf("fork --count 3 printed %v", forks)
	}
	for _, k := range forks {
		if got := d.ok("exec", k, "--", "sh", "-c", see); got != "one\nb-gone\nc-gone\n" {
			t.Errorf("fork %s sees:\n%s\nwant the checkpoint's files only", k, got)
		}
		sb := d.get(k)
		if sb.State != torpor.StateRunning || sb.Metadata["forked_from"] != id || sb.Metadata["forked_from_checkpoint"] != "cp1" {
			t.Errorf("fork %s: %s, metadata %v", k, sb.State, sb.Metadata)
		}
	}
	for _, k := range forks {
		d.ok("rm", k)
	}

	// A hibernated parent is forked without waking it, its disk as it is.
	d.ok("hibernate", id)
	boots := d.get(id).Boots
	forks = strings.Fields(d.ok("fork", id))
	if len(forks) != 1 {
		t.Fatalf("fork printed %v", forks)
	}
	if sb := d.get(id); sb.State != torpor.StateHibernated || sb.Boots != boots {
		t.Fatalf("the fork woke its parent: %s, boots %d then %d", sb.State, boots, sb.Boots)
	}
	if got := d.ok("exec", forks[0], "--", "sh", "-c", see); got != "one\nb-here\nc-gone\n" {
		t.Errorf("the fork of the hibernated parent sees:\n%s", got)
	}
	if sb := d.get(forks[0]); sb.Metadata["forked_from_checkpoint"] != "" {
		t.Errorf("a fork of the disk as it is names a checkpoint: %v", sb.Metadata)
	}
	d.ok("rm", forks[0])

	// A paused parent too: it stays frozen.
	d.ok("start", id)
	d.ok("pause", id)
	forks = strings.Fields(d.ok("fork", id))
	if sb := d.get(id); len(forks) != 1 || sb.State != torpor.StatePaused {
		t.Fatalf("fork of a paused parent: %v, the parent %s", forks, sb.State)
	}
	if got := d.ok("exec", forks[0], "--", "sh", "-c", see); got != "one\nb-here\nc-gone\n" {
		t.Errorf("the fork of the paused parent sees:\n%s", got)
	}
	d.ok("rm", forks[0])

	// A restore of a running sandbox boots it on the checkpoint's disk.
	d.ok("start", id)
	d.ok("exec", id, "--", "sh", "-c", "echo three > /data/c.txt")
	d.ok("restore", id, "--checkpoint", "cp1")
	if sb := d.get(id); sb.State != torpor.StateRunning {
		t.Fatalf("after the restore: %s", sb.State)
	}
	if got := d.ok("exec", id, "--", "sh", "-c", see); got != "one\nb-gone\nc-gone\n" {
		t.Errorf("after the restore the sandbox sees:\n%s", got)
	}

	// A fork that does not fit leaves nothing.
	cl := d.client(t)
	before, err := cl.List(context.Background(), client.ListOptions{All: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, errs, code := d.cli("fork", id, "--count", "16"); code == 0 || !strings.Contains(errs, "full") {
		t.Fatalf("a fork of 16 on a node with room for 5: exit %d, %s", code, errs)
	}
	after, err := cl.List(context.Background(), client.ListOptions{All: true})
	if err != nil {
		t.Fatal(err)
	}
	if len(after) != len(before) {
		t.Fatalf("a fork that did not fit left sandboxes: %d before, %d after", len(before), len(after))
	}

	// Checkpoints go with rm, and with their sandbox.
	cpDir := filepath.Join(dataDir, "runc", "checkpoints", id)
	if _, err := os.Stat(filepath.Join(cpDir, "cp1")); err != nil {
		t.Fatalf("the checkpoint's copy: %v", err)
	}
	d.ok("checkpoint", id, "--name", "cp2")
	d.ok("checkpoint", "rm", id, "cp1")
	if _, err := os.Stat(filepath.Join(cpDir, "cp1")); !os.IsNotExist(err) {
		t.Errorf("checkpoint rm left its copy: %v", err)
	}
	d.ok("rm", id)
	if entries, _ := os.ReadDir(filepath.Join(dataDir, "runc", "checkpoints")); len(entries) != 0 {
		t.Errorf("copies left after every sandbox went: %v", entries)
	}
}
