package e2b_test

import (
	"os"
	"regexp"
	"testing"

	"github.com/torpor-dev/torpor/e2b"
)

// Every E2B endpoint served is in docs/e2b.md, and every one documented
// there is served.
func TestRoutesAreDocumented(t *testing.T) {
	data, err := os.ReadFile("../docs/e2b.md")
	if err != nil {
		t.Fatal(err)
	}
	documented := map[string]bool{}
	for _, m := range regexp.MustCompile("`(GET|POST|PUT|PATCH|DELETE) (/[^`/][^`]*)`").FindAllStringSubmatch(string(data), -1) {
		if m[2] != "/files" && m[2] != "/health" && m[2] != "/execute" && m[2] != "/contexts" && m[2] != "/contexts/{id}/restart" {
			documented[m[1]+" "+m[2]] = true
		}
	}
	served := map[string]bool{}
	for _, r := range e2b.Routes() {
		served[r] = true
		if !documented[r] {
			t.Errorf("%s is served but not in docs/e2b.md", r)
		}
	}
	for r := range documented {
		if !served[r] {
			t.Errorf("%s is in docs/e2b.md but not served", r)
		}
	}
}
