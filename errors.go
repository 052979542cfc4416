package torpor

import (
	"errors"
	"fmt"
	"syscall"
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

// ReasonDiskFull refines the unavailable error of a change that could not
// be made because the file system of the server's data dir (its database,
// the sandboxes' disk images) has no space left.
const ReasonDiskFull = "disk_full"

// diskFullRetry is the Retry-After of a full data disk: space comes back
// only when someone frees it.
const diskFullRetry = 30 * time.Second

// DiskFull is the error of a change refused because the server's data disk
// is full.
func DiskFull() *Error {
	return &Error{Code: EUnavailable, Reason: ReasonDiskFull, RetryAfter: diskFullRetry, Message: DiskFullMessage}
}

// DiskFullMessage says what DiskFull says, for a sandbox's failure too.
const DiskFullMessage = "the server's data disk is full; free space on the file system of the daemon's data dir, then try again (reads still work)"

// IsDiskFull reports whether err says the server's data disk is full: the
// error DiskFull returns, or a host file system's ENOSPC that no *Error
// explains (a sandbox's own full disk is an *Error of its own).
func IsDiskFull(err error) bool {
	var e *Error
	if errors.As(err, &e) {
		return e.Reason == ReasonDiskFull
	}
	return errors.Is(err, syscall.ENOSPC)
}

// ErrorCodeOf returns the code of err, or EInternal for errors that are not
// an *Error (or nil for nil); see AsError.
func ErrorCodeOf(err error) ErrorCode {
	if err == nil {
		return ""
	}
	return AsError(err).Code
}

// AsError returns err as an *Error. A host file system's ENOSPC is the full
// data disk (DiskFull); other errors that are not an *Error become an
// internal error whose message hides the details.
func AsError(err error) *Error {
	var e *Error
	if errors.As(err, &e) {
		if e.Code == EInternal {
			return &Error{Code: EInternal, Message: "internal error"}
		}
		return e
	}
	if errors.Is(err, syscall.ENOSPC) {
		return DiskFull()
	}
	return &Error{Code: EInternal, Message: "internal error"}
}

// IsCode reports whether err is an *Error with the given code.
func IsCode(err error, code ErrorCode) bool { return err != nil && ErrorCodeOf(err) == code }
