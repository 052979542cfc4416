package torpor

import (
	"context"
	"time"
)

// Code languages run_code knows.
const (
	LanguagePython = "python"
	LanguageShell  = "sh"
)

// Code contexts: whether a snippet ran in a fresh interpreter.
const (
	ContextNew      = "new"
	ContextExisting = "existing"
)

// MaxCodeSize bounds one snippet; MaxCodeTimeout its run time.
const (
	MaxCodeSize    = 1 << 20
	MaxCodeTimeout = time.Hour
)

// CodeRequest is a snippet to run in a sandbox's persistent interpreter.
type CodeRequest struct {
	Language string
	Code     string
	// Timeout kills the interpreter when the snippet runs longer; 0 is the
	// runtime's default.
	Timeout time.Duration
}

// CodeResult is what a snippet did. An error raised by the snippet is a
// result (Error set), not a Go error.
type CodeResult struct {
	Stdout string `json:"stdout"`
	Stderr string `json:"stderr"`
	// Result is the repr of a trailing expression (python), if any.
	Result *string    `json:"result,omitempty"`
	Error  *CodeError `json:"error,omitempty"`
	// Context is ContextNew on the first snippet of a fresh interpreter.
	Context string `json:"context"`
	// ExitCode is the status of the snippet's last command (sh).
	ExitCode *int `json:"exit_code,omitempty"`
	TimedOut bool `json:"timed_out,omitempty"`
}

// CodeError is an exception raised by a snippet.
type CodeError struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

// CodeRunner is an optional Runtime capability: run_code, snippets run in
// an interpreter per language that lives inside the sandbox and keeps its
// state between calls (and across a freeze) until the instance stops.
type CodeRunner interface {
	RunCode(ctx context.Context, ref InstanceRef, req CodeRequest) (CodeResult, error)
}

// ValidateCode checks a code request at the edge.
func ValidateCode(req CodeRequest) error {
	switch req.Language {
	case LanguagePython, LanguageShell:
	case "":
		return Invalid("language", "a language is required: %q or %q", LanguagePython, LanguageShell)
	default:
		return Invalid("language", "unknown language %q; known: %q, %q", req.Language, LanguagePython, LanguageShell)
	}
	if len(req.Code) > MaxCodeSize {
		return Invalid("code", "the code is longer than %d bytes", MaxCodeSize)
	}
	for i := 0; i < len(req.Code); i++ {
		if req.Code[i] == 0 {
			return Invalid("code", "the code holds a NUL byte")
		}
	}
	if req.Timeout < 0 || req.Timeout > MaxCodeTimeout {
		return Invalid("timeout_seconds", "must be between 0 and %d", int(MaxCodeTimeout.Seconds()))
	}
	return nil
}
