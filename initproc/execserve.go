package initproc

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"os"
	"slices"
	"sync"
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
	// End: the helper exited with Status, having written Report (an
	// ExecResult) to its result descriptor.
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
	p, parent, refusal := s.startHelper(req, cred)
	if refusal != nil {
		refuse(*refusal)
		return
	}
	stdinW, outR, errR, resR := parent[0], parent[1], parent[2], parent[3]

	exited := make(chan struct{})
	stop := sync.OnceFunc(func() {
		select {
		case <-exited:
		default:
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

	state, err := p.Wait()
	close(exited)
	status := 128 + int(syscall.SIGKILL)
	if err == nil {
		if ws, ok := state.Sys().(syscall.WaitStatus); ok {
			status = exitstatus.Code(ws)
		}
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
	_ = send(ExecFrame{End: true, Status: status, Report: <-report})
}

// startHelper starts the helper of a ProcExec as cred (nil: as this
// process): the spare one started ahead for its command line when it runs
// as this process with no stdin, else a new one. It returns the helper
// and the ends of its descriptors that the server keeps (execFiles).
func (s *codeServer) startHelper(req ProcRequest, cred *syscall.Credential) (*os.Process, [4]*os.File, *ProcResponse) {
	if prefix, rest, ok := splitHelperArgs(req.Cmd); ok && cred == nil && req.NoStdin {
		sp := s.takeSpare(prefix)
		// The next exec finds one ready: a helper's own start (a Go
		// binary's) is most of what an exec costs.
		go s.startSpare(prefix)
		if sp != nil {
			b, _ := json.Marshal(rest)
			_, err := sp.request.Write(b)
			sp.request.Close()
			if err == nil {
				return sp.p, sp.files, nil
			}
			// It died waiting (killed in the sandbox): nothing ran.
			_ = sp.p.Kill()
			_, _ = sp.p.Wait()
			closeAll(sp.files[:])
		}
	}
	files, parent, err := execFiles(req)
	if err != nil {
		return nil, parent, &ProcResponse{Conflict: err.Error()}
	}
	// The environment and the working directory are the code server's:
	// those runc exec gives (the sandbox's), which the helper then changes
	// as asked.
	p, err := os.StartProcess(req.Cmd[0], req.Cmd, &os.ProcAttr{
		Env: os.Environ(), Files: files[:], Sys: &syscall.SysProcAttr{Credential: cred},
	})
	closeAll(files[:])
	if err != nil {
		closeAll(parent[:])
		return nil, parent, &ProcResponse{Conflict: "cannot start: " + err.Error()}
	}
	return p, parent, nil
}

// spareHelper is a helper started ahead, as the code server, with stdin on
// /dev/null: it waits for the rest of its command line on its request
// pipe.
type spareHelper struct {
	prefix  []string // its command line, up to the request
	p       *os.Process
	request *os.File
	files   [4]*os.File // as execFiles
}

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
		old.request.Close() // it ends, reading no request
		closeAll(old.files[:])
		go func() { _, _ = old.p.Wait() }()
	}
	sp := startSpareHelper(prefix)
	s.spareMu.Lock()
	s.spare, s.spareStarting = sp, false
	s.spareMu.Unlock()
}

func startSpareHelper(prefix []string) *spareHelper {
	files, parent, err := execFiles(ProcRequest{NoStdin: true})
	if err != nil {
		return nil
	}
	reqR, reqW, err := os.Pipe()
	if err != nil {
		closeAll(append(files[:], parent[:]...))
		return nil
	}
	argv := append(slices.Clip(prefix), "-request-fd", "4")
	p, err := os.StartProcess(argv[0], argv, &os.ProcAttr{Env: os.Environ(), Files: append(files[:], reqR)})
	closeAll(append(files[:], reqR))
	if err != nil {
		closeAll(append(parent[:], reqW))
		return nil
	}
	return &spareHelper{prefix: slices.Clone(prefix), p: p, request: reqW, files: parent}
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
