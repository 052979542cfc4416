package torpor

import (
	"errors"
	"fmt"
	"time"
)

// ErrorCode is one of the few kinds of failure the platform reports. Codes
// know nothing of HTTP; api/ maps them to status codes in one table.
type ErrorCode string

// The error kinds.
const (
	EInvalid         ErrorCode = "invalid_argument"
	EUnauthenticated ErrorCode = "unauthenticated"
	EForbidden       ErrorCode = "forbidden"
	ENotFound        ErrorCode = "not_found"
	EConflict        ErrorCode = "conflict"
	EGone            ErrorCode = "gone"
	ERateLimited     ErrorCode = "rate_limited" // a key over its request rate; RetryAfter says when to send again
	EUnavailable     ErrorCode = "unavailable"
	EInternal        ErrorCode = "internal"
)

// ErrorCodes lists every code, for the tables that map them.
var ErrorCodes = []ErrorCode{EInvalid, EUnauthenticated, EForbidden, ENotFound, EConflict, EGone, ERateLimited, EUnavailable, EInternal}

// Error is a failure a caller can act on.
type Error struct {
	Code    ErrorCode
	Message string
	// Param names the offending input field (invalid_argument).
	Param string
	// Reason refines the code, e.g. "capacity" for a conflict.
	Reason string
	// State is the sandbox's current state when a verb was refused for it.
	State State
	// RetryAfter suggests when to try again (unavailable, rate_limited,
	// a capacity conflict).
	RetryAfter time.Duration
}

func (e *Error) Error() string {
	if e.Param != "" {
		return fmt.Sprintf("%s: %s (%s)", e.Code, e.Message, e.Param)
	}
	return fmt.Sprintf("%s: %s", e.Code, e.Message)
}

// Errorf returns an *Error of the given code.
func Errorf(code ErrorCode, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Invalid returns an invalid_argument error naming param.
func Invalid(param, format string, args ...any) *Error {
	return &Error{Code: EInvalid, Param: param, Message: fmt.Sprintf(format, args...)}
}

// WrongState is the conflict returned when a verb does not apply to the
// sandbox's current state.
func WrongState(verb string, s State) *Error {
	return &Error{Code: EConflict, State: s, Reason: "state",
		Message: fmt.Sprintf("cannot %s a sandbox that is %s", verb, s)}
}

// ErrorCodeOf returns the code of err, or EInternal for errors that are not
// an *Error (or nil for nil).
func ErrorCodeOf(err error) ErrorCode {
	if err == nil {
		return ""
	}
	var e *Error
	if errors.As(err, &e) {
		return e.Code
	}
	return EInternal
}

// AsError returns err as an *Error. Errors that are not one become an
// internal error whose message hides the details.
func AsError(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		if e.Code == EInternal {
			return &Error{Code: EInternal, Message: "internal error"}
		}
		return e
	}
	return &Error{Code: EInternal, Message: "internal error"}
}

// IsCode reports whether err is an *Error with the given code.
func IsCode(err error, code ErrorCode) bool { return err != nil && ErrorCodeOf(err) == code }
