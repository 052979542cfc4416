package initproc

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/torpor-dev/torpor/runtime/exitstatus"
)

// ProcExec runs one command to its end on the connection that asked for
// it, as `runc exec` of the exec helper would: ProcRequest.Cmd is the
// helper's command line (`torpor init exec -result-fd 3 ... -- cmd`),
// which the code server starts as ProcRequest.User, with ProcRequest.Data
// as its stdin (NoStdin: /dev/null). The command's output comes back as it
// is written, in ExecFrames, then its end. The caller leaving (closing the
// connection) stops the command, as runc exec forwarding SIGTERM does. It
// is not a background process: it is in no process table.
const ProcExec = "exec"

// execFrameData bounds the output one ExecFrame carries.
const execFrameData = 32 << 10

// ExecFrame is one line of the code server's answer to a ProcExec.
type ExecFrame struct {
	// Proc is a refusal: an older code server, which has no ProcExec,
	// answers NotFound.
	Proc   *ProcResponse `json:"proc,omitempty"`
	Stdout []byte        `json:"out,omitempty"`
	Stderr []byte        `json:"err,omitempty"`
	// End: the helper's run is over. Report is what it wrote to its
	// result descriptor (an ExecResult), Status its exit status: the
	// report's exit code, which it exits with, when it wrote one (the end
	// then does not wait for its exit).
	End    bool   `json:"end,omitempty"`
	Status int    `json:"status,omitempty"`
	Report []byte `json:"report,omitempty"`
}

// exec answers a ProcExec on c, whose request line br has read.
func (s *codeServer) exec(c net.Conn, br *bufio.Reader, req ProcRequest) {
	var sendMu sync.Mutex
	send := func(f ExecFrame) error {
		b, _ := json.Marshal(f)
		sendMu.Lock()
		defer sendMu.Unlock()
		_, err := c.Write(append(b, '\n'))
		return err
	}
	refuse := func(r ProcResponse) { _ = send(ExecFrame{Proc: &r}) }
	if len(req.Cmd) == 0 || req.Cmd[0] == "" {
		refuse(ProcResponse{Invalid: "a command is required"})
		return
	}
	var cred *syscall.Credential
	if req.User != "" {
		u, err := lookupUser(req.User)
		if err != nil {
			refuse(ProcResponse{Invalid: err.Error(), Param: "user"})
			return
		}
		if u.uid != uint32(os.Geteuid()) || u.gid != uint32(os.Getegid()) {
			cred = &syscall.Credential{Uid: u.uid, Gid: u.gid, Groups: u.groups}
		}
	}
	p, sp, parent, refusal := s.startHelper(req, cred)
	if refusal != nil {
		refuse(*refusal)
		return
	}
	stdinW, outR, errR, resR := parent[0], parent[1], parent[2], parent[3]

	// finished is closed once the helper's run is over: it has reported
	// (or exited); a signal then would reach a helper on its way out.
	finished := make(chan struct{})
	var stopped atomic.Bool // a helper asked to stop takes no next run
	stop := sync.OnceFunc(func() {
		select {
		case <-finished:
		default:
			stopped.Store(true)
			_ = p.Signal(syscall.SIGTERM) // the helper kills the command's tree
		}
	})
	go func() {
		_, _ = br.ReadByte() // the caller sends nothing more: this is its leaving
		stop()
		if stdinW != nil {
			stdinW.Close() // unblocks a write to a command that does not read
		}
	}()
	if stdinW != nil {
		go func() {
			_, _ = stdinW.Write(req.Data)
			stdinW.Close()
		}()
	}
	var pumps sync.WaitGroup
	pump := func(r *os.File, stderr bool) {
		defer pumps.Done()
		defer r.Close()
		b := make([]byte, execFrameData)
		broken := false
		for {
			n, err := r.Read(b)
			if n > 0 && !broken {
				f := ExecFrame{Stdout: b[:n]}
				if stderr {
					f = ExecFrame{Stderr: b[:n]}
				}
				if send(f) != nil {
					broken = true // keep reading, so that the helper never blocks
					stop()
				}
			}
			if err != nil {
				return
			}
		}
	}
	pumps.Add(2)
	go pump(outR, false)
	go pump(errR, true)
	report := make(chan []byte, 1)
	go func() {
		b, _ := io.ReadAll(io.LimitReader(resR, MaxReportSize))
		resR.Close()
		report <- b
	}()

	// The helper writes its report last, after its own streams are
	// closed (see execMain), and exits with the report's exit code: the
	// report ends the exec, without waiting for the helper's exit (a Go
	// process's exit takes a millisecond or two), which is reaped
	// meanwhile. A helper that ends without a report says how it ended by
	// its exit status.
	rep := <-report
	status, reported := reportedStatus(rep)
	switch {
	case sp != nil:
		// A helper that serves runs is reaped by its own watcher.
		if !reported {
			<-sp.exited
			status = sp.status
		}
	case !reported:
		status = waitStatus(p)
	default:
		go func() { _, _ = p.Wait() }()
	}
	close(finished)
	if sp != nil {
		s.putBack(sp, reported && !stopped.Load())
	}
	// The helper's streams are its own (the command writes to pipes the
	// helper pumps), so they end with it; outputSettle bounds the wait for
	// one that some process it passed them to holds open.
	pumped := make(chan struct{})
	go func() {
		pumps.Wait()
		close(pumped)
	}()
	select {
	case <-pumped:
	case <-time.After(outputSettle):
	}
	_ = send(ExecFrame{End: true, Status: status, Report: rep})
}

// reportedStatus is the exit code in a helper's report, which is also the
// helper's exit status; ok is false when rep is not a report.
func reportedStatus(rep []byte) (status int, ok bool) {
	var res ExecResult
	if len(rep) == 0 || json.Unmarshal(rep, &res) != nil {
		return 0, false
	}
	return res.ExitCode, true
}

// waitStatus waits for p to exit and returns its exit status (that of a
// SIGKILL when it cannot be had).
func waitStatus(p *os.Process) int {
	state, err := p.Wait()
	if err == nil {
		if ws, ok := state.Sys().(syscall.WaitStatus); ok {
			return exitstatus.Code(ws)
		}
	}
	return 128 + int(syscall.SIGKILL)
}

// startHelper starts the helper of a ProcExec as cred (nil: as this
// process): the spare one, started ahead for its command line, when it
// runs as this process with no stdin (sp is then that helper, which the
// caller puts back, see putBack), else a new one. It returns the helper
// and the ends of its descriptors that the server keeps (execFiles).
func (s *codeServer) startHelper(req ProcRequest, cred *syscall.Credential) (*os.Process, *spareHelper, [4]*os.File, *ProcResponse) {
	files, parent, err := execFiles(req)
	if err != nil {
		return nil, nil, parent, &ProcResponse{Conflict: err.Error()}
	}
	defer closeAll(files[:])
	if prefix, rest, ok := splitHelperArgs(req.Cmd); ok && cred == nil && req.NoStdin {
		b, _ := json.Marshal(rest)
		if len(b) <= maxServedRequest {
			if sp := s.takeSpare(prefix); sp != nil {
				if sp.run(b, files[1:]) == nil {
					return sp.p, sp, parent, nil
				}
				// It died waiting (killed in the sandbox): nothing ran.
				sp.end()
			}
			// The next exec finds one ready: a helper's own start (a Go
			// binary's) is most of what an exec without one costs.
			go s.startSpare(prefix)
		}
	}
	// The environment and the working directory are the code server's:
	// those runc exec gives (the sandbox's), which the helper then changes
	// as asked.
	p, err := os.StartProcess(req.Cmd[0], req.Cmd, &os.ProcAttr{
		Env: os.Environ(), Files: files[:], Sys: &syscall.SysProcAttr{Credential: cred},
	})
	if err != nil {
		closeAll(parent[:])
		return nil, nil, parent, &ProcResponse{Conflict: "cannot start: " + err.Error()}
	}
	return p, nil, parent, nil
}

// spareHelper is a helper started ahead, as the code server, with stdin on
// /dev/null, that serves runs one after the other (`init exec -serve-fd`,
// see serveExecs): each exec costs it no process start.
type spareHelper struct {
	prefix []string // its command line, up to the socket
	p      *os.Process
	conn   *os.File // the server's end of its socket
	// exited is closed when the helper has exited, with status.
	exited chan struct{}
	status int
}

// run hands the helper a run: the rest of its command line and the run's
// stdout, stderr and result descriptors.
func (sp *spareHelper) run(rest []byte, files []*os.File) error {
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	return syscall.Sendmsg(int(sp.conn.Fd()), rest, syscall.UnixRights(fds...), nil, syscall.MSG_NOSIGNAL)
}

// stays reports whether the helper takes another run: it closes its end
// of the socket before it reports a run after which it leaves.
func (sp *spareHelper) stays() bool {
	select {
	case <-sp.exited:
		return false
	default:
	}
	var b [1]byte
	_, _, err := syscall.Recvfrom(int(sp.conn.Fd()), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
	return err == syscall.EAGAIN
}

// end closes the helper's socket, which ends a helper waiting for a run.
func (sp *spareHelper) end() { sp.conn.Close() }

// splitHelperArgs splits a helper's command line after `init exec
// -result-fd 3`: what a spare helper is started with, and the rest.
func splitHelperArgs(cmd []string) (prefix, rest []string, ok bool) {
	for i := 0; i+4 <= len(cmd); i++ {
		if cmd[i] == "init" && cmd[i+1] == "exec" {
			if i+4 <= len(cmd) && cmd[i+2] == "-result-fd" && cmd[i+3] == "3" {
				return cmd[:i+4], cmd[i+4:], true
			}
			return nil, nil, false
		}
	}
	return nil, nil, false
}

// takeSpare returns the spare helper for prefix, if there is one.
func (s *codeServer) takeSpare(prefix []string) *spareHelper {
	s.spareMu.Lock()
	defer s.spareMu.Unlock()
	sp := s.spare
	if sp == nil || !slices.Equal(sp.prefix, prefix) {
		return nil
	}
	s.spare = nil
	return sp
}

// putBack makes sp, whose run is over, the spare again when it stays for
// another (ok: its run ended normally) and no other took its place; else
// it ends, and a new one is started in its stead.
func (s *codeServer) putBack(sp *spareHelper, ok bool) {
	if ok && sp.stays() {
		s.spareMu.Lock()
		if s.spare == nil && !s.spareStarting {
			s.spare = sp
			s.spareMu.Unlock()
			return
		}
		s.spareMu.Unlock()
		sp.end()
		return
	}
	sp.end()
	go s.startSpare(sp.prefix)
}

// startSpare starts a spare helper for prefix unless there is one (one
// for another command line is replaced).
func (s *codeServer) startSpare(prefix []string) {
	s.spareMu.Lock()
	if s.spareStarting || (s.spare != nil && slices.Equal(s.spare.prefix, prefix)) {
		s.spareMu.Unlock()
		return
	}
	s.spareStarting = true
	old := s.spare
	s.spare = nil
	s.spareMu.Unlock()
	if old != nil {
		old.end()
	}
	sp := startSpareHelper(prefix)
	s.spareMu.Lock()
	s.spare, s.spareStarting = sp, false
	s.spareMu.Unlock()
}

func startSpareHelper(prefix []string) *spareHelper {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil
	}
	conn, theirs := os.NewFile(uintptr(fds[0]), "spare"), os.NewFile(uintptr(fds[1]), "spare")
	defer theirs.Close()
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		conn.Close()
		return nil
	}
	defer null.Close()
	argv := append(slices.Clip(prefix), "-serve-fd", "4")
	p, err := os.StartProcess(argv[0], argv, &os.ProcAttr{Env: os.Environ(), Files: []*os.File{null, null, null, null, theirs}})
	if err != nil {
		conn.Close()
		return nil
	}
	sp := &spareHelper{prefix: slices.Clone(prefix), p: p, conn: conn, exited: make(chan struct{})}
	go func() {
		sp.status = waitStatus(p)
		close(sp.exited)
	}()
	return sp
}

// closeAll closes the files that are not nil.
func closeAll(files []*os.File) {
	for _, f := range files {
		if f != nil {
			f.Close()
		}
	}
}

// execFiles makes the helper's descriptors for a ProcExec: stdin (the
// request's data through a pipe, or /dev/null), stdout, stderr, and the
// result descriptor (3). parent holds the ends the code server keeps, in
// the same order (nil for a stdin on /dev/null).
func execFiles(req ProcRequest) (child, parent [4]*os.File, err error) {
	fail := func(err error) ([4]*os.File, [4]*os.File, error) {
		closeAll(append(child[:], parent[:]...))
		return [4]*os.File{}, [4]*os.File{}, err
	}
	if req.NoStdin {
		if child[0], err = os.Open(os.DevNull); err != nil {
			return fail(err)
		}
	} else if child[0], parent[0], err = os.Pipe(); err != nil {
		return fail(err)
	}
	for i := 1; i < 4; i++ {
		if parent[i], child[i], err = os.Pipe(); err != nil {
			return fail(err)
		}
	}
	return child, parent, nil
}
