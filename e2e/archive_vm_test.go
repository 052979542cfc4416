package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/torpor-dev/torpor"
)

// TestArchiveVM archives microVM sandboxes: one paused to a memory
// snapshot is archived whole by its policy (disk and memory; its working
// copy gone from the data dir) and an exec wakes it where it stopped, the
// same process counting on and memory intact, without a boot; one
// hibernated is archived by the verb and a start boots it on its restored
// disk.
func TestArchiveVM(t *testing.T) {
	env := needsVM(t)
	dataDir := t.TempDir()
	d := startDaemon(t, torporBin(t), dataDir, env...)
	id := strings.TrimSpace(d.ok("create", "--isolation", "vm", "--memory", "256", "--archive-after", "2"))
	d.ok("exec", id, "--", "sh", "-c", "echo in-memory > /dev/shm/kept; echo on-disk > /kept")
	read := counter(t, d, id)
	before, pid := read()

	d.ok("pause", id, "--mode", "snapshot")
	if sb := d.get(id); sb.ArchivesAt == nil {
		t.Fatalf("a snapshot-paused VM's archive is not scheduled: %+v", sb.Schedule)
	}
	sb := d.waitState(id, torpor.StateArchived)
	if sb.Archive == nil || sb.Archive.Kind != "snapshot" || sb.Archive.Bytes <= 0 {
		t.Fatalf("archived VM's archive: %+v", sb.Archive)
	}
	waitGone(t, filepath.Join(dataDir, "vm", "sandboxes", id))
	if n := len(archiveFiles(t, dataDir, id)); n != 1 {
		t.Fatalf("the archive store holds %d archives of %s", n, id)
	}

	after, pid2 := read() // auto-resume: restore, then resume from the snapshot
	if pid2 != pid || after < before {
		t.Fatalf("the process did not survive the archive: %d/%s -> %d/%s", before, pid, after, pid2)
	}
	if out := d.ok("exec", id, "--", "cat", "/dev/shm/kept", "/kept"); out != "in-memory\non-disk\n" {
		t.Fatalf("memory and disk after the restore: %q", out)
	}
	sb = d.get(id)
	if sb.State != torpor.StateRunning || sb.Boots != 1 || sb.RestoredFromArchiveAt == nil || sb.Archive != nil {
		t.Fatalf("after the restore: %s, boots %d, restored %v, archive %+v", sb.State, sb.Boots, sb.RestoredFromArchiveAt, sb.Archive)
	}
	if n := len(archiveFiles(t, dataDir, id)); n != 0 {
		t.Errorf("the archive is kept after the restore")
	}

	// Hibernated, archived by the verb, started on its restored disk.
	d.ok("update", id, "--archive-after", "0")
	d.ok("hibernate", id)
	d.ok("archive", id)
	waitGone(t, filepath.Join(dataDir, "vm", "sandboxes", id))
	d.ok("start", id)
	if out := d.ok("exec", id, "--", "cat", "/kept"); out != "on-disk\n" {
		t.Fatalf("the disk after a hibernated VM's restore: %q", out)
	}
	if sb := d.get(id); sb.Boots != 2 {
		t.Fatalf("a hibernated VM's restore boots it: boots %d", sb.Boots)
	}
	d.ok("rm", id)
	if _, err := os.Stat(filepath.Join(dataDir, "archive", "archives", id)); err == nil {
		if n := len(archiveFiles(t, dataDir, id)); n != 0 {
			t.Errorf("archives left after rm: %d", n)
		}
	}
}
