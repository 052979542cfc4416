package torpor

import (
	"context"
	"strings"
	"time"
)

// Process states.
const (
	ProcessRunning = "running"
	ProcessExited  = "exited"
	// ProcessGone: the process was started in an earlier boot of the
	// sandbox (before a hibernate or restart) and no longer exists.
	ProcessGone = "gone"
)

// Bounds of background processes.
const (
	// MaxProcessStdin bounds one write to a process's stdin.
	MaxProcessStdin = 1 << 20
	// MaxProcessOutputRead bounds the output returned by one read.
	MaxProcessOutputRead = 1 << 20
)

// ProcessSignals are the signals a background process may be sent.
var ProcessSignals = []string{"TERM", "KILL", "INT", "HUP"}

// ProcessRequest starts a background process in a sandbox.
type ProcessRequest struct {
	Cmd []string
	Env map[string]string
	Cwd string
	// MinID asks the runtime for an id at least this large, so that ids
	// stay distinct across boots of the sandbox (set by the engine).
	MinID int
}

// ProcessInfo is one background process.
type ProcessInfo struct {
	ID        int       `json:"id"`
	Cmd       []string  `json:"cmd"`
	Pid       int       `json:"pid,omitempty"`
	State     string    `json:"state"`
	ExitCode  *int      `json:"exit_code,omitempty"`
	StartedAt time.Time `json:"started_at"`
	// Boot is the sandbox's boot count when the process was started.
	Boot int `json:"boot,omitempty"`
}

// ProcessOutput is a process's combined stdout and stderr from an
// offset: Data, the offset that follows it (Next), and whether the
// output ended (the process exited and everything it wrote was read).
// Offset is where Data starts: above the offset asked when the output
// there had been dropped from the process's bounded buffer.
type ProcessOutput struct {
	Data     string `json:"data"`
	Offset   int64  `json:"offset"`
	Next     int64  `json:"next"`
	Ended    bool   `json:"ended"`
	ExitCode *int   `json:"exit_code,omitempty"`
}

// ProcessRunner is an optional Runtime capability: background processes
// that live inside the sandbox (across a freeze) until the instance
// stops. A process unknown to the runtime is an ENotFound error.
type ProcessRunner interface {
	StartProcess(ctx context.Context, ref InstanceRef, req ProcessRequest) (ProcessInfo, error)
	ListProcesses(ctx context.Context, ref InstanceRef) ([]ProcessInfo, error)
	ProcessOutput(ctx context.Context, ref InstanceRef, id int, offset int64) (ProcessOutput, error)
	WriteProcessStdin(ctx context.Context, ref InstanceRef, id int, data []byte, close bool) error
	SignalProcess(ctx context.Context, ref InstanceRef, id int, signal string) error
}

// ValidateProcess checks a process request at the edge.
func ValidateProcess(req ProcessRequest) error {
	if err := ValidateArgv("cmd", req.Cmd, false); err != nil {
		return err
	}
	if err := ValidateEnv(req.Env); err != nil {
		return err
	}
	if len(req.Cwd) > 4096 || strings.ContainsRune(req.Cwd, 0) {
		return Invalid("cwd", "must be at most 4096 bytes without NUL")
	}
	if req.Cwd != "" && !strings.HasPrefix(req.Cwd, "/") {
		return Invalid("cwd", "must be an absolute path")
	}
	return nil
}

// NormalizeSignal returns the signal's name without a "SIG" prefix, in
// upper case, or an invalid-argument error when it is not one of
// ProcessSignals.
func NormalizeSignal(s string) (string, error) {
	n := strings.TrimPrefix(strings.ToUpper(s), "SIG")
	if n == "" {
		n = "TERM"
	}
	for _, k := range ProcessSignals {
		if n == k {
			return n, nil
		}
	}
	return "", Invalid("signal", "unknown signal %q; known: %s", s, strings.Join(ProcessSignals, ", "))
}
