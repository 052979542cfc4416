package instances

import (
	"os"
	"path/filepath"
	"strings"

	"github.com/torpor-dev/torpor"
)

// ValidateTemplate checks the template's read-only directories before
// anything is mounted or built from them: absolute paths without the
// characters overlayfs' options use as separators, each an existing
// directory.
func ValidateTemplate(t torpor.Template) error {
	lowers := t.LowerDirs()
	if len(lowers) == 0 {
		return torpor.Invalid("template", "template %q has no root filesystem", t.Name)
	}
	for _, l := range lowers {
		if !filepath.IsAbs(l) || strings.ContainsAny(l, ",:\\\x00") {
			return torpor.Invalid("template", "template %q has no usable root filesystem path", t.Name)
		}
		if fi, err := os.Stat(l); err != nil || !fi.IsDir() {
			return torpor.Invalid("template", "root filesystem of template %q is missing", t.Name)
		}
	}
	return nil
}
