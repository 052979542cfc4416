package initproc

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"time"
)

// Files init writes in its run directory, which the runtime bind-mounts
// read-write from the host. Everything in that directory is written by a
// process inside the sandbox, so the runtime reads it with ReadReport only.
const (
	// ReadyFile appears once the setup commands succeeded and the
	// entrypoint (or the idle wait) started. It holds a Ready.
	ReadyFile = "ready"
	// ResultFile appears when init is about to exit. It holds a Result.
	ResultFile = "result"
	// LogFile receives the entrypoint's stdout and stderr; when it reaches
	// MaxLogSize it is renamed to LogFile+".1" and a new one is started.
	LogFile = "entrypoint.log"
	// MaxLogSize bounds one entrypoint log file.
	MaxLogSize = 1 << 20
	// MaxReportSize bounds a report file; a larger one is not read.
	MaxReportSize = 64 << 10
	// MaxOutputTail bounds the output tail a report carries.
	MaxOutputTail = 4 << 10
)

// Result kinds besides torpor.FailureSetup and torpor.FailureEntrypoint.
const (
	// KindTerminated: init was stopped (SIGTERM or SIGINT) while idle or
	// during setup; ExitCode is 128 plus the signal.
	KindTerminated = "terminated"
	// KindInitError: init itself failed (bad arguments, no run directory).
	KindInitError = "init_error"
)

// Ready is the content of ReadyFile.
type Ready struct {
	// EntrypointPID is the entrypoint's pid inside the sandbox; 0 when
	// init waits idle.
	EntrypointPID int       `json:"entrypoint_pid,omitempty"`
	Time          time.Time `json:"time"`
}

// Result is the content of ResultFile: why init exited.
type Result struct {
	// Kind is torpor.FailureSetup, torpor.FailureEntrypoint,
	// KindTerminated or KindInitError.
	Kind string `json:"kind"`
	// Step is the index of the failed setup command.
	Step int `json:"step,omitempty"`
	// Command is the failed setup command.
	Command string `json:"command,omitempty"`
	// ExitCode is the exit status of the command, or 128+signal when a
	// signal killed it.
	ExitCode int `json:"exit_code"`
	// Signal names the signal that killed the command, if one did.
	Signal string `json:"signal,omitempty"`
	// Output is the tail of the command's output.
	Output string `json:"output,omitempty"`
	// Message says what happened in words.
	Message string    `json:"message,omitempty"`
	Time    time.Time `json:"time"`
}

// ExecResult is what `torpor init exec` writes to its result descriptor.
type ExecResult struct {
	ExitCode int  `json:"exit_code"`
	TimedOut bool `json:"timed_out,omitempty"`
	// Error and Param: the command could not be started because of the
	// named input (e.g. "cwd").
	Error string `json:"error,omitempty"`
	Param string `json:"param,omitempty"`
}

// ReadReport reads the report file name in dir into v. It reports false
// when the file does not exist. It refuses anything but a small regular
// file: no symlink is followed and no FIFO is waited on, since a process in
// the sandbox can put anything there.
func ReadReport(dir, name string, v any) (bool, error) {
	f, err := os.OpenFile(filepath.Join(dir, name), os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("report %s: %w", name, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return false, fmt.Errorf("report %s: %w", name, err)
	}
	if !fi.Mode().IsRegular() {
		return false, fmt.Errorf("report %s: not a regular file", name)
	}
	b, err := io.ReadAll(io.LimitReader(f, MaxReportSize+1))
	if err != nil {
		return false, fmt.Errorf("report %s: %w", name, err)
	}
	if len(b) > MaxReportSize {
		return false, fmt.Errorf("report %s: larger than %d bytes", name, MaxReportSize)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return false, fmt.Errorf("report %s: %w", name, err)
	}
	return true, nil
}

// writeReport writes v as JSON to dir/name atomically (temporary file and
// rename), so a reader sees all of it or nothing.
func writeReport(dir, name string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, b, 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, name))
}

// clipHead returns at most max bytes of the start of s, marking a cut.
func clipHead(s string, max int) string {
	if len(s) <= max {
		return s
	}
	return s[:max] + "..."
}

// clip returns at most max bytes of the end of s.
func clip(s string, max int) string {
	if len(s) <= max {
		return s
	}
	return s[len(s)-max:]
}
