package initproc

import (
	"bufio"
	"bytes"
	"crypto/rand"
	_ "embed"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/runtime/exitstatus"
)

// CodeSocket is the name of the code server's socket in the run directory.
const CodeSocket = "code.sock"

// MaxCodeOutput bounds each of stdout and stderr kept for one snippet.
const MaxCodeOutput = 4 << 20

//go:embed code_driver.py
var pythonDriver string

// CodeRequest is one snippet sent to the code server: one JSON object per
// connection, answered by one CodeResponse.
type CodeRequest struct {
	// Op is an operation on the code contexts instead of a snippet.
	Op       torpor.CodeOp `json:"op,omitempty"`
	Language string        `json:"language"`
	Code     string        `json:"code"`
	// TimeoutMS kills the interpreter when the snippet runs longer (0: no
	// limit but the connection's: closing it interrupts the snippet).
	TimeoutMS int64 `json:"timeout_ms,omitempty"`
	// Context names the interpreter ("": the language's default one).
	Context string `json:"context,omitempty"`
	// Env is set for this snippet only.
	Env map[string]string `json:"env,omitempty"`
	// Cwd is where an interpreter this request starts starts.
	Cwd string `json:"cwd,omitempty"`
	// Proc, when set, is a process-table operation instead of a snippet.
	Proc *ProcRequest `json:"proc,omitempty"`
}

// NewCodeRequest is the code server's form of a run_code request.
func NewCodeRequest(req torpor.CodeRequest) CodeRequest {
	return CodeRequest{Op: req.Op, Language: req.Language, Code: req.Code, TimeoutMS: req.Timeout.Milliseconds(),
		Context: req.Context, Env: req.Env, Cwd: req.Cwd}
}

// CodeResponse is the code server's answer.
type CodeResponse struct {
	torpor.CodeResult
	// Missing names the interpreter that is not installed.
	Missing string `json:"missing,omitempty"`
	// Fail says why the snippet could not be run at all.
	Fail string `json:"fail,omitempty"`
	// Refused is a request the code server turned down: an unknown
	// context, a context that exists, a working directory that does not.
	Refused *Refusal `json:"refused,omitempty"`
	// Proc answers a process-table operation.
	Proc *ProcResponse `json:"proc,omitempty"`
}

// Refusal is why the code server turned a request down.
type Refusal struct {
	Code    torpor.ErrorCode `json:"code"`
	Param   string           `json:"param,omitempty"`
	Message string           `json:"message"`
}

// RefusedError is the error a refused request is, or nil. The sandbox
// wrote the refusal: only the kinds of error a request can be refused
// with pass, and its text is cleaned.
func (r *CodeResponse) RefusedError() error {
	if r.Refused == nil {
		return nil
	}
	code := r.Refused.Code
	switch code {
	case torpor.EInvalid, torpor.ENotFound, torpor.EConflict:
	default:
		code = torpor.EInvalid
	}
	return &torpor.Error{Code: code, Param: SandboxText(r.Refused.Param, 32), Message: SandboxText(r.Refused.Message, 512)}
}

func refuse(code torpor.ErrorCode, param, format string, args ...any) CodeResponse {
	return CodeResponse{Refused: &Refusal{Code: code, Param: param, Message: fmt.Sprintf(format, args...)}}
}

// codeServerMain is `torpor init code-server -socket PATH`: it starts the
// code server in the background (its own session, stdio on /dev/null) and
// returns once it listens, or at once when one already answers on PATH.
// With -foreground it is the server. The background server is this binary
// started again: by the command that -self gives, word by word, when the
// binary runs through an ELF interpreter (package runc runs a dynamically
// linked torpor so, and /proc/self/exe is then the interpreter), else by
// its own path.
func codeServerMain(args []string) int {
	fs := flag.NewFlagSet("torpor init code-server", flag.ContinueOnError)
	sock := fs.String("socket", filepath.Join(DefaultRunDir, CodeSocket), "unix socket to listen on")
	fg := fs.Bool("foreground", false, "serve in this process")
	setid := fs.Bool("setid-caps", false, "this process was given CAP_SETUID, CAP_SETGID and CAP_SETPCAP beyond the sandbox's own: drop them from the bounding set (keeping the first two to switch users), and run execs")
	var self stringList
	fs.Var(&self, "self", "a word of the command that runs this binary (repeatable; default: the binary's own path)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *fg {
		ready := os.NewFile(3, "ready")
		l, err := listenCode(*sock)
		if err != nil {
			fmt.Fprintf(ready, "%v", err)
			ready.Close()
			return 1
		}
		ready.Close()
		s := newCodeServer()
		if *setid {
			// What the server starts as root then has the sandbox's own
			// capabilities, as a command runc exec starts has; a server
			// that cannot make it so runs no execs (they go through runc
			// exec).
			s.execs = dropSetidBounding() == nil
		}
		s.serve(l)
		return 0
	}
	if c, err := net.Dial("unix", *sock); err == nil {
		c.Close()
		return 0
	}
	return startCodeServer(*sock, self, *setid)
}

func startCodeServer(sock string, self []string, setid bool) int {
	if len(self) == 0 {
		exe, err := os.Executable()
		if err != nil {
			exe = "/proc/self/exe"
		}
		self = []string{exe}
	}
	devnull, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		fmt.Fprintf(os.Stderr, "torpor code-server: %v\n", err)
		return 1
	}
	defer devnull.Close()
	r, w, err := os.Pipe()
	if err != nil {
		fmt.Fprintf(os.Stderr, "torpor code-server: %v\n", err)
		return 1
	}
	argv := append(slices.Clip(self), "init", "code-server", "-foreground", "-socket", sock)
	if setid {
		argv = append(argv, "-setid-caps")
	}
	p, err := os.StartProcess(self[0], argv, &os.ProcAttr{
		Env:   os.Environ(),
		Files: []*os.File{devnull, devnull, devnull, w},
		Sys:   &syscall.SysProcAttr{Setsid: true},
	})
	w.Close()
	if err != nil {
		r.Close()
		fmt.Fprintf(os.Stderr, "torpor code-server: start: %v\n", err)
		return 1
	}
	_ = p.Release()
	msg, _ := io.ReadAll(io.LimitReader(r, 4096))
	r.Close()
	if len(msg) > 0 {
		fmt.Fprintf(os.Stderr, "torpor code-server: %s\n", msg)
		return 1
	}
	return 0
}

// listenCode listens on sock, replacing a stale socket file.
func listenCode(sock string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(sock), 0o755); err != nil {
		return nil, err
	}
	if fi, err := os.Lstat(sock); err == nil {
		if fi.Mode()&os.ModeSocket == 0 {
			return nil, fmt.Errorf("%s exists and is not a socket", sock)
		}
		_ = os.Remove(sock)
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		return nil, err
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	_ = os.Chmod(sock, 0o600)
	return l, nil
}

// codeServer keeps the code contexts: one interpreter each, running one
// snippet at a time. A language's default context (the one run_code
// uses when it names none) is made on first use.
type codeServer struct {
	mu   sync.Mutex
	ctxs map[string]*codeContext // by id; a default one by its language
	// python is the interpreter command, found on PATH when empty.
	python string
	// procs are the background processes.
	procs *procTable
	// execs: the server runs ProcExec (it answers it not found otherwise,
	// as a server that predates it does).
	execs bool
	// spare is the exec helper started ahead (execserve.go).
	spareMu       sync.Mutex
	spare         *spareHelper
	spareStarting bool
}

// codeContext is one interpreter's context. run serializes its snippets;
// in is read and written under the server's mu.
type codeContext struct {
	run       sync.Mutex
	id        string
	lang      string
	cwd       string
	isDefault bool
	in        *interp
	count     int
}

// interruptGrace is how long an interrupted snippet has to stop before its
// interpreter is killed.
const interruptGrace = 3 * time.Second

func newCodeServer() *codeServer {
	return &codeServer{ctxs: map[string]*codeContext{}, procs: newProcTable()}
}

// killAll ends every interpreter.
func (s *codeServer) killAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.ctxs {
		if c.in != nil {
			c.in.kill()
		}
	}
}

func (s *codeServer) serve(l net.Listener) {
	for {
		c, err := l.Accept()
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond)
			continue
		}
		go s.handle(c)
	}
}

func (s *codeServer) handle(c net.Conn) {
	defer c.Close()
	br := bufio.NewReaderSize(c, 64<<10)
	line, err := br.ReadBytes('\n')
	if err != nil && len(line) == 0 {
		return
	}
	var req CodeRequest
	var res CodeResponse
	if err := json.Unmarshal(line, &req); err != nil {
		res.Fail = "bad request: " + err.Error()
	} else if req.Proc != nil && req.Proc.Op == ProcExec && s.execs {
		s.exec(c, br, *req.Proc) // it answers on c as the command runs
		return
	} else if req.Proc != nil && req.Proc.Op == ProcCodeOutput {
		pr := s.codeOutput(*req.Proc)
		res.Proc = &pr
	} else if req.Proc != nil {
		pr := s.procs.handle(*req.Proc)
		res.Proc = &pr
	} else {
		// The caller gone (it closed the connection) stops the snippet.
		gone := make(chan struct{})
		go func() {
			_, _ = br.ReadByte()
			close(gone)
		}()
		res = s.run(req, gone)
	}
	b, _ := json.Marshal(res)
	_, _ = c.Write(append(b, '\n'))
}

func isLanguage(l string) bool {
	for _, k := range torpor.Languages {
		if l == k {
			return true
		}
	}
	return false
}

// run carries out one request; gone closes when the caller left.
func (s *codeServer) run(req CodeRequest, gone <-chan struct{}) CodeResponse {
	switch req.Op {
	case torpor.CodeList:
		return s.list()
	case torpor.CodeCreate:
		return s.create(req)
	case torpor.CodeRestart, torpor.CodeDelete:
		return s.drop(req)
	case torpor.CodeRun:
		return s.snippet(req, gone)
	}
	return CodeResponse{Fail: fmt.Sprintf("unknown operation %q", req.Op)}
}

// codeOutput answers ProcCodeOutput: what the python snippet running in
// the context named (a language: its default context) wrote so far. It
// never makes a context and never waits.
func (s *codeServer) codeOutput(pr ProcRequest) ProcResponse {
	key := pr.Context
	if key == "" {
		key = torpor.LanguagePython
	}
	s.mu.Lock()
	c := s.ctxs[key]
	var in *interp
	if c != nil && c.lang == torpor.LanguagePython {
		in = c.in
	}
	s.mu.Unlock()
	out := torpor.CodeOutput{}
	if in != nil {
		var runErr bool
		out.Stdout, out.Running = in.out.since(pr.Offset)
		out.Stderr, runErr = in.errs.since(pr.ErrOffset)
		out.Running = out.Running && runErr
	}
	return ProcResponse{Code: &out}
}

// lookup finds the context a request names; a default one is made.
func (s *codeServer) lookup(req CodeRequest) (*codeContext, *CodeResponse) {
	key, lang := req.Context, req.Language
	if key == "" || isLanguage(key) {
		if key != "" {
			if lang != "" && lang != key {
				r := refuse(torpor.EInvalid, "language", "context %q runs %s, not %s", key, key, lang)
				return nil, &r
			}
			lang = key
		}
		if !isLanguage(lang) {
			r := CodeResponse{Fail: fmt.Sprintf("unknown language %q", lang)}
			return nil, &r
		}
		key = lang
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.ctxs[key]
	switch {
	case c == nil && key == lang:
		cwd := req.Cwd
		if fi, err := os.Stat(cwd); cwd != "" && (err != nil || !fi.IsDir()) {
			cwd = "" // a default context starts where it can
		}
		if wd, err := os.Getwd(); cwd == "" && err == nil {
			cwd = wd
		}
		c = &codeContext{id: key, lang: lang, cwd: cwd, isDefault: true}
		s.ctxs[key] = c
	case c == nil:
		r := refuse(torpor.ENotFound, "context", "context %s not found", key)
		return nil, &r
	case lang != "" && c.lang != lang:
		r := refuse(torpor.EInvalid, "language", "context %s runs %s, not %s", key, c.lang, lang)
		return nil, &r
	}
	return c, nil
}

// snippet runs one snippet in its context's interpreter.
func (s *codeServer) snippet(req CodeRequest, gone <-chan struct{}) CodeResponse {
	c, refused := s.lookup(req)
	if refused != nil {
		return *refused
	}
	c.run.Lock()
	defer c.run.Unlock()
	in, fresh, failed := s.ensure(c)
	if failed != nil {
		return *failed
	}
	ctx := torpor.ContextExisting
	if fresh {
		ctx = torpor.ContextNew
	}
	var deadline <-chan time.Time
	if req.TimeoutMS > 0 {
		t := time.NewTimer(time.Duration(req.TimeoutMS) * time.Millisecond)
		defer t.Stop()
		deadline = t.C
	}
	s.mu.Lock()
	c.count++
	count := c.count
	s.mu.Unlock()
	res := in.run(req.Code, req.Env, deadline, gone)
	res.Context = ctx
	res.ExecutionCount = count
	if res.TimedOut || in.exited() {
		in.kill()
		s.mu.Lock()
		if c.in == in {
			c.in = nil
		}
		s.mu.Unlock()
	}
	return res
}

// ensure returns the context's interpreter, starting one when it has
// none (fresh). The caller holds c.run.
func (s *codeServer) ensure(c *codeContext) (in *interp, fresh bool, failed *CodeResponse) {
	s.mu.Lock()
	in = c.in
	s.mu.Unlock()
	if in != nil && !in.exited() {
		return in, false, nil
	}
	in, err := s.start(c.lang, c.cwd)
	if err != nil {
		var miss missingError
		r := CodeResponse{Fail: err.Error()}
		if errors.As(err, &miss) {
			r = CodeResponse{Missing: string(miss)}
		}
		return nil, false, &r
	}
	s.mu.Lock()
	c.in, c.count = in, 0
	s.mu.Unlock()
	return in, true, nil
}

// create makes a context and starts its interpreter.
func (s *codeServer) create(req CodeRequest) CodeResponse {
	if !isLanguage(req.Language) {
		return CodeResponse{Fail: fmt.Sprintf("unknown language %q", req.Language)}
	}
	if req.Context == "" || isLanguage(req.Context) {
		return refuse(torpor.EInvalid, "context", "a new context needs an id of its own")
	}
	cwd := req.Cwd
	if cwd != "" {
		if fi, err := os.Stat(cwd); err != nil || !fi.IsDir() {
			return refuse(torpor.EInvalid, "cwd", "%s is not a directory in the sandbox", cwd)
		}
	} else if wd, err := os.Getwd(); err == nil {
		cwd = wd
	}
	c := &codeContext{id: req.Context, lang: req.Language, cwd: cwd}
	s.mu.Lock()
	if s.ctxs[c.id] != nil {
		s.mu.Unlock()
		return refuse(torpor.EConflict, "context", "context %s exists", c.id)
	}
	s.ctxs[c.id] = c
	s.mu.Unlock()
	c.run.Lock()
	defer c.run.Unlock()
	if _, _, failed := s.ensure(c); failed != nil {
		s.mu.Lock()
		delete(s.ctxs, c.id)
		s.mu.Unlock()
		return *failed
	}
	return CodeResponse{CodeResult: torpor.CodeResult{Context: torpor.ContextNew, Contexts: []torpor.CodeContext{s.describe(c)}}}
}

// drop restarts or deletes a context: its interpreter is killed at once
// (a snippet it runs ends with InterpreterExited).
func (s *codeServer) drop(req CodeRequest) CodeResponse {
	s.mu.Lock()
	c := s.ctxs[req.Context]
	if c == nil {
		s.mu.Unlock()
		if isLanguage(req.Context) {
			return CodeResponse{} // a default context not started yet
		}
		return refuse(torpor.ENotFound, "context", "context %s not found", req.Context)
	}
	in := c.in
	c.in, c.count = nil, 0
	if req.Op == torpor.CodeDelete {
		delete(s.ctxs, c.id)
	}
	s.mu.Unlock()
	if in != nil {
		in.kill()
	}
	return CodeResponse{}
}

// list describes every context, defaults first, then by id.
func (s *codeServer) list() CodeResponse {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]torpor.CodeContext, 0, len(s.ctxs))
	for _, c := range s.ctxs {
		out = append(out, s.describeLocked(c))
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Default != out[j].Default {
			return out[i].Default
		}
		return out[i].ID < out[j].ID
	})
	return CodeResponse{CodeResult: torpor.CodeResult{Contexts: out}}
}

func (s *codeServer) describe(c *codeContext) torpor.CodeContext {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.describeLocked(c)
}

func (s *codeServer) describeLocked(c *codeContext) torpor.CodeContext {
	return torpor.CodeContext{ID: c.id, Language: c.lang, Cwd: c.cwd, Default: c.isDefault, Running: c.in != nil && !c.in.exited()}
}

type missingError string

func (m missingError) Error() string { return string(m) + " is not installed" }

func (s *codeServer) start(lang, cwd string) (*interp, error) {
	switch lang {
	case torpor.LanguagePython:
		py := s.python
		if py == "" {
			p, err := exec.LookPath("python3")
			if err != nil {
				return nil, missingError("python3")
			}
			py = p
		}
		return startInterp(lang, []string{py, "-u", "-c", pythonDriver}, true, cwd)
	case torpor.LanguageBash:
		bash, err := exec.LookPath("bash")
		if err != nil {
			return nil, missingError("bash")
		}
		return startInterp(lang, []string{bash, "--noprofile", "--norc"}, false, cwd)
	default:
		sh := "/bin/sh"
		if _, err := os.Stat(sh); err != nil {
			return nil, missingError(sh)
		}
		return startInterp(lang, []string{sh}, false, cwd)
	}
}

// interp is one running interpreter.
type interp struct {
	lang    string
	pid     int
	stdin   *os.File
	proto   *bufio.Reader // python: answers on fd 3
	out     *codeOutput
	errs    *codeOutput
	done    chan struct{}
	status  syscall.WaitStatus
	scratch string // sh: where snippets are written
}

func startInterp(lang string, argv []string, proto bool, cwd string) (*interp, error) {
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer inR.Close()
	outR, outW, err := os.Pipe()
	if err != nil {
		inW.Close()
		return nil, err
	}
	defer outW.Close()
	errR, errW, err := os.Pipe()
	if err != nil {
		inW.Close()
		outR.Close()
		return nil, err
	}
	defer errW.Close()
	files := []*os.File{inR, outW, errW}
	var protoR *os.File
	if proto {
		var protoW *os.File
		if protoR, protoW, err = os.Pipe(); err != nil {
			inW.Close()
			outR.Close()
			errR.Close()
			return nil, err
		}
		defer protoW.Close()
		files = append(files, protoW)
	}
	in := &interp{lang: lang, stdin: inW, out: newCodeOutput(), errs: newCodeOutput(), done: make(chan struct{})}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, errW
	cmd.Dir = cwd
	if proto {
		cmd.ExtraFiles = []*os.File{files[3]}
		in.proto = bufio.NewReaderSize(protoR, 64<<10)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		inW.Close()
		outR.Close()
		errR.Close()
		if protoR != nil {
			protoR.Close()
		}
		return nil, err
	}
	in.pid = cmd.Process.Pid
	go in.out.pump(outR)
	go in.errs.pump(errR)
	go func() {
		_ = cmd.Wait()
		if ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus); ok {
			in.status = ws
		}
		close(in.done)
		if protoR != nil {
			protoR.Close()
		}
	}()
	if !proto {
		dir, err := os.MkdirTemp("", "torpor-code-")
		if err != nil {
			in.kill()
			return nil, err
		}
		in.scratch = dir
	}
	return in, nil
}

func (in *interp) exited() bool {
	select {
	case <-in.done:
		return true
	default:
		return false
	}
}

// kill ends the interpreter and everything it started in its group.
func (in *interp) kill() {
	_ = syscall.Kill(-in.pid, syscall.SIGKILL)
	_ = syscall.Kill(in.pid, syscall.SIGKILL)
	select {
	case <-in.done:
	case <-time.After(2 * time.Second):
	}
	in.stdin.Close()
	if in.scratch != "" {
		_ = os.RemoveAll(in.scratch)
	}
}

func (in *interp) run(code string, env map[string]string, deadline <-chan time.Time, gone <-chan struct{}) CodeResponse {
	in.out.reset()
	in.errs.reset()
	if in.lang == torpor.LanguagePython {
		return in.runPython(code, env, deadline, gone)
	}
	return in.runShell(code, env, deadline, gone)
}

func (in *interp) runPython(code string, env map[string]string, deadline <-chan time.Time, gone <-chan struct{}) CodeResponse {
	// The driver writes mark to its stdout and stderr after the snippet,
	// so output that subprocesses wrote there is known to be complete.
	mark := fmt.Sprintf("\x00torpor-end-%d\x00", time.Now().UnixNano())
	b, _ := json.Marshal(map[string]any{"code": code, "mark": mark, "env": env})
	if _, err := in.stdin.Write(append(b, '\n')); err != nil {
		return in.ended()
	}
	type answer struct {
		line []byte
		err  error
	}
	ch := make(chan answer, 1)
	go func() {
		l, err := in.proto.ReadBytes('\n')
		ch <- answer{l, err}
	}()
	answered := func(line []byte, err error) CodeResponse {
		if err != nil {
			<-in.done
			return in.ended()
		}
		var res CodeResponse
		if err := json.Unmarshal(line, &res.CodeResult); err != nil {
			return CodeResponse{Fail: "the python driver answered badly: " + err.Error()}
		}
		// Output written straight to the descriptors (subprocesses), up to
		// the driver's mark.
		out, errs := in.out.awaitMark(mark, time.Second), in.errs.awaitMark(mark, time.Second)
		res.Stdout = clipOutput(res.Stdout + out)
		res.Stderr = clipOutput(res.Stderr + errs)
		return res
	}
	select {
	case a := <-ch:
		return answered(a.line, a.err)
	case <-deadline:
		return in.timedOut()
	case <-gone:
		// Like a notebook's interrupt: KeyboardInterrupt in the snippet
		// keeps the interpreter and its state, unless it does not stop.
		_ = syscall.Kill(-in.pid, syscall.SIGINT)
		select {
		case a := <-ch:
			return answered(a.line, a.err)
		case <-time.After(interruptGrace):
			return in.timedOut()
		}
	}
}

func clipOutput(s string) string {
	if len(s) > MaxCodeOutput {
		return s[:MaxCodeOutput]
	}
	return s
}

// ended is the result of a snippet that ended its interpreter.
func (in *interp) ended() CodeResponse {
	select {
	case <-in.done:
	case <-time.After(time.Second):
	}
	code := exitstatus.Code(in.status)
	res := CodeResponse{CodeResult: torpor.CodeResult{Stdout: in.out.take(), Stderr: in.errs.take(), ExitCode: &code}}
	if in.lang == torpor.LanguagePython {
		res.Error = &torpor.CodeError{Name: "InterpreterExited",
			Value: fmt.Sprintf("the python interpreter exited with status %d; the next snippet starts a new one", code)}
	}
	return res
}

func (in *interp) timedOut() CodeResponse {
	in.kill()
	res := CodeResponse{CodeResult: torpor.CodeResult{Stdout: in.out.take(), Stderr: in.errs.take(), TimedOut: true}}
	res.Error = &torpor.CodeError{Name: "TimeoutError",
		Value: "the snippet ran past its timeout; its interpreter was killed and the next snippet starts a new one"}
	if in.lang == torpor.LanguageShell {
		code := 128 + int(syscall.SIGKILL)
		res.ExitCode = &code
	}
	return res
}

func (in *interp) runShell(code string, env map[string]string, deadline <-chan time.Time, gone <-chan struct{}) CodeResponse {
	var rnd [12]byte
	_, _ = rand.Read(rnd[:])
	marker := "__torpor_" + hex.EncodeToString(rnd[:])
	if err := os.MkdirAll(in.scratch, 0o700); err != nil {
		return CodeResponse{Fail: err.Error()}
	}
	file := filepath.Join(in.scratch, "snippet.sh")
	if err := os.WriteFile(file, []byte(code+"\n"), 0o600); err != nil {
		return CodeResponse{Fail: err.Error()}
	}
	// `command .` keeps a syntax error from ending the shell; stdin is
	// /dev/null so that the snippet cannot eat the commands that follow.
	set, unset := shellEnv(env)
	cmd := fmt.Sprintf("%scommand . %s </dev/null\n__torpor_rc=$?\n%sprintf '\\n%s %%d\\n' \"$__torpor_rc\"; unset __torpor_rc\nprintf '\\n%s\\n' >&2\n",
		set, shQuote(file), unset, marker, marker)
	if _, err := in.stdin.Write([]byte(cmd)); err != nil {
		return in.ended()
	}
	outMark := []byte("\n" + marker + " ")
	errMark := []byte("\n" + marker + "\n")
	for {
		_, okOut := in.out.peek(outMark)
		if _, okErr := in.errs.peek(errMark); okOut && okErr {
			out, status, _ := in.out.cut(outMark)
			errs, _, _ := in.errs.cut(errMark)
			st, _ := strconv.Atoi(status)
			return CodeResponse{CodeResult: torpor.CodeResult{Stdout: out, Stderr: errs, ExitCode: &st}}
		}
		select {
		case <-in.out.changed:
		case <-in.errs.changed:
		case <-in.done:
			// Drain what the pumps still hold, then report.
			time.Sleep(settleGrace)
			return in.ended()
		case <-deadline:
			return in.timedOut()
		case <-gone:
			return in.timedOut()
		}
	}
}

// shellEnv returns the commands that set env for one snippet and those
// that put back what the variables were (names are checked identifiers).
func shellEnv(env map[string]string) (set, unset string) {
	keys := make([]string, 0, len(env))
	for k := range env {
		if envName.MatchString(k) {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	var a, b strings.Builder
	for i, k := range keys {
		fmt.Fprintf(&a, "__torpor_s%d=${%s+x} __torpor_v%d=${%s-}; export %s=%s\n", i, k, i, k, k, shQuote(env[k]))
		fmt.Fprintf(&b, "if [ -n \"$__torpor_s%d\" ]; then %s=$__torpor_v%d; else unset %s; fi; unset __torpor_s%d __torpor_v%d\n", i, k, i, k, i, i)
	}
	return a.String(), b.String()
}

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

func shQuote(s string) string {
	return "'" + string(bytes.ReplaceAll([]byte(s), []byte("'"), []byte(`'\''`))) + "'"
}

// codeOutput collects an interpreter's output stream: the first
// MaxCodeOutput bytes of a snippet, and always the last bytes (where the
// end marker is).
type codeOutput struct {
	mu      sync.Mutex
	buf     []byte
	tail    []byte
	dropped bool
	// live: a snippet runs (see since).
	live    bool
	changed chan struct{}
}

const codeTail = 256

func newCodeOutput() *codeOutput { return &codeOutput{changed: make(chan struct{}, 1)} }

func (o *codeOutput) pump(r *os.File) {
	defer r.Close()
	b := make([]byte, 32<<10)
	for {
		n, err := r.Read(b)
		if n > 0 {
			o.write(b[:n])
		}
		if err != nil {
			return
		}
	}
}

func (o *codeOutput) write(p []byte) {
	o.mu.Lock()
	if room := MaxCodeOutput - len(o.buf); room > 0 {
		o.buf = append(o.buf, p[:min(room, len(p))]...)
	}
	if len(o.buf) >= MaxCodeOutput {
		o.dropped = true
	}
	o.tail = append(o.tail, p...)
	if len(o.tail) > codeTail {
		o.tail = append(o.tail[:0], o.tail[len(o.tail)-codeTail:]...)
	}
	o.mu.Unlock()
	select {
	case o.changed <- struct{}{}:
	default:
	}
}

func (o *codeOutput) reset() {
	o.mu.Lock()
	o.buf, o.tail, o.dropped = o.buf[:0], o.tail[:0], false
	o.live = true
	o.mu.Unlock()
}

// endMark begins the mark the python driver writes after a snippet.
var endMark = []byte("\x00torpor-end-")

// since returns what the running snippet wrote from byte off on, up to
// its end mark, holding back a NUL that may begin one; running is false
// when no snippet runs (reset began one; take and cut end it).
func (o *codeOutput) since(off int64) (s string, running bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.live || o.dropped || off < 0 || off > int64(len(o.buf)) {
		return "", o.live
	}
	b := o.buf[off:]
	if i := bytes.Index(b, endMark); i >= 0 {
		b = b[:i]
	} else if i := bytes.LastIndexByte(b, 0); i >= 0 && len(b)-i < len(endMark) {
		b = b[:i]
	}
	return string(b), true
}

// awaitMark waits (at most limit) until mark has come through, then takes
// everything before it.
func (o *codeOutput) awaitMark(mark string, limit time.Duration) string {
	deadline := time.After(limit)
wait:
	for {
		o.mu.Lock()
		seen := bytes.Contains(o.tail, []byte(mark))
		o.mu.Unlock()
		if seen {
			break
		}
		select {
		case <-o.changed:
		case <-deadline:
			break wait
		}
	}
	s := o.take()
	if i := strings.LastIndex(s, mark); i >= 0 {
		s = s[:i] + s[i+len(mark):]
	}
	return s
}

func (o *codeOutput) take() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	s := string(o.buf)
	o.buf, o.tail, o.dropped, o.live = o.buf[:0], o.tail[:0], false, false
	return s
}

// peek finds the line that starts with mark; it returns what follows mark
// up to the end of that line.
func (o *codeOutput) peek(mark []byte) (string, bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	_, rest, ok := o.find(mark)
	return rest, ok
}

// cut returns the output before the line that starts with mark and what
// follows mark on that line, and clears the buffer.
func (o *codeOutput) cut(mark []byte) (before, rest string, ok bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	i, rest, ok := o.find(mark)
	if !ok {
		return "", "", false
	}
	if o.dropped {
		before = string(o.buf)
	} else {
		before = string(o.buf[:i])
	}
	o.buf, o.tail, o.dropped, o.live = o.buf[:0], o.tail[:0], false, false
	return before, rest, true
}

func (o *codeOutput) find(mark []byte) (int, string, bool) {
	src := o.buf
	if o.dropped {
		src = o.tail
	}
	i := bytes.LastIndex(src, mark)
	if i < 0 {
		return 0, "", false
	}
	j := bytes.IndexByte(src[i+len(mark)-1:], '\n')
	if mark[len(mark)-1] == '\n' {
		return i, "", true
	}
	if j < 0 {
		return 0, "", false
	}
	return i, string(src[i+len(mark) : i+len(mark)-1+j]), true
}
