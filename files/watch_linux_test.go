package files

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestWatchReportsChangesInsideTheRoot: events under the watched
// directory, new subdirectories followed, and a symlink out of the root
// watched inside it.
func TestWatchReportsChangesInsideTheRoot(t *testing.T) {
	s := newSandbox(t)
	os.MkdirAll(filepath.Join(s.dir, "w/sub"), 0o755)
	w, err := s.root.Watch("/w", true)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	os.WriteFile(filepath.Join(s.dir, "w/a"), []byte("x"), 0o644)
	os.Mkdir(filepath.Join(s.dir, "w/sub/new"), 0o755)
	time.Sleep(100 * time.Millisecond) // the new directory's watch is set up
	os.WriteFile(filepath.Join(s.dir, "w/sub/new/b"), nil, 0o644)
	os.Remove(filepath.Join(s.dir, "w/a"))
	want := []Event{{"a", OpCreate}, {"a", OpWrite}, {"sub/new", OpCreate}, {"sub/new/b", OpCreate}, {"a", OpRemove}}
	var got []Event
	timeout := time.After(5 * time.Second)
	for len(got) < len(want) {
		select {
		case ev := <-w.Events():
			if ev.Op.Has(OpChmod) {
				continue
			}
			got = append(got, ev)
		case <-timeout:
			t.Fatalf("events %v, want %v", got, want)
		}
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("events %v, want %v", got, want)
		}
	}
	// A link to the host's directory is resolved inside the root: there
	// is no such directory there.
	os.Symlink(s.outside, filepath.Join(s.dir, "out"))
	if _, err := s.root.Watch("/out", false); err == nil || !strings.Contains(err.Error(), "no such file") {
		t.Fatalf("watch through a link out of the root: %v", err)
	}
	// Removing the watched directory ends the watch.
	os.RemoveAll(filepath.Join(s.dir, "w"))
	for range w.Events() {
	}
	if w.Err() != nil {
		t.Fatal(w.Err())
	}
}

func TestWriteAndMkdirWithAnOwner(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (files are given to other users)")
	}
	s := newSandbox(t)
	o := &Owner{UID: 1234, GID: 4321}
	info, err := s.root.Write("/a/b/f", strings.NewReader("x"), WriteOptions{Owner: o})
	if err != nil || info.UID != 1234 || info.GID != 4321 {
		t.Fatalf("write %+v %v", info, err)
	}
	for _, p := range []string{"/a", "/a/b"} {
		if st, _ := s.root.Stat(p); st.UID != 1234 || st.GID != 4321 {
			t.Fatalf("%s made for the file: %+v", p, st)
		}
	}
	if st, err := s.root.Mkdir("/c/d", MkdirOptions{Parents: true, Owner: o}); err != nil || st.UID != 1234 {
		t.Fatalf("mkdir %+v %v", st, err)
	}
	if st, _ := s.root.Stat("/c"); st.UID != 1234 {
		t.Fatalf("parent made by mkdir: %+v", st)
	}
}
