package torpor

import (
	"fmt"
	"path"
	"strings"
	"time"
)

// Hook types and the transitions they run on (spec 003).
const (
	HookScript = "script"
	HookHTTP   = "http"

	HookOnStart     = "start"
	HookOnPause     = "pause"
	HookOnResume    = "resume"
	HookOnTerminate = "terminate"
)

// DefaultHookTimeout bounds a hook that sets no timeout_seconds.
const DefaultHookTimeout = 30 * time.Second

const (
	maxHooks           = 32
	maxHookTimeoutSecs = 3600
)

// Hook runs code of the sandbox's when it changes state: a program inside
// the sandbox (script) or an HTTP request to a port inside it (http).
type Hook struct {
	Type string `json:"type"`
	// On is start (after create, a start from hibernation, a restart),
	// pause (about to pause), resume (continued after a pause) or
	// terminate (about to be deleted).
	On string `json:"on"`
	// Path is the program (script) or the URL path (http).
	Path      string   `json:"path"`
	Arguments []string `json:"arguments,omitempty"`
	Port      int      `json:"port,omitempty"`
	// Wait makes the transition wait for the hook to finish.
	Wait bool `json:"wait"`
	// TimeoutSeconds is how long the hook may run before it counts as
	// failed and is killed (0: 30 seconds).
	TimeoutSeconds int64 `json:"timeout_seconds,omitempty"`
}

// Timeout is the hook's time limit.
func (h Hook) Timeout() time.Duration {
	if h.TimeoutSeconds <= 0 {
		return DefaultHookTimeout
	}
	return time.Duration(h.TimeoutSeconds) * time.Second
}

// HookFailure records the latest hook that failed on a sandbox.
type HookFailure struct {
	On      string    `json:"on"`
	Index   int       `json:"index"`
	Type    string    `json:"type"`
	Message string    `json:"message"`
	At      time.Time `json:"at"`
}

// ValidateHooks checks a list of hooks.
func ValidateHooks(hooks []Hook) error {
	if len(hooks) > maxHooks {
		return Invalid("hooks", "at most %d hooks", maxHooks)
	}
	for i, h := range hooks {
		p := fmt.Sprintf("hooks[%d]", i)
		switch h.On {
		case HookOnStart, HookOnPause, HookOnResume, HookOnTerminate:
		default:
			return Invalid(p+".on", "must be start, pause, resume or terminate")
		}
		if h.TimeoutSeconds < 0 || h.TimeoutSeconds > maxHookTimeoutSecs {
			return Invalid(p+".timeout_seconds", "must be between 1 and %d (0: %s)", maxHookTimeoutSecs, DefaultHookTimeout)
		}
		switch h.Type {
		case HookScript:
			if !path.IsAbs(h.Path) || len(h.Path) > 4096 || strings.ContainsRune(h.Path, 0) {
				return Invalid(p+".path", "must be the absolute path of a program inside the sandbox")
			}
			if err := ValidateArgv(p+".arguments", append([]string{h.Path}, h.Arguments...), false); err != nil {
				return err
			}
			if h.Port != 0 {
				return Invalid(p+".port", "a script hook has no port")
			}
		case HookHTTP:
			if h.Port < 1 || h.Port > 65535 {
				return Invalid(p+".port", "must be a port between 1 and 65535")
			}
			if !strings.HasPrefix(h.Path, "/") || len(h.Path) > 2048 || strings.ContainsAny(h.Path, " \x00\r\n") {
				return Invalid(p+".path", "must be a URL path starting with /")
			}
			if len(h.Arguments) > 0 {
				return Invalid(p+".arguments", "an http hook takes no arguments")
			}
		default:
			return Invalid(p+".type", "must be script or http")
		}
	}
	return nil
}
