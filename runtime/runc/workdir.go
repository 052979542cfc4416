package runc

import (
	"path"
	"strings"

	"github.com/torpor-dev/torpor"
)

// workingDir is the directory the sandbox's init (and so its setup
// commands and entrypoint) starts in: the template's working directory
// when it is a clean absolute path, else /. runc creates it when the root
// filesystem lacks it.
func workingDir(t torpor.Template) string {
	wd := t.Defaults.WorkingDir
	if wd == "" || len(wd) > 4096 || !path.IsAbs(wd) || path.Clean(wd) != wd || strings.ContainsRune(wd, 0) {
		return "/"
	}
	return wd
}
