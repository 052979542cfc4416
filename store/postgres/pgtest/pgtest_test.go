package pgtest

import (
	"strings"
	"testing"
)

// Without PostgreSQL's programs the tests skip with a message that names
// what is missing and how to get it.
func TestMissingNamesWhat(t *testing.T) {
	old := binDir
	binDir = t.TempDir()
	defer func() { binDir = old }()
	why := missing()
	if !strings.Contains(why, "PostgreSQL 15") || !strings.Contains(why, "initdb") || !strings.Contains(why, "apt-get install postgresql") {
		t.Errorf("missing() = %q, want it to name PostgreSQL 15, initdb and the package", why)
	}
}
