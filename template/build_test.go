package template

import (
	"os"
	"path/filepath"
	"testing"
)

// The mirror comes from apt's sources: the entry for the suite, in either
// format, and not the security archive or another vendor's repository.
func TestDebianMirror(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "sources.list.d"), 0o755)
	if got := debianMirror(dir, "bookworm"); got != defaultMirror {
		t.Errorf("no sources: %s", got)
	}
	os.WriteFile(filepath.Join(dir, "sources.list"), []byte("# comment\ndeb https://packages.cloud.google.com/apt cloud-sdk-bookworm main\n"+
		"deb [arch=amd64 signed-by=/k.gpg] http://mirror.one/debian trixie main\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "sources.list.d", "debian.sources"), []byte(`Types: deb
# http://snapshot.debian.org/archive/debian/20250520T000000Z
URIs: http://deb.example/debian
Suites: bookworm bookworm-updates
Components: main

Types: deb
URIs: http://deb.example/debian-security
Suites: bookworm-security
Components: main
`), 0o644)
	if got := debianMirror(dir, "bookworm"); got != "http://deb.example/debian" {
		t.Errorf("bookworm: %s", got)
	}
	if got := debianMirror(dir, "trixie"); got != "http://mirror.one/debian" {
		t.Errorf("trixie: %s", got)
	}
	if got := debianMirror(dir, "sid"); got != "http://mirror.one/debian" {
		t.Errorf("an unlisted suite takes any Debian archive: %s", got)
	}
}

func TestUnescapeMount(t *testing.T) {
	if got := unescapeMount(`/a\040b/c\011d`); got != "/a b/c\td" {
		t.Errorf("%q", got)
	}
}
