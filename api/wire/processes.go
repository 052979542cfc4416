package wire

import "github.com/torpor-dev/torpor"

// ProcessRequest is the body of POST .../processes.
type ProcessRequest struct {
	Cmd []string          `json:"cmd"`
	Env map[string]string `json:"env,omitempty"`
	Cwd string            `json:"cwd,omitempty"`
}

// Process is one background process.
type Process = torpor.ProcessInfo

// ProcessList is the answer of GET .../processes.
type ProcessList struct {
	Processes []Process `json:"processes"`
}

// ProcessOutput is the answer of GET .../processes/{pid}/output, and the
// data of each "output" event of its stream.
type ProcessOutput = torpor.ProcessOutput

// StdinRequest is the body of POST .../processes/{pid}/stdin.
type StdinRequest struct {
	Data  string `json:"data"`
	Close bool   `json:"close,omitempty"`
}

// SignalRequest is the body of POST .../processes/{pid}/signal.
type SignalRequest struct {
	Signal string `json:"signal"`
}

// EventOutput is an event of a process output stream; the stream ends
// with an "exit" event (ProcessOutput with ended set) or an "error".
const EventOutput = "output"
