package initproc

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sort"
	"sync"
	"syscall"
	"time"

	"github.com/torpor-dev/torpor"
)

// Bounds of the code server's process table.
const (
	// MaxProcessOutput is the output kept per background process: the
	// last bytes it wrote.
	MaxProcessOutput = 1 << 20
	// maxProcesses bounds the table; the oldest exited processes are
	// dropped first.
	maxProcesses = 64
	// stdinTimeout bounds a write to a process that does not read.
	stdinTimeout = 5 * time.Second
	// outputSettle is how long after a process exits its output is
	// awaited (a child it left may keep the pipe open).
	outputSettle = time.Second
)

// Process operations of the code server.
const (
	ProcStart  = "start"
	ProcList   = "list"
	ProcOutput = "output"
	ProcStdin  = "stdin"
	ProcSignal = "signal"
)

// ProcRequest is a process-table operation sent to the code server (in
// CodeRequest.Proc).
type ProcRequest struct {
	Op     string            `json:"op"`
	Cmd    []string          `json:"cmd,omitempty"`
	Env    map[string]string `json:"env,omitempty"`
	Cwd    string            `json:"cwd,omitempty"`
	MinID  int               `json:"min_id,omitempty"`
	ID     int               `json:"id,omitempty"`
	Offset int64             `json:"offset,omitempty"`
	Data   []byte            `json:"data,omitempty"`
	Close  bool              `json:"close,omitempty"`
	Signal string            `json:"signal,omitempty"`
}

// ProcResponse is the code server's answer to a ProcRequest. Data is the
// output read (Output.Data is left empty: bytes travel in Data).
type ProcResponse struct {
	Info   *torpor.ProcessInfo   `json:"info,omitempty"`
	List   []torpor.ProcessInfo  `json:"list,omitempty"`
	Output *torpor.ProcessOutput `json:"output,omitempty"`
	Data   []byte                `json:"data,omitempty"`
	// NotFound: no process has that id. Invalid and Conflict say why the
	// operation was refused.
	NotFound bool   `json:"not_found,omitempty"`
	Invalid  string `json:"invalid,omitempty"`
	// Param names the field Invalid is about, when it is not the obvious one.
	Param    string `json:"param,omitempty"`
	Conflict string `json:"conflict,omitempty"`
}

// procTable is the code server's background processes.
type procTable struct {
	mu    sync.Mutex
	next  int
	procs map[int]*bgProc
}

type bgProc struct {
	id      int
	argv    []string
	pid     int
	started time.Time
	stdin   *os.File
	out     *ring
	settled chan struct{} // closed once exited and its output read

	mu     sync.Mutex
	exited bool // reaped: its pid may be reused
	code   int

	stdinMu  sync.Mutex // held through a write, which may wait
	stdinErr bool
}

func newProcTable() *procTable { return &procTable{next: 1, procs: map[int]*bgProc{}} }

func (t *procTable) handle(req ProcRequest) ProcResponse {
	switch req.Op {
	case ProcStart:
		return t.start(req)
	case ProcList:
		return ProcResponse{List: t.list()}
	}
	t.mu.Lock()
	p := t.procs[req.ID]
	t.mu.Unlock()
	if p == nil {
		return ProcResponse{NotFound: true}
	}
	switch req.Op {
	case ProcOutput:
		return p.output(req.Offset)
	case ProcStdin:
		return p.write(req.Data, req.Close)
	case ProcSignal:
		return p.signal(req.Signal)
	}
	return ProcResponse{Invalid: fmt.Sprintf("unknown operation %q", req.Op)}
}

var signals = map[string]syscall.Signal{"TERM": syscall.SIGTERM, "KILL": syscall.SIGKILL, "INT": syscall.SIGINT, "HUP": syscall.SIGHUP}

func (t *procTable) start(req ProcRequest) ProcResponse {
	if len(req.Cmd) == 0 || req.Cmd[0] == "" {
		return ProcResponse{Invalid: "a command is required"}
	}
	if req.Cwd != "" {
		if fi, err := os.Stat(req.Cwd); err != nil || !fi.IsDir() {
			return ProcResponse{Invalid: fmt.Sprintf("%s is not a directory in the sandbox", req.Cwd), Param: "cwd"}
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.procs) >= maxProcesses && !t.dropExited() {
		return ProcResponse{Conflict: fmt.Sprintf("%d processes are running; stop one first", len(t.procs))}
	}
	inR, inW, err := os.Pipe()
	if err != nil {
		return ProcResponse{Conflict: err.Error()}
	}
	defer inR.Close()
	outR, outW, err := os.Pipe()
	if err != nil {
		inW.Close()
		return ProcResponse{Conflict: err.Error()}
	}
	defer outW.Close()
	cmd := exec.Command(req.Cmd[0], req.Cmd[1:]...)
	cmd.Env = os.Environ()
	for k, v := range req.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Dir = req.Cwd
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, outW
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		inW.Close()
		outR.Close()
		var ee *exec.Error
		var pe *os.PathError
		if errors.As(err, &ee) || errors.As(err, &pe) {
			return ProcResponse{Invalid: "cannot start: " + err.Error()}
		}
		return ProcResponse{Conflict: "cannot start: " + err.Error()}
	}
	id := max(t.next, req.MinID)
	t.next = id + 1
	p := &bgProc{id: id, argv: req.Cmd, pid: cmd.Process.Pid, started: time.Now().UTC(),
		stdin: inW, out: newRing(MaxProcessOutput), settled: make(chan struct{})}
	t.procs[id] = p
	pumped := make(chan struct{})
	go func() {
		defer close(pumped)
		defer outR.Close()
		b := make([]byte, 32<<10)
		for {
			n, err := outR.Read(b)
			if n > 0 {
				p.out.write(b[:n])
			}
			if err != nil {
				return
			}
		}
	}()
	go func() {
		_ = cmd.Wait()
		code := -1
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok {
			code = exitCode(ws)
		}
		p.mu.Lock()
		p.exited, p.code = true, code
		p.mu.Unlock()
		select {
		case <-pumped:
		case <-time.After(outputSettle):
		}
		close(p.settled)
	}()
	info := p.info()
	return ProcResponse{Info: &info}
}

// dropExited drops the oldest exited process; t.mu is held.
func (t *procTable) dropExited() bool {
	var old *bgProc
	for _, p := range t.procs {
		if p.hasExited() && (old == nil || p.id < old.id) {
			old = p
		}
	}
	if old == nil {
		return false
	}
	delete(t.procs, old.id)
	old.stdin.Close()
	return true
}

func (t *procTable) list() []torpor.ProcessInfo {
	t.mu.Lock()
	out := make([]torpor.ProcessInfo, 0, len(t.procs))
	for _, p := range t.procs {
		out = append(out, p.info())
	}
	t.mu.Unlock()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

func (p *bgProc) hasExited() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.exited
}

func (p *bgProc) info() torpor.ProcessInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	in := torpor.ProcessInfo{ID: p.id, Cmd: p.argv, Pid: p.pid, State: torpor.ProcessRunning, StartedAt: p.started}
	if p.exited {
		code := p.code
		in.State, in.ExitCode = torpor.ProcessExited, &code
	}
	return in
}

func (p *bgProc) output(offset int64) ProcResponse {
	if offset < 0 {
		return ProcResponse{Invalid: "offset must not be negative"}
	}
	// Read whether it ended before the data, so that output written
	// before the end is never missed.
	settled := false
	select {
	case <-p.settled:
		settled = true
	default:
	}
	p.mu.Lock()
	code := p.code
	p.mu.Unlock()
	data, from, next, end := p.out.read(offset, torpor.MaxProcessOutputRead)
	o := &torpor.ProcessOutput{Offset: from, Next: next}
	if settled && next == end {
		o.Ended, o.ExitCode = true, &code
	}
	return ProcResponse{Output: o, Data: data}
}

func (p *bgProc) write(data []byte, closeIt bool) ProcResponse {
	p.stdinMu.Lock()
	defer p.stdinMu.Unlock()
	if p.stdinErr {
		return ProcResponse{Conflict: "the process's stdin is closed"}
	}
	if len(data) > 0 {
		_ = p.stdin.SetWriteDeadline(time.Now().Add(stdinTimeout))
		if _, err := p.stdin.Write(data); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return ProcResponse{Conflict: "the process does not read its stdin"}
			}
			p.stdinErr = true
			p.stdin.Close()
			return ProcResponse{Conflict: "the process's stdin is closed: " + err.Error()}
		}
	}
	if closeIt {
		p.stdinErr = true
		p.stdin.Close()
	}
	return ProcResponse{}
}

func (p *bgProc) signal(name string) ProcResponse {
	sig, ok := signals[name]
	if !ok {
		return ProcResponse{Invalid: fmt.Sprintf("unknown signal %q", name)}
	}
	// exited is set as soon as the process is reaped (its pid may then be
	// reused); p.mu keeps it from changing while the signal is sent.
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.exited {
		return ProcResponse{Conflict: "the process has exited"}
	}
	// The whole group: what a shell started goes too.
	if err := syscall.Kill(-p.pid, sig); err != nil {
		_ = syscall.Kill(p.pid, sig)
	}
	return ProcResponse{}
}

// ring keeps the last max bytes written and the absolute offset of the
// first one it keeps.
type ring struct {
	mu    sync.Mutex
	max   int
	buf   []byte
	start int64
}

func newRing(max int) *ring { return &ring{max: max} }

func (r *ring) write(p []byte) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(p) >= r.max {
		r.start += int64(len(r.buf) + len(p) - r.max)
		r.buf = append(r.buf[:0], p[len(p)-r.max:]...)
		return
	}
	if over := len(r.buf) + len(p) - r.max; over > 0 {
		n := copy(r.buf, r.buf[over:])
		r.buf = r.buf[:n]
		r.start += int64(over)
	}
	r.buf = append(r.buf, p...)
}

// read returns up to n bytes from offset (or from the first byte kept,
// when offset is older), where they start, the offset after them, and the
// end of the output so far.
func (r *ring) read(offset int64, n int) (data []byte, from, next, end int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	end = r.start + int64(len(r.buf))
	from = min(max(offset, r.start), end)
	i := int(from - r.start)
	j := min(len(r.buf), i+n)
	data = append([]byte(nil), r.buf[i:j]...)
	return data, from, from + int64(len(data)), end
}
