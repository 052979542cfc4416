package lifecycle_test

import (
	"io/fs"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/objstore"
)

// archiveStore opens the env's archive directory as an object store.
func (e *env) archiveStore() torpor.ObjectStore {
	e.t.Helper()
	if err := os.MkdirAll(e.archives, 0o755); err != nil {
		e.t.Fatal(err)
	}
	o, err := objstore.Open(ctx, (&url.URL{Scheme: "file", Path: e.archives}).String())
	if err != nil {
		e.t.Fatal(err)
	}
	return o
}

// archiveFiles lists the files of the env's archive store.
func (e *env) archiveFiles() []string {
	e.t.Helper()
	var files []string
	err := filepath.WalkDir(e.archives, func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(e.archives, p)
			files = append(files, filepath.ToSlash(rel))
		}
		return err
	})
	if err != nil {
		e.t.Fatal(err)
	}
	return files
}

// checkArchives checks that the archive store holds sb's archive when it
// is archived, and nothing of it otherwise.
func (e *env) checkArchives(sb *torpor.Sandbox) {
	e.t.Helper()
	var mine []string
	for _, f := range e.archiveFiles() {
		if strings.HasPrefix(f, "archives/"+sb.ID+"/") {
			mine = append(mine, f)
		}
	}
	want := 0
	if sb.State == torpor.StateArchived {
		want = 1
		if sb.Archive == nil || len(mine) != 1 || mine[0] != sb.Archive.Key {
			e.t.Errorf("archived sandbox %s records the archive %+v; the store holds %v", sb.ID, sb.Archive, mine)
		}
	} else if sb.Archive != nil {
		e.t.Errorf("sandbox %s is %s and still records the archive %+v", sb.ID, sb.State, sb.Archive)
	}
	if len(mine) != want {
		e.t.Errorf("sandbox %s is %s: the archive store holds %v of it, want %d object(s)", sb.ID, sb.State, mine, want)
	}
}

func doArchive(e *env, id string) { _, _ = e.eng.Archive(ctx, "acme", id) }

func newArchived(e *env) string {
	id := newHibernated(e)
	e.clock.Advance(time.Second)
	must(e.eng.Archive(ctx, "acme", id))
	return id
}

func newArchivedSnapshot(e *env) string {
	id := newPaused(torpor.PauseSnapshot)(e)
	e.clock.Advance(time.Second)
	must(e.eng.Archive(ctx, "acme", id))
	return id
}

// A sandbox paused to a memory snapshot is archived whole, disk and
// snapshot, by the same policy, and a start brings it back where it
// stopped: resumed from its snapshot, not booted again.
func TestArchiveSnapshotPausedResumes(t *testing.T) {
	e := newEnv(t)
	e.host.FilesDir = t.TempDir()
	sb := e.create(torpor.CreateRequest{PolicyRequest: torpor.PolicyRequest{LifecyclePolicy: &torpor.LifecyclePolicy{
		ArchiveAfterHibernatedSeconds: torpor.Seconds(60),
	}}})
	id := sb.ID
	if err := os.MkdirAll(filepath.Join(e.host.FilesDir, id), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(e.host.FilesDir, id, "f"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	must(e.eng.Pause(ctx, "acme", id, torpor.PauseSnapshot))
	if got := e.get(id); len(got.UpcomingEvents) != 1 || got.UpcomingEvents[0].Action != torpor.ActionArchive {
		t.Fatalf("a snapshot-paused sandbox's upcoming events: %+v", got.UpcomingEvents)
	}
	boots := e.get(id).Boots
	e.clock.Advance(61 * time.Second)
	e.waitState(id, torpor.StateArchived)
	waitFor(t, func() bool { return !e.host.HasDisk(id) && !e.host.HasSnapshot(id) })
	got := e.get(id)
	if got.Archive == nil || got.Archive.Kind != "snapshot" || got.Snapshot != nil {
		t.Fatalf("archived: archive %+v, snapshot %+v", got.Archive, got.Snapshot)
	}
	e.checkArchives(got)
	if err := os.RemoveAll(filepath.Join(e.host.FilesDir, id)); err != nil {
		t.Fatal(err)
	}
	sb, err := e.eng.Start(ctx, "acme", id)
	if err != nil {
		t.Fatal(err)
	}
	// Resumed, not booted: its boot count is the one before the archive.
	if sb.State != torpor.StateRunning || sb.Boots != boots || sb.Meters.Resumes != 1 || sb.RestoredFromArchiveAt == nil {
		t.Fatalf("after start: %s, boots %d (was %d), resumes %d, restored %v", sb.State, sb.Boots, boots, sb.Meters.Resumes, sb.RestoredFromArchiveAt)
	}
	if b, err := os.ReadFile(filepath.Join(e.host.FilesDir, id, "f")); err != nil || string(b) != "x" {
		t.Fatalf("the file after the restore: %q %v", b, err)
	}
	e.checkArchives(sb)
	var resumed *torpor.Event
	for _, ev := range e.events(id) {
		if ev.Type == torpor.EventResumed {
			resumed = &ev
		}
	}
	if resumed == nil || resumed.Attrs["restored_from"] != "archive" {
		t.Fatalf("the resume's event %+v does not say it came from the archive", resumed)
	}
	e.checkLedger(id)
}

// archivePolicy is a create request whose sandbox hibernates after 10
// idle seconds and is archived 60 seconds after that.
func archivePolicy() torpor.CreateRequest {
	return torpor.CreateRequest{PolicyRequest: torpor.PolicyRequest{LifecyclePolicy: &torpor.LifecyclePolicy{
		HibernateAfterPausedSeconds:   torpor.Seconds(10),
		ArchiveAfterHibernatedSeconds: torpor.Seconds(60),
	}}}
}

// A sandbox hibernated for archive_after_hibernated_seconds is archived
// by the idle engine: the archive is an upcoming event first, then the
// state is archived, its disk is gone from the node and its archive is in
// the store; a start restores it with every file, says so, and removes
// the archive.
func TestArchiveFallsDueAndStartRestores(t *testing.T) {
	e := newEnv(t)
	e.host.FilesDir = t.TempDir()
	sb := e.create(archivePolicy())
	id := sb.ID
	// The whole chain is planned from the start: hibernate after 10 idle
	// seconds, archive 60 seconds after that.
	if evs := sb.UpcomingEvents; len(evs) != 2 || evs[0].Action != torpor.ActionHibernate || evs[1].Action != torpor.ActionArchive ||
		!evs[1].At.Equal(evs[0].At.Add(60*time.Second)) || sb.ArchivesAt == nil || !sb.ArchivesAt.Equal(evs[1].At) {
		t.Fatalf("a new sandbox's upcoming events %+v, archives_at %v", evs, sb.ArchivesAt)
	}
	files := filepath.Join(e.host.FilesDir, id)
	if err := os.MkdirAll(filepath.Join(files, "work"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(files, "work", "notes.txt"), []byte("kept across the archive\n"), 0o644); err != nil {
		t.Fatal(err)
	}

	e.clock.Advance(11 * time.Second)
	e.waitState(id, torpor.StateHibernated)
	got := e.get(id)
	if got.ArchivesAt == nil || !got.ArchivesAt.Equal(got.StateSince.Add(60*time.Second)) {
		t.Fatalf("archives_at %v, want 60 s after it hibernated at %v", got.ArchivesAt, got.StateSince)
	}
	if n := len(got.UpcomingEvents); n == 0 || got.UpcomingEvents[n-1].Action != torpor.ActionArchive {
		t.Fatalf("upcoming events %+v, want the archive", got.UpcomingEvents)
	}

	e.clock.Advance(61 * time.Second)
	e.waitState(id, torpor.StateArchived)
	// The working copy goes right after archived is stored.
	waitFor(t, func() bool { return !e.host.HasDisk(id) })
	got = e.get(id)
	e.checkArchives(got)
	if got.Archive.Bytes <= 0 || got.ArchivesAt != nil {
		t.Errorf("archived: archive %+v, archives_at %v", got.Archive, got.ArchivesAt)
	}
	// What the node had of it is gone; only the archive holds the files.
	if err := os.RemoveAll(files); err != nil {
		t.Fatal(err)
	}
	e.clock.Advance(time.Hour)

	sb, err := e.eng.Start(ctx, "acme", id)
	if err != nil {
		t.Fatal(err)
	}
	if sb.State != torpor.StateRunning || sb.RestoredFromArchiveAt == nil || sb.Archive != nil {
		t.Fatalf("after start: %s, restored_from_archive_at %v, archive %+v", sb.State, sb.RestoredFromArchiveAt, sb.Archive)
	}
	b, err := os.ReadFile(filepath.Join(files, "work", "notes.txt"))
	if err != nil || string(b) != "kept across the archive\n" {
		t.Fatalf("the file after the restore: %q, %v", b, err)
	}
	e.checkArchives(sb)
	evs := e.events(id)
	var started *torpor.Event
	for i := range evs {
		if evs[i].Type == torpor.EventStarted {
			started = &evs[i]
		}
	}
	if started == nil || started.Attrs["restored_from"] != "archive" {
		t.Fatalf("the start's event %+v does not say it came from the archive", started)
	}
	e.checkLedger(id)
	usage, err := e.eng.Usage(ctx, "acme", torpor.UsageFilter{SandboxID: id})
	if err != nil {
		t.Fatal(err)
	}
	archived, cost := 0.0, 0.0
	for _, r := range usage {
		if r.Kind == torpor.UsageArchived {
			archived += r.Seconds
			cost += r.Cost
		}
	}
	if archived != 3600 {
		t.Errorf("the ledger meters %v archived seconds, want the hour it was archived", archived)
	}
	if want := float64(got.Archive.Bytes) / (1 << 30) * 3600 * torpor.DefaultPricing.ArchiveGiBMonth / torpor.SecondsPerMonth; cost <= 0 || !near(cost, want) {
		t.Errorf("the archived hour costs %v, want %v (its archive's bytes at the archive price)", cost, want)
	}
}

// An operation on an archived sandbox with auto_resume restores it, and a
// delete of an archived sandbox removes its archive.
func TestArchivedAutoResumeAndDelete(t *testing.T) {
	e := newEnv(t)
	a := newArchived(e)
	if _, err := e.eng.Exec(ctx, "acme", a, torpor.ExecRequest{Cmd: []string{"true"}}); err != nil {
		t.Fatal(err)
	}
	sb := e.get(a)
	if sb.State != torpor.StateRunning || sb.RestoredFromArchiveAt == nil {
		t.Fatalf("after an exec: %s, restored %v", sb.State, sb.RestoredFromArchiveAt)
	}
	e.checkArchives(sb)

	b := newArchived(e)
	if _, err := e.eng.Delete(ctx, "acme", b); err != nil {
		t.Fatal(err)
	}
	e.checkArchives(e.get(b))
	if files := e.archiveFiles(); len(files) != 0 {
		t.Errorf("the archive store holds %v after the deletes", files)
	}
}

// A failed export leaves the sandbox hibernated with its disk and no
// archive.
func TestArchiveFailureStaysHibernated(t *testing.T) {
	e := newEnv(t)
	id := newHibernated(e)
	e.host.FailNext("export_disk", torpor.Errorf(torpor.EInternal, "disk read error"))
	if _, err := e.eng.Archive(ctx, "acme", id); err == nil {
		t.Fatal("an archive whose export failed succeeded")
	}
	sb := e.get(id)
	if sb.State != torpor.StateHibernated || !e.host.HasDisk(id) {
		t.Fatalf("after a failed archive: %s, disk %v", sb.State, e.host.HasDisk(id))
	}
	e.checkArchives(sb)
}

// archive_after_hibernated_seconds is checked like the other durations.
func TestArchivePolicyValidation(t *testing.T) {
	r := torpor.PolicyRequest{LifecyclePolicy: &torpor.LifecyclePolicy{ArchiveAfterHibernatedSeconds: torpor.Seconds(0)}}
	if err := r.Validate(); err == nil {
		t.Error("archive_after_hibernated_seconds 0 is accepted")
	}
}

func (e *env) waitState(id string, s torpor.State) {
	e.t.Helper()
	waitFor(e.t, func() bool { return e.get(id).State == s })
}

func (e *env) events(id string) []torpor.Event {
	e.t.Helper()
	evs, err := e.eng.Events(ctx, "acme", torpor.EventFilter{SandboxID: id})
	if err != nil {
		e.t.Fatal(err)
	}
	return evs
}

func near(a, b float64) bool { return a-b < 1e-12 && b-a < 1e-12 }

// TestArchivedStartThatCannotBeStoredKeepsTheArchive: a start of an
// archived sandbox whose write of starting the store refuses leaves it
// archived with its archive (the archive is dropped only once a state
// that does not need it is stored); the next start restores it.
func TestArchivedStartThatCannotBeStoredKeepsTheArchive(t *testing.T) {
	e, fs := newFullEnv(t)
	e.host.FilesDir = t.TempDir()
	sb := e.create(torpor.CreateRequest{})
	if _, err := e.eng.Hibernate(ctx, "acme", sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := e.eng.Archive(ctx, "acme", sb.ID); err != nil {
		t.Fatal(err)
	}
	fs.fill(0)
	if _, err := e.eng.Start(ctx, "acme", sb.ID); err == nil {
		t.Fatal("a start the store refused succeeded")
	}
	fs.free()
	got := stored(e, sb.ID)
	if got.State != torpor.StateArchived || got.Archive == nil {
		t.Fatalf("after the refused start: %s, archive %+v", got.State, got.Archive)
	}
	e.checkArchives(got)
	if got, err := e.eng.Start(ctx, "acme", sb.ID); err != nil || got.State != torpor.StateRunning {
		t.Fatalf("the next start: %v, %v", got, err)
	}
}
