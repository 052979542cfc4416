package torpor

import (
	"context"
	"path"
	"regexp"
	"strings"
	"time"
)

// Code languages run_code knows.
const (
	LanguagePython = "python"
	LanguageShell  = "sh"
	LanguageBash   = "bash"
)

// Languages lists the languages run_code knows.
var Languages = []string{LanguagePython, LanguageShell, LanguageBash}

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

// CodeOp is what a CodeRequest asks of a sandbox's interpreters.
type CodeOp string

const (
	// CodeRun runs Code in the interpreter of the request's context.
	CodeRun CodeOp = ""
	// CodeCreate makes the context the request names (Context, Language,
	// Cwd); its interpreter starts in Cwd.
	CodeCreate CodeOp = "create"
	// CodeRestart drops a context's interpreter (and its state); the next
	// snippet starts a fresh one.
	CodeRestart CodeOp = "restart"
	// CodeDelete ends a context and its interpreter.
	CodeDelete CodeOp = "delete"
	// CodeList lists the contexts (CodeResult.Contexts).
	CodeList CodeOp = "list"
)

// CodeRequest is a snippet to run in a sandbox's persistent interpreter,
// or (Op) an operation on its code contexts.
type CodeRequest struct {
	Op       CodeOp
	Language string
	Code     string
	// Timeout kills the interpreter when the snippet runs longer; 0 is the
	// runtime's default.
	Timeout time.Duration
	// Context names the interpreter: "" (or the language's name) is the
	// language's default one; another id is a context made by CodeCreate,
	// an interpreter of its own with its own state, whose language a
	// snippet need not repeat. Running in an unknown context is not_found.
	Context string
	// Env is set in the interpreter's environment for this snippet only.
	Env map[string]string
	// Cwd is where the interpreter starts, when this request starts one
	// (CodeCreate, or the first snippet of a default context).
	Cwd string
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
	// Displays are the snippet's rich outputs (python): what it displayed,
	// in order, then its trailing expression's value (Main).
	Displays []CodeDisplay `json:"displays,omitempty"`
	// ExecutionCount counts the snippets run in this interpreter, this
	// one included.
	ExecutionCount int `json:"execution_count,omitempty"`
	// Contexts answers CodeList and CodeCreate.
	Contexts []CodeContext `json:"contexts,omitempty"`
}

// CodeError is an exception raised by a snippet.
type CodeError struct {
	Name      string `json:"name"`
	Value     string `json:"value"`
	Traceback string `json:"traceback"`
}

// CodeDisplay is one rich output of a snippet, as a map from MIME type
// to representation: "text/plain" (a repr), "image/png" and other binary
// formats in base64, "text/html", "application/json" (JSON text), ...
type CodeDisplay struct {
	// Main is set on the value of the snippet's trailing expression.
	Main bool              `json:"main,omitempty"`
	Data map[string]string `json:"data"`
}

// CodeContext is one interpreter of a sandbox.
type CodeContext struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd,omitempty"`
	// Default marks a language's default context (its ID is the language).
	Default bool `json:"default,omitempty"`
	// Running says whether its interpreter is started.
	Running bool `json:"running"`
}

// CodeRunner is an optional Runtime capability: run_code, snippets run in
// an interpreter per language that lives inside the sandbox and keeps its
// state between calls (and across a freeze) until the instance stops.
type CodeRunner interface {
	RunCode(ctx context.Context, ref InstanceRef, req CodeRequest) (CodeResult, error)
}

// codeContextRe is what a context id may hold.
var codeContextRe = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$`)

// ValidateCode checks a code request at the edge.
func ValidateCode(req CodeRequest) error {
	switch req.Op {
	case CodeRun, CodeCreate, CodeRestart, CodeDelete:
	case CodeList:
		return nil
	default:
		return Invalid("op", "unknown code operation %q", truncate(string(req.Op)))
	}
	switch {
	case req.Context == "" && req.Op != CodeRun:
		return Invalid("context", "name the context")
	case req.Context != "" && !codeContextRe.MatchString(req.Context):
		return Invalid("context", "a context id is 1-64 letters, digits, '_', '.' or '-'")
	case req.Op == CodeCreate && isLanguage(req.Context):
		return Invalid("context", "%q is the name of a language's default context", req.Context)
	}
	if req.Op == CodeRestart || req.Op == CodeDelete {
		return nil
	}
	switch {
	case isLanguage(req.Language):
	case req.Language == "" && req.Context != "" && req.Op == CodeRun:
		// The context's own language.
	case req.Language == "":
		return Invalid("language", "a language is required: %q, %q or %q", LanguagePython, LanguageShell, LanguageBash)
	default:
		return Invalid("language", "unknown language %q; known: %q, %q, %q", truncate(req.Language), LanguagePython, LanguageShell, LanguageBash)
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
	if err := ValidateEnv(req.Env); err != nil {
		return err
	}
	if req.Cwd != "" && (!path.IsAbs(req.Cwd) || len(req.Cwd) > 4096 || strings.ContainsRune(req.Cwd, 0)) {
		return Invalid("cwd", "must be an absolute path")
	}
	return nil
}

func isLanguage(s string) bool {
	for _, l := range Languages {
		if s == l {
			return true
		}
	}
	return false
}

// CodeOutput is what a snippet running in a code context has written so
// far, from the offsets asked: Running is false when no snippet runs
// there (then nothing is read).
type CodeOutput struct {
	Stdout  string `json:"stdout,omitempty"`
	Stderr  string `json:"stderr,omitempty"`
	Running bool   `json:"running"`
}

// CodeOutputReader is an optional Runtime capability: the output a
// snippet running in a context (python) has written so far, while it
// runs, so that it can be streamed (E2B's code interpreter). Offsets are
// byte offsets into the running snippet's stdout and stderr.
type CodeOutputReader interface {
	CodeOutput(ctx context.Context, ref InstanceRef, context string, stdoutOffset, stderrOffset int64) (CodeOutput, error)
}
