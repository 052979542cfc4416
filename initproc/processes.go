package initproc

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/runtime/exitstatus"
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
	// maxWait bounds how long one output read waits: well within the
	// host's bound on one operation.
	maxWait = torpor.MaxProcessWait
	// maxSegments bounds the stream boundaries kept per process: output
	// that flips between stdout and stderr more often drops its oldest
	// bytes sooner.
	maxSegments = 1 << 16
)

// Process operations of the code server.
const (
	ProcStart  = "start"
	ProcList   = "list"
	ProcOutput = "output"
	ProcStdin  = "stdin"
	ProcSignal = "signal"
	// ProcCodeOutput reads what the snippet running in a code context
	// wrote so far (code.go), so that it can be streamed.
	ProcCodeOutput = "code_output"
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
	// Start: the user to run as (name or uid[:gid]), the caller's tag,
	// stdin on /dev/null, and a limit on the process's life.
	User    string `json:"user,omitempty"`
	Tag     string `json:"tag,omitempty"`
	NoStdin bool   `json:"no_stdin,omitempty"`
	// Stderr keeps stderr apart (a pipe of its own, its output tagged);
	// otherwise both streams share one pipe, in exactly the order written,
	// and read as stdout.
	Stderr    bool  `json:"stderr,omitempty"`
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// Output: wait up to WaitMS (at most maxWait) for new output or the
	// end when there is none at Offset; Split answers in Chunks, by stream.
	WaitMS int64 `json:"wait_ms,omitempty"`
	Split  bool  `json:"split,omitempty"`
	// Code output: the context, and where in its stdout (Offset) and
	// stderr (ErrOffset) to read from.
	Context   string `json:"context,omitempty"`
	ErrOffset int64  `json:"err_offset,omitempty"`
}

// ProcChunk is a run of output from one stream (in ProcResponse.Chunks).
type ProcChunk struct {
	Stderr bool   `json:"stderr,omitempty"`
	Data   []byte `json:"data"`
}

// ProcResponse is the code server's answer to a ProcRequest. Data is the
// output read (Output.Data is left empty: bytes travel in Data).
type ProcResponse struct {
	Info   *torpor.ProcessInfo   `json:"info,omitempty"`
	List   []torpor.ProcessInfo  `json:"list,omitempty"`
	Output *torpor.ProcessOutput `json:"output,omitempty"`
	Data   []byte                `json:"data,omitempty"`
	// Chunks is the output read by stream, when the read asked (Split).
	Chunks []ProcChunk `json:"chunks,omitempty"`
	// Signal is the signal that ended the process, once its output ended.
	Signal int `json:"signal,omitempty"`
	// Code is what a running snippet wrote so far (ProcCodeOutput).
	Code *torpor.CodeOutput `json:"code,omitempty"`
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
	env     map[string]string
	cwd     string
	user    string
	tag     string
	stdin   *os.File // nil: started without stdin
	out     *ring
	settled chan struct{} // closed once exited and its output read

	mu      sync.Mutex
	exited  bool // reaped: its pid may be reused
	code    int
	sig     int           // the signal that ended it
	changed chan struct{} // closed and replaced when output comes or it ends

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
		return p.output(req)
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
	if req.TimeoutMS < 0 {
		return ProcResponse{Invalid: "the timeout must not be negative", Param: "timeout"}
	}
	var u *procUser
	if req.User != "" {
		var err error
		if u, err = lookupUser(req.User); err != nil {
			return ProcResponse{Invalid: err.Error(), Param: "user"}
		}
	}
	cwd := req.Cwd
	if cwd == "" && u != nil {
		cwd = "/"
		if fi, err := os.Stat(u.home); err == nil && fi.IsDir() {
			cwd = u.home
		}
	}
	if cwd != "" {
		if fi, err := os.Stat(cwd); err != nil || !fi.IsDir() {
			return ProcResponse{Invalid: fmt.Sprintf("%s is not a directory in the sandbox", cwd), Param: "cwd"}
		}
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.procs) >= maxProcesses && !t.dropExited() {
		return ProcResponse{Conflict: fmt.Sprintf("%d processes are running; stop one first", len(t.procs))}
	}
	var pipes []*os.File // every end, closed on failure
	fail := func(err error) ProcResponse {
		for _, f := range pipes {
			f.Close()
		}
		return ProcResponse{Conflict: err.Error()}
	}
	var inR, inW *os.File
	if !req.NoStdin {
		var err error
		if inR, inW, err = os.Pipe(); err != nil {
			return fail(err)
		}
		pipes = append(pipes, inR, inW)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return fail(err)
	}
	pipes = append(pipes, outR, outW)
	errR, errW := outR, outW
	if req.Stderr {
		if errR, errW, err = os.Pipe(); err != nil {
			return fail(err)
		}
		pipes = append(pipes, errR, errW)
	}
	cmd := exec.Command(req.Cmd[0], req.Cmd[1:]...)
	cmd.Env = os.Environ()
	if u != nil {
		cmd.Env = append(cmd.Env, "HOME="+u.home, "USER="+u.name, "LOGNAME="+u.name)
	}
	for k, v := range req.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Dir = cwd
	cmd.Stdout, cmd.Stderr = outW, errW
	if inR != nil {
		cmd.Stdin = inR
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if u != nil && (u.uid != uint32(os.Geteuid()) || u.gid != uint32(os.Getegid())) {
		cmd.SysProcAttr.Credential = &syscall.Credential{Uid: u.uid, Gid: u.gid, Groups: u.groups}
	}
	if err := cmd.Start(); err != nil {
		for _, f := range pipes {
			f.Close()
		}
		var ee *exec.Error
		var pe *os.PathError
		if errors.As(err, &ee) || errors.As(err, &pe) {
			return ProcResponse{Invalid: "cannot start: " + err.Error()}
		}
		return ProcResponse{Conflict: "cannot start: " + err.Error()}
	}
	// The child has its ends now.
	if inR != nil {
		inR.Close()
	}
	outW.Close()
	if req.Stderr {
		errW.Close()
	}
	id := max(t.next, req.MinID)
	t.next = id + 1
	p := &bgProc{id: id, argv: req.Cmd, pid: cmd.Process.Pid, started: time.Now().UTC(),
		env: req.Env, cwd: req.Cwd, user: req.User, tag: req.Tag,
		stdin: inW, out: newRing(MaxProcessOutput), settled: make(chan struct{}), changed: make(chan struct{})}
	if inW == nil {
		p.stdinErr = true
	}
	t.procs[id] = p
	srcs := []struct {
		r      *os.File
		stderr bool
	}{{outR, false}}
	if req.Stderr {
		srcs = append(srcs, struct {
			r      *os.File
			stderr bool
		}{errR, true})
	}
	var pumps sync.WaitGroup
	for _, src := range srcs {
		pumps.Add(1)
		go func() {
			defer pumps.Done()
			defer src.r.Close()
			b := make([]byte, 32<<10)
			for {
				n, err := src.r.Read(b)
				if n > 0 {
					p.out.writeStream(b[:n], src.stderr)
					p.notify()
				}
				if err != nil {
					return
				}
			}
		}()
	}
	pumped := make(chan struct{})
	go func() {
		pumps.Wait()
		close(pumped)
	}()
	var deadline *time.Timer
	if req.TimeoutMS > 0 {
		deadline = time.AfterFunc(time.Duration(req.TimeoutMS)*time.Millisecond, func() { p.signal("KILL") })
	}
	go func() {
		_ = cmd.Wait()
		if deadline != nil {
			deadline.Stop()
		}
		code, sig := -1, 0
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok {
			code = exitstatus.Code(ws)
			if ws.Signaled() {
				sig = int(ws.Signal())
			}
		}
		p.mu.Lock()
		p.exited, p.code, p.sig = true, code, sig
		p.mu.Unlock()
		select {
		case <-pumped:
		case <-time.After(outputSettle):
		}
		close(p.settled)
		p.notify()
	}()
	info := p.info()
	return ProcResponse{Info: &info}
}

// notify wakes the reads waiting for p's output or end.
func (p *bgProc) notify() {
	p.mu.Lock()
	close(p.changed)
	p.changed = make(chan struct{})
	p.mu.Unlock()
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
	if old.stdin != nil {
		old.stdin.Close()
	}
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
	in := torpor.ProcessInfo{ID: p.id, Cmd: p.argv, Pid: p.pid, State: torpor.ProcessRunning, StartedAt: p.started,
		Env: p.env, Cwd: p.cwd, User: p.user, Tag: p.tag}
	if p.exited {
		code := p.code
		in.State, in.ExitCode = torpor.ProcessExited, &code
	}
	return in
}

func (p *bgProc) output(req ProcRequest) ProcResponse {
	if req.Offset < 0 {
		return ProcResponse{Invalid: "offset must not be negative"}
	}
	var timeout <-chan time.Time
	if wait := min(time.Duration(req.WaitMS)*time.Millisecond, maxWait); wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		timeout = t.C
	}
	for {
		// Read whether it ended (and what to wait on) before the data,
		// so that output written before the end is never missed.
		p.mu.Lock()
		changed := p.changed
		p.mu.Unlock()
		settled := false
		select {
		case <-p.settled:
			settled = true
		default:
		}
		p.mu.Lock()
		code, sig := p.code, p.sig
		p.mu.Unlock()
		var res ProcResponse
		var from, next, end int64
		if req.Split {
			res.Chunks, from, next, end = p.out.readChunks(req.Offset, torpor.MaxProcessOutputRead)
		} else {
			res.Data, from, next, end = p.out.read(req.Offset, torpor.MaxProcessOutputRead)
		}
		o := &torpor.ProcessOutput{Offset: from, Next: next}
		if settled && next == end {
			o.Ended, o.ExitCode = true, &code
			res.Signal = sig
		}
		res.Output = o
		if next > from || o.Ended || timeout == nil {
			return res
		}
		select {
		case <-changed:
		case <-timeout:
			return res
		}
	}
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
// first one it keeps, and which of them came from stderr: segs marks
// where each run from one stream starts.
type ring struct {
	mu    sync.Mutex
	max   int
	buf   []byte
	start int64
	segs  []segment
}

// segment is where a run of output from one stream starts.
type segment struct {
	off    int64
	stderr bool
}

func newRing(max int) *ring { return &ring{max: max} }

// write appends stdout output.
func (r *ring) write(p []byte) { r.writeStream(p, false) }

// writeStream appends output from stdout or stderr.
func (r *ring) writeStream(p []byte, stderr bool) {
	if len(p) == 0 {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	end := r.start + int64(len(r.buf))
	if n := len(r.segs); n == 0 || r.segs[n-1].stderr != stderr {
		r.segs = append(r.segs, segment{off: end, stderr: stderr})
	}
	if len(p) >= r.max {
		r.start += int64(len(r.buf) + len(p) - r.max)
		r.buf = append(r.buf[:0], p[len(p)-r.max:]...)
	} else {
		if over := len(r.buf) + len(p) - r.max; over > 0 {
			n := copy(r.buf, r.buf[over:])
			r.buf = r.buf[:n]
			r.start += int64(over)
		}
		r.buf = append(r.buf, p...)
	}
	if len(r.segs) > maxSegments {
		// Drop the bytes of the oldest run.
		drop := int(r.segs[1].off - r.start)
		if drop > 0 {
			n := copy(r.buf, r.buf[drop:])
			r.buf = r.buf[:n]
			r.start += int64(drop)
		}
	}
	r.trim()
}

// trim forgets the runs that start before the first byte kept, but the
// one that holds it.
func (r *ring) trim() {
	i := 0
	for i+1 < len(r.segs) && r.segs[i+1].off <= r.start {
		i++
	}
	if i > 0 {
		r.segs = append(r.segs[:0], r.segs[i:]...)
	}
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

// readChunks is read with the bytes split into runs by stream.
func (r *ring) readChunks(offset int64, n int) (chunks []ProcChunk, from, next, end int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	end = r.start + int64(len(r.buf))
	from = min(max(offset, r.start), end)
	next = min(end, from+int64(n))
	for k, sg := range r.segs {
		lo := max(sg.off, from)
		hi := next
		if k+1 < len(r.segs) {
			hi = min(hi, r.segs[k+1].off)
		}
		if lo >= hi {
			continue
		}
		chunks = append(chunks, ProcChunk{Stderr: sg.stderr,
			Data: append([]byte(nil), r.buf[lo-r.start:hi-r.start]...)})
	}
	return chunks, from, next, end
}

// procUser is a user a process runs as.
type procUser struct {
	name     string
	uid, gid uint32
	groups   []uint32
	home     string
}

// lookupUser finds a user (a name, or uid[:gid]) in this system's
// /etc/passwd, and the groups it is a member of in /etc/group. A numeric
// user need not be listed; its home is then /.
func lookupUser(spec string) (*procUser, error) {
	u := &procUser{name: spec, home: "/"}
	uidS, gidS, numeric := strings.Cut(spec, ":")
	if n, err := strconv.ParseUint(uidS, 10, 32); err == nil && n < 1<<31 {
		u.uid, u.gid = uint32(n), uint32(n)
		if numeric {
			g, err := strconv.ParseUint(gidS, 10, 32)
			if err != nil || g >= 1<<31 {
				return nil, fmt.Errorf("user %q: the group is not a number", spec)
			}
			u.gid = uint32(g)
		}
		numeric = true
	} else if numeric {
		return nil, fmt.Errorf("user %q must be a name or uid[:gid]", spec)
	}
	found := false
	err := scanColonFile("/etc/passwd", func(f []string) bool {
		if len(f) < 6 {
			return true
		}
		uid, err1 := strconv.ParseUint(f[2], 10, 32)
		gid, err2 := strconv.ParseUint(f[3], 10, 32)
		if err1 != nil || err2 != nil {
			return true
		}
		if (!numeric && f[0] == spec) || (numeric && uint32(uid) == u.uid) {
			u.name, u.home, found = f[0], f[5], true
			if !numeric {
				u.uid, u.gid = uint32(uid), uint32(gid)
			} else if !strings.Contains(spec, ":") {
				u.gid = uint32(gid)
			}
			return false
		}
		return true
	})
	switch {
	case !found && !numeric && err != nil:
		return nil, fmt.Errorf("the sandbox has no /etc/passwd to look user %q up in; give uid[:gid]", spec)
	case !found && !numeric:
		return nil, fmt.Errorf("no user %q in the sandbox's /etc/passwd", spec)
	}
	if u.home == "" {
		u.home = "/"
	}
	u.groups = []uint32{u.gid}
	if found {
		_ = scanColonFile("/etc/group", func(f []string) bool {
			if len(f) < 4 {
				return true
			}
			gid, err := strconv.ParseUint(f[2], 10, 32)
			if err != nil || uint32(gid) == u.gid {
				return true
			}
			for _, m := range strings.Split(f[3], ",") {
				if m == u.name {
					u.groups = append(u.groups, uint32(gid))
					break
				}
			}
			return len(u.groups) < 64
		})
	}
	return u, nil
}

// scanColonFile calls fn with the fields of each line of a passwd-style
// file (its first MiB) until fn returns false. Anything but a regular
// file (a FIFO the sandbox put there, which would block the open or the
// read) is as good as none.
func scanColonFile(name string, fn func([]string) bool) error {
	f, err := os.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return fmt.Errorf("%s is not a regular file", name)
	}
	sc := bufio.NewScanner(io.LimitReader(f, 1<<20))
	for sc.Scan() {
		if !fn(strings.Split(sc.Text(), ":")) {
			break
		}
	}
	return nil
}
