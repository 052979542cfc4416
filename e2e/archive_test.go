package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
)

// TestArchiveAndRestore runs the archive tier with real runc sandboxes: a
// sandbox with files is hibernated, archived by its policy two seconds
// later (its working copy gone from the data dir, its archive in the
// archive store, the CLI saying archived), and a start restores it with
// every file as it was; the archive is gone afterwards. A second one,
// archived, is deleted, and its archive goes with it.
func TestArchiveAndRestore(t *testing.T) {
	needs(t)
	dataDir := t.TempDir()
	d := startDaemon(t, torporBin(t), dataDir)
	id := strings.TrimSpace(d.ok("create", "--archive-after", "2"))
	d.ok("exec", id, "--", "sh", "-c", `set -e
mkdir -p /data/deep/er
echo hello > /data/a.txt
printf 'x%.0s' $(seq 1 1000) > /data/deep/er/b.txt
dd if=/dev/urandom of=/data/blob bs=1024 count=512 2>/dev/null
chmod 600 /data/a.txt
ln -s a.txt /data/link
md5sum /data/blob /data/a.txt /data/deep/er/b.txt > /data/sums`)
	sums := d.ok("exec", id, "--", "cat", "/data/sums")

	sbDir := filepath.Join(dataDir, "runc", "sandboxes", id)
	if _, err := os.Stat(sbDir); err != nil {
		t.Fatalf("the sandbox's working copy: %v", err)
	}
	d.ok("hibernate", id)
	if sb := d.get(id); sb.ArchivesAt == nil || len(sb.UpcomingEvents) == 0 || sb.UpcomingEvents[0].Action != torpor.ActionArchive {
		t.Fatalf("the archive is not scheduled: %+v", sb.Schedule)
	}

	sb := d.waitState(id, torpor.StateArchived)
	if sb.Archive == nil || sb.Archive.Bytes <= 0 {
		t.Fatalf("archived sandbox's archive: %+v", sb.Archive)
	}
	waitGone(t, sbDir)
	archives := archiveFiles(t, dataDir, id)
	if len(archives) != 1 {
		t.Fatalf("the archive store holds %v of %s, want one archive", archives, id)
	}
	if out := d.ok("get", id); !strings.Contains(out, "archived") {
		t.Errorf("torpor get does not say archived:\n%s", out)
	}
	if out := d.ok("list", "--state", "archived"); !strings.Contains(out, id) {
		t.Errorf("torpor list --state archived does not list %s:\n%s", id, out)
	}

	d.ok("start", id)
	sb = d.get(id)
	if sb.State != torpor.StateRunning || sb.RestoredFromArchiveAt == nil || sb.Archive != nil {
		t.Fatalf("after start: %s, restored_from_archive_at %v, archive %+v", sb.State, sb.RestoredFromArchiveAt, sb.Archive)
	}
	if out := d.ok("exec", id, "--", "sh", "-c", "cd / && md5sum -c /data/sums && cat /data/sums && readlink /data/link && stat -c %a /data/a.txt"); !strings.Contains(out, sums) ||
		!strings.Contains(out, "a.txt\n600\n") {
		t.Fatalf("the files after the restore:\n%s\nwant the sums\n%s", out, sums)
	}
	if evs := d.ok("events", id); !strings.Contains(evs, "sandbox.archived") || !strings.Contains(evs, "restored_from=archive") {
		t.Errorf("events:\n%s", evs)
	}
	if left := archiveFiles(t, dataDir, id); len(left) != 0 {
		t.Errorf("the archive is kept after the restore: %v", left)
	}

	// An archived sandbox's delete removes its archive.
	id2 := strings.TrimSpace(d.ok("create", "--archive-after", "1"))
	d.ok("hibernate", id2)
	d.waitState(id2, torpor.StateArchived)
	d.ok("delete", id2)
	if left := archiveFiles(t, dataDir, id2); len(left) != 0 {
		t.Errorf("the archive of a deleted sandbox is kept: %v", left)
	}
}

// archiveFiles lists the files of sandbox id in the daemon's local archive
// store.
func archiveFiles(t *testing.T, dataDir, id string) []string {
	t.Helper()
	var files []string
	root := filepath.Join(dataDir, "archive", "archives", id)
	err := filepath.WalkDir(root, func(p string, de os.DirEntry, err error) error {
		if err != nil {
			if os.IsNotExist(err) {
				return nil
			}
			return err
		}
		if !de.IsDir() {
			files = append(files, p)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

// waitGone waits for path to be removed (an archived sandbox's working
// copy goes right after archived is stored).
func waitGone(t *testing.T, path string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := os.Stat(path)
		if os.IsNotExist(err) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s is still there (%v)", path, err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
