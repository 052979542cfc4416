package torpor

import (
	"context"
	"regexp"
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
	// MaxProcessWait bounds how long one read waits for new output.
	MaxProcessWait = 10 * time.Second
	// maxProcessTag bounds a process's tag.
	maxProcessTag = 256
)

// ProcessSignals are the signals a background process may be sent.
var ProcessSignals = []string{"TERM", "KILL", "INT", "HUP"}

// ProcessRequest starts a background process in a sandbox.
type ProcessRequest struct {
	Cmd []string
	// Env is merged over the sandbox's environment.
	Env map[string]string
	// Cwd is the working directory; empty: the user's home when User is
	// set, else the sandbox's default.
	Cwd string
	// User runs the process as a user of the sandbox: a name from its
	// /etc/passwd, or uid[:gid]. Empty: root. A named user also gets
	// HOME, USER and LOGNAME.
	User string
	// Tag is a caller's name for the process (E2B's tag).
	Tag string
	// NoStdin starts the process with its stdin on /dev/null.
	NoStdin bool
	// Stderr keeps the process's stderr apart from its stdout, for reads
	// that split them (ProcessRead.Split). Otherwise both share one pipe:
	// the combined output keeps the exact order they were written in, and
	// a split read has it all as stdout.
	Stderr bool
	// Timeout kills the process (and its group) when it runs longer
	// (0: no limit).
	Timeout time.Duration
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
	// What the process was started with, when given.
	Env  map[string]string `json:"env,omitempty"`
	Cwd  string            `json:"cwd,omitempty"`
	User string            `json:"user,omitempty"`
	Tag  string            `json:"tag,omitempty"`
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
	// Chunks is the output split by stream, when the read asked for it
	// (ProcessRead.Split); Data is then empty.
	Chunks []ProcessChunk `json:"-"`
	// Signal is the signal that ended the process (0: it exited by
	// itself), once Ended.
	Signal int `json:"-"`
}

// ProcessChunk is a run of a process's output from one of its streams.
type ProcessChunk struct {
	Stderr bool
	Data   []byte
}

// ProcessRead is a read of a process's output.
type ProcessRead struct {
	Offset int64
	// Wait, when there is nothing new at Offset, waits up to this long
	// (at most MaxProcessWait) for output or the end before answering.
	Wait time.Duration
	// Split returns the output by stream (ProcessOutput.Chunks).
	Split bool
}

// ProcessRunner is an optional Runtime capability: background processes
// that live inside the sandbox (across a freeze) until the instance
// stops. A process unknown to the runtime is an ENotFound error.
type ProcessRunner interface {
	StartProcess(ctx context.Context, ref InstanceRef, req ProcessRequest) (ProcessInfo, error)
	ListProcesses(ctx context.Context, ref InstanceRef) ([]ProcessInfo, error)
	ProcessOutput(ctx context.Context, ref InstanceRef, id int, offset int64) (ProcessOutput, error)
	// ReadProcess is ProcessOutput with the options of ProcessRead.
	ReadProcess(ctx context.Context, ref InstanceRef, id int, req ProcessRead) (ProcessOutput, error)
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
	if req.User != "" && !processUserRe.MatchString(req.User) {
		return Invalid("user", "must be a user name or uid[:gid]")
	}
	if len(req.Tag) > maxProcessTag || strings.ContainsRune(req.Tag, 0) {
		return Invalid("tag", "must be at most %d bytes without NUL", maxProcessTag)
	}
	if req.Timeout < 0 {
		return Invalid("timeout", "must not be negative")
	}
	return nil
}

// ValidateProcessRead checks a read of a process's output.
func ValidateProcessRead(req ProcessRead) error {
	if req.Offset < 0 {
		return Invalid("offset", "must not be negative")
	}
	if req.Wait < 0 {
		return Invalid("wait", "must not be negative")
	}
	return nil
}

// processUserRe is a user name or uid[:gid].
var processUserRe = regexp.MustCompile(`^([A-Za-z_][A-Za-z0-9_.-]{0,31}|[0-9]{1,10}(:[0-9]{1,10})?)$`)

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
