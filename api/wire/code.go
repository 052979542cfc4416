package wire

import "github.com/torpor-dev/torpor"

// CodeRequest is the body of POST .../code.
type CodeRequest struct {
	Language       string  `json:"language"`
	Code           string  `json:"code"`
	TimeoutSeconds float64 `json:"timeout_seconds,omitempty"`
}

// CodeResponse is what a snippet did: stdout, stderr, the repr of a
// trailing expression (python), a structured error, the context (new or
// existing interpreter), the exit code (sh).
type CodeResponse = torpor.CodeResult
