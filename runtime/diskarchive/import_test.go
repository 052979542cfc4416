package diskarchive

import (
	"bytes"
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// TestImportRemovesOnlyTheDirItMade: a failed fill takes the directory
// Import made with it, and leaves one that was there; a stream that does
// not open makes none.
func TestImportRemovesOnlyTheDirItMade(t *testing.T) {
	var stream bytes.Buffer
	if _, err := WriteImage(context.Background(), &stream, sparseImage(t, 1<<20, map[int64]string{0: "data"})); err != nil {
		t.Fatal(err)
	}
	failed := errors.New("fill failed")
	fill := func(dir string) func(*Reader) error {
		return func(rd *Reader) error {
			if rd.Kind != Image {
				t.Errorf("kind %s", rd.Kind)
			}
			if err := os.WriteFile(filepath.Join(dir, "part"), []byte("x"), 0o600); err != nil {
				return err
			}
			return failed
		}
	}

	fresh := filepath.Join(t.TempDir(), "sb")
	if err := Import(bytes.NewReader(stream.Bytes()), fresh, 0o700, fill(fresh)); !errors.Is(err, failed) {
		t.Fatalf("Import: %v", err)
	}
	if _, err := os.Lstat(fresh); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the directory Import made stayed: %v", err)
	}

	there := t.TempDir()
	if err := Import(bytes.NewReader(stream.Bytes()), there, 0o700, fill(there)); !errors.Is(err, failed) {
		t.Fatalf("Import: %v", err)
	}
	if _, err := os.Lstat(there); err != nil {
		t.Fatalf("the directory that was there went: %v", err)
	}

	none := filepath.Join(t.TempDir(), "sb")
	err := Import(bytes.NewReader([]byte("not a stream")), none, 0o700, func(*Reader) error {
		t.Error("fill called for a stream that does not open")
		return nil
	})
	wantRefused(t, "a bad header", err)
	if _, err := os.Lstat(none); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused stream made its directory: %v", err)
	}

	ok := filepath.Join(t.TempDir(), "sb")
	if err := Import(bytes.NewReader(stream.Bytes()), ok, 0o700, func(rd *Reader) error { return rd.Verify(context.Background()) }); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(ok); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("the directory Import made: %v %v", fi, err)
	}
}
