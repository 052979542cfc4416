package instances

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/torpor-dev/torpor/initproc"
)

// The files below are in a sandbox's directory, which the runtime owns and
// the sandbox cannot reach; a log written by the instance's process is
// still read as text that may have come out of the sandbox.

// ReadTail returns the last max bytes of a file, as valid UTF-8 ("" if it
// is unreadable): the end of a log, for an error message.
func ReadTail(name string, max int64) string {
	f, err := os.Open(name)
	if err != nil {
		return ""
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > max {
		_, _ = f.Seek(-max, io.SeekEnd)
	}
	b, _ := io.ReadAll(io.LimitReader(f, max))
	return strings.TrimSpace(initproc.SandboxText(string(b), int(max)))
}

// WriteFileAtomic writes a file through a temporary file and a rename, so
// that a crash leaves the old record or the new one, never half of it. It
// makes the file's directory when it is missing.
func WriteFileAtomic(name string, b []byte, perm os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(name), 0o700); err != nil {
		return err
	}
	tmp := fmt.Sprintf("%s.tmp%d", name, os.Getpid())
	if err := os.WriteFile(tmp, b, perm); err != nil {
		return err
	}
	return os.Rename(tmp, name)
}

// ReadPidFile reads the pid a starting process wrote to name (runc's
// --pid-file, QEMU's -pidfile).
func ReadPidFile(name string) (int, error) {
	b, err := os.ReadFile(name)
	if err != nil {
		return 0, fmt.Errorf("no pid file: %w", err)
	}
	pid, err := strconv.Atoi(string(bytes.TrimSpace(b)))
	if err != nil || pid <= 0 {
		return 0, fmt.Errorf("bad pid file %q", b)
	}
	return pid, nil
}
