package wire

import "github.com/torpor-dev/torpor"

// WakeupList is the answer of GET and PUT /v1/sandboxes/{id}/wakeups.
type WakeupList struct {
	Wakeups []torpor.Wakeup `json:"wakeups"`
}

// WakeupsRequest is the body of PUT /v1/sandboxes/{id}/wakeups: the
// wake-ups that replace the sandbox's ([] removes them all).
type WakeupsRequest struct {
	Wakeups []torpor.WakeupSpec `json:"wakeups"`
}
