// Package proto is the protocol between the microVM runtime (runtime/vm)
// on the host and its agent inside the guest (runtime/vm/agent), spoken
// over one virtio-serial port.
//
// The stream is newline-delimited JSON frames. A host that connects (the
// port has one host end; a new daemon, or another Runtime in the same
// process once the first lets go, reconnects) sends a newline and a hello
// frame with a fresh nonce; the agent drops what it was doing for an
// earlier host and answers with the same nonce, and the host ignores
// every frame before that answer. A line cut short by a disconnect is
// garbage that both ends skip, so the framing resynchronises by itself.
//
// On one connection many requests run at once. A request (Frame.T
// "req") carries an id chosen by the host; byte streams that belong to it
// (exec stdin/stdout/stderr, file contents, a dialled connection) are
// "data" frames naming the id and a stream number, closed by "eof", and
// paced by "credit" frames: a sender never has more than Window bytes of a
// stream unacknowledged. The request ends with one "resp" frame, sent after
// every data frame of the request's output streams. "cancel" asks the
// agent to give up on a request (an exec is killed).
//
// Everything the host reads from the agent comes from inside the sandbox
// and is bounded (MaxFrame) and checked; the agent trusts the host.
package proto

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/torpor-dev/torpor"
)

// Version of the protocol. The agent refuses a hello of another version;
// the host refuses an agent that answers with another one.
const Version = 1

// Bounds of the framing.
const (
	// MaxFrame bounds one frame on the wire, newline included.
	MaxFrame = 1 << 20
	// Chunk is the most payload bytes one data frame carries.
	Chunk = 32 << 10
	// Window is how many bytes of a stream may be in flight unacknowledged.
	Window = 256 << 10
)

// Paths in the guest: the agent keeps a copy of itself at GuestAgentPath
// (a tmpfs, not the sandbox's disk), which runs as the sandbox's code
// server (`init code-server`, package initproc) with its socket in
// GuestRunDir. Package files refuses paths under /.torpor.
const (
	GuestAgentPath = "/.torpor/torpor"
	GuestRunDir    = "/.torpor/run"
)

// PortName is the name of the agent's virtio-serial port; StatusPortName
// the port whose host end is a ring buffer that the agent writes the
// instance's Result to before it powers the guest off.
const (
	PortName       = "torpor.agent"
	StatusPortName = "torpor.status"
)

// NetParam names the guest kernel's command-line parameter that carries
// the guest's network settings (GuestNet), for a VM on the host's
// sandbox network. The agent reads it at boot, before it answers the
// host, so the settings are not part of the frames and a guest restored
// from a snapshot keeps them.
const NetParam = "torpor.net"

// GuestNet is the guest's network settings: its eth0 gets Addr as a /32,
// the MTU, a route to Gateway on the link and the default route through
// it.
type GuestNet struct {
	Addr    netip.Addr `json:"addr"`
	Gateway netip.Addr `json:"gateway"`
	MTU     int        `json:"mtu"`
}

// Param is the kernel command-line parameter of g: torpor.net=ADDR,GATEWAY,MTU.
func (g GuestNet) Param() string {
	return fmt.Sprintf("%s=%s,%s,%d", NetParam, g.Addr, g.Gateway, g.MTU)
}

// ParseGuestNet finds the network settings in a kernel command line;
// ok is false when there are none.
func ParseGuestNet(cmdline string) (g GuestNet, ok bool, err error) {
	for _, f := range strings.Fields(cmdline) {
		v, found := strings.CutPrefix(f, NetParam+"=")
		if !found {
			continue
		}
		parts := strings.Split(v, ",")
		if len(parts) != 3 {
			return GuestNet{}, false, fmt.Errorf("bad %s %q", NetParam, v)
		}
		if g.Addr, err = netip.ParseAddr(parts[0]); err == nil {
			g.Gateway, err = netip.ParseAddr(parts[1])
		}
		if err == nil {
			g.MTU, err = strconv.Atoi(parts[2])
		}
		if err != nil || !g.Addr.Is4() || !g.Gateway.Is4() || g.MTU < 576 || g.MTU > 65535 {
			return GuestNet{}, false, fmt.Errorf("bad %s %q", NetParam, v)
		}
		return g, true, nil
	}
	return GuestNet{}, false, nil
}

// Frame types.
const (
	THello  = "hello"
	TReq    = "req"
	TResp   = "resp"
	TData   = "data"
	TEOF    = "eof"
	TCredit = "credit"
	TCancel = "cancel"
)

// Stream numbers within a request.
const (
	Stdin  = 0
	Stdout = 1
	Stderr = 2
)

// Frame is one line of the protocol.
type Frame struct {
	T  string `json:"t"`
	ID uint64 `json:"id,omitempty"`
	// Op names the operation of a request.
	Op string `json:"op,omitempty"`
	// S is the stream of a data, eof or credit frame.
	S int `json:"s,omitempty"`
	// N is the byte count a credit frame grants.
	N int64 `json:"n,omitempty"`
	// D is a data frame's payload (base64 on the wire).
	D []byte `json:"d,omitempty"`
	// B is the body of a hello, request or response.
	B json.RawMessage `json:"b,omitempty"`
	// Err is a failed request's error.
	Err *Error `json:"err,omitempty"`
}

// Hello is the body of both hello frames.
type Hello struct {
	Version int    `json:"version"`
	Nonce   string `json:"nonce"`
	// Agent describes the agent (in its answer).
	Agent string `json:"agent,omitempty"`
	// Now is the host's clock (in the host's hello): a guest restored
	// from a snapshot wakes up with the clock it had when paused, and the
	// agent sets it.
	Now time.Time `json:"now,omitempty"`
}

// Error is a failure the agent reports; it becomes a *torpor.Error.
type Error struct {
	Code    torpor.ErrorCode `json:"code"`
	Message string           `json:"message"`
	Param   string           `json:"param,omitempty"`
	Reason  string           `json:"reason,omitempty"`
	// ReadErr marks a failure to read the request's input stream.
	ReadErr bool `json:"read_err,omitempty"`
}

// Operations.
const (
	// OpStart configures the sandbox and runs its setup commands and
	// entrypoint (body Start, result StartResult).
	OpStart = "start"
	// OpWait answers once the entrypoint has exited (result Result).
	OpWait = "wait"
	// OpExec runs a command (body Exec, streams 0-2, result ExecResult).
	OpExec = "exec"
	// OpSync flushes the guest's file systems.
	OpSync = "sync"
	// OpShutdown ends every sandbox process and flushes the disk, ahead
	// of the host stopping the VM.
	OpShutdown = "shutdown"
	// OpCPU reports the sandbox's CPU time (result CPU).
	OpCPU = "cpu"
	// OpDial connects to an address in the guest (body Dial, streams 0
	// and 1 carry the connection's bytes; the response comes when the
	// connection is made).
	OpDial = "dial"
	// File operations (body File): see runtime/vm's Files.
	OpFileOpen   = "file.open"   // result FileResult with Info and Handle
	OpFileRead   = "file.read"   // Handle, Offset, Length; data on stream 1
	OpFileClose  = "file.close"  // Handle
	OpFileStat   = "file.stat"   // result FileResult.Info
	OpFileWrite  = "file.write"  // data on stream 0; result FileResult.Info
	OpFileMkdir  = "file.mkdir"  // result FileResult.Info
	OpFileRename = "file.rename" // result FileResult.Info
	OpFileRemove = "file.remove"
	OpFileList   = "file.list"  // result FileResult.Listing
	OpFileTar    = "file.tar"   // tar on stream 1
	OpFileUntar  = "file.untar" // tar on stream 0; result FileResult.Tar
)

// Start is the body of OpStart.
type Start struct {
	Hostname   string            `json:"hostname,omitempty"`
	Env        map[string]string `json:"env,omitempty"`
	Setup      []string          `json:"setup,omitempty"`
	Entrypoint []string          `json:"entrypoint,omitempty"`
	// MemoryMax and PidsMax bound the sandbox's processes (0: no bound);
	// CPUQuota is in CPUs (0: no bound).
	MemoryMax int64   `json:"memory_max,omitempty"`
	PidsMax   int64   `json:"pids_max,omitempty"`
	CPUQuota  float64 `json:"cpu_quota,omitempty"`
	// Now is the host's clock, to set the guest's.
	Now time.Time `json:"now"`
	// ResolvConf, when set, is written to the sandbox's /etc/resolv.conf
	// (on its disk, before the setup commands run); empty leaves the
	// file as it is.
	ResolvConf string `json:"resolv_conf,omitempty"`
	// Volumes are mounted, in order, before the setup commands run.
	Volumes []Volume `json:"volumes,omitempty"`
}

// Volume is a tenant's volume on a virtio disk of the guest: the disk
// whose serial is Serial holds an ext4 file system whose directory data/
// is mounted at Path, read-only with ReadOnly.
type Volume struct {
	Serial   string `json:"serial"`
	Path     string `json:"path"`
	ReadOnly bool   `json:"read_only,omitempty"`
}

// StartResult answers OpStart: Failed is set when a setup command failed
// (the instance is then stopped) or the entrypoint could not start.
type StartResult struct {
	Failed *Result `json:"failed,omitempty"`
}

// Result says why the instance stopped, as initproc's report does.
type Result struct {
	// Kind is torpor.FailureSetup, torpor.FailureEntrypoint or
	// torpor.FailureOOM.
	Kind     string `json:"kind"`
	ExitCode int    `json:"exit_code"`
	Signal   string `json:"signal,omitempty"`
	Message  string `json:"message"`
	Output   string `json:"output,omitempty"`
	// OOMKills counts processes the kernel killed for memory.
	OOMKills int64     `json:"oom_kills,omitempty"`
	Time     time.Time `json:"time"`
}

// Exec is the body of OpExec.
type Exec struct {
	Cmd []string          `json:"cmd"`
	Env map[string]string `json:"env,omitempty"`
	Cwd string            `json:"cwd,omitempty"`
	// User is a name from the sandbox's /etc/passwd or uid[:gid].
	User string `json:"user,omitempty"`
	// Stdin says that stream 0 carries the command's input; without it
	// the command reads /dev/null.
	Stdin   bool          `json:"stdin,omitempty"`
	Timeout time.Duration `json:"timeout,omitempty"`
}

// ExecResult answers OpExec.
type ExecResult struct {
	ExitCode int  `json:"exit_code"`
	TimedOut bool `json:"timed_out,omitempty"`
}

// CPU answers OpCPU.
type CPU struct {
	UsageUsec int64 `json:"usage_usec"`
}

// Dial is the body of OpDial.
type Dial struct {
	Network string `json:"network"`
	Addr    string `json:"addr"`
}

// File is the body of the file operations.
type File struct {
	Path      string `json:"path,omitempty"`
	To        string `json:"to,omitempty"`
	Mode      *int   `json:"mode,omitempty"`
	Parents   bool   `json:"parents,omitempty"`
	Overwrite bool   `json:"overwrite,omitempty"`
	Recursive bool   `json:"recursive,omitempty"`
	Depth     int    `json:"depth,omitempty"`
	Max       int    `json:"max,omitempty"`
	Handle    uint64 `json:"handle,omitempty"`
	Offset    int64  `json:"offset,omitempty"`
	Length    int64  `json:"length,omitempty"`
}

// FileResult answers the file operations; which field is set depends on
// the operation. The values are package files' types, as JSON.
type FileResult struct {
	Info    json.RawMessage `json:"info,omitempty"`
	Listing json.RawMessage `json:"listing,omitempty"`
	Tar     json.RawMessage `json:"tar,omitempty"`
	Handle  uint64          `json:"handle,omitempty"`
}

// ErrorOf turns err into the protocol's Error.
func ErrorOf(err error) *Error {
	if err == nil {
		return nil
	}
	var te *torpor.Error
	if errors.As(err, &te) {
		return &Error{Code: te.Code, Message: te.Message, Param: te.Param, Reason: te.Reason}
	}
	return &Error{Code: torpor.EInternal, Message: err.Error()}
}

// Err returns e as a *torpor.Error (nil for nil).
func (e *Error) Err() error {
	if e == nil {
		return nil
	}
	code := e.Code
	known := false
	for _, c := range torpor.ErrorCodes {
		known = known || c == code
	}
	if !known {
		code = torpor.EInternal
	}
	return &torpor.Error{Code: code, Message: clip(e.Message, 4096), Param: clip(e.Param, 128), Reason: clip(e.Reason, 128)}
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}
