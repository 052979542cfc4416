package daemon

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// A data dir keeps one node id: made on first start in DATA_DIR/node-id,
// which only its owner may read, the same on every start after, and
// another for another data dir (a cloned host's, made afresh).
func TestNodeInstance(t *testing.T) {
	dir := t.TempDir()
	first, err := nodeInstance(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(first) != 20 {
		t.Errorf("node id %q, want 20 characters", first)
	}
	st, err := os.Stat(filepath.Join(dir, nodeIDFile))
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("%s has mode %v, want 0600", nodeIDFile, st.Mode().Perm())
	}
	if again, err := nodeInstance(dir); err != nil || again != first {
		t.Errorf("the node id on a second start = %q, %v; want %q", again, err, first)
	}
	// The node joins the fleet with it.
	_, fc, err := newFleet(Config{DataDir: dir}, "n1", nil, nil, nil, "127.0.0.1:7420", "", slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	if fc.Self.Instance != first {
		t.Errorf("the fleet's Self.Instance = %q, want the data dir's node id %q", fc.Self.Instance, first)
	}
	if other, err := nodeInstance(t.TempDir()); err != nil || other == first {
		t.Errorf("another data dir's node id = %q, %v; want another than %q", other, err, first)
	}
	// An empty file (a crash while it was written) gets a new id.
	empty := t.TempDir()
	if err := os.WriteFile(filepath.Join(empty, nodeIDFile), []byte("\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if id, err := nodeInstance(empty); err != nil || strings.TrimSpace(id) == "" {
		t.Errorf("the node id of a data dir with an empty %s = %q, %v", nodeIDFile, id, err)
	}
}
