package initproc

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestNoLookupsThroughTheCLibrary: a dynamically linked torpor runs init
// inside sandboxes with the host's C library, whose name service would
// load the sandbox's own NSS modules, built for another C library. So init
// looks nothing up through it: no os/user (users come from /etc/passwd,
// read here), no host name resolution (the network is used through unix
// sockets only).
func TestNoLookupsThroughTheCLibrary(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Skipf("go list: %v", err)
	}
	for _, pkg := range strings.Fields(string(out)) {
		if pkg == "os/user" {
			t.Error("initproc depends on os/user")
		}
	}
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, call := range []string{"net.Lookup", "net.Resolve", `net.Dial("tcp`, `net.Listen("tcp`, "net.DefaultResolver"} {
			if strings.Contains(string(b), call) {
				t.Errorf("%s calls %s", f, call)
			}
		}
	}
}
