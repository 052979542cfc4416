package agent

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/files"
	"github.com/torpor-dev/torpor/initproc"
	"github.com/torpor-dev/torpor/runtime/exitstatus"
	"github.com/torpor-dev/torpor/runtime/vm/proto"
)

const (
	cgroupRoot = "/sys/fs/cgroup"
	// sandboxCgroup holds every sandbox process; the agent stays outside.
	sandboxCgroup = cgroupRoot + "/sandbox"
	// maxOutputTail bounds the output a failure report carries.
	maxOutputTail = 4 << 10
	// settleGrace is how long output is still collected after a command
	// exited while a background process it left holds its pipe.
	settleGrace = 20 * time.Millisecond
	// killWait bounds the wait for a killed cgroup to empty.
	killWait = 10 * time.Second
)

// sandbox is the part of the guest the user's processes live in.
type sandbox struct {
	reap *reaper

	mu       sync.Mutex
	env      []string
	started  bool
	stopping bool
	result   *proto.Result
	exited   chan struct{}

	execN atomic.Uint64
	// watchdogKills counts processes the memory watchdog killed.
	watchdogKills atomic.Int64
}

func newSandbox(r *reaper) (*sandbox, error) {
	// Controllers for the sandbox's cgroup and its children; a kernel
	// without one of them still runs sandboxes, unbounded in it.
	for _, c := range []string{"+cpu", "+memory", "+pids"} {
		_ = os.WriteFile(cgroupRoot+"/cgroup.subtree_control", []byte(c), 0o644)
	}
	if err := os.Mkdir(sandboxCgroup, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("sandbox cgroup: %w", err)
	}
	for _, c := range []string{"+cpu", "+memory", "+pids"} {
		_ = os.WriteFile(sandboxCgroup+"/cgroup.subtree_control", []byte(c), 0o644)
	}
	return &sandbox{reap: r, exited: make(chan struct{}), env: initproc.SandboxEnv(nil)}, nil
}

// start configures the sandbox, runs the setup commands in order and
// starts the entrypoint. A failed setup ends the sandbox's processes and
// is reported in the result (the host then stops the VM).
func (s *sandbox) start(ctx context.Context, req proto.Start) (*proto.StartResult, error) {
	s.mu.Lock()
	if s.started {
		s.mu.Unlock()
		return nil, torpor.Errorf(torpor.EConflict, "the sandbox was started already")
	}
	s.started = true
	s.env = initproc.SandboxEnv(req.Env)
	s.mu.Unlock()

	if !req.Now.IsZero() {
		tv := unix.NsecToTimeval(req.Now.UnixNano())
		_ = unix.Settimeofday(&tv)
	}
	if req.Hostname != "" {
		if err := unix.Sethostname([]byte(req.Hostname)); err != nil {
			return nil, fmt.Errorf("hostname: %w", err)
		}
	}
	if req.ResolvConf != "" {
		if err := writeResolvConf(req.ResolvConf); err != nil {
			// The sandbox still runs, with its disk's resolver settings:
			// say why on the console.
			fmt.Fprintf(os.Stderr, "torpor-agent: /etc/resolv.conf: %v\n", err)
		}
	}
	if err := mountVolumes(req.Volumes); err != nil {
		return nil, fmt.Errorf("volumes: %w", err)
	}
	if req.MemoryMax > 0 {
		if err := os.WriteFile(sandboxCgroup+"/memory.max", []byte(strconv.FormatInt(req.MemoryMax, 10)), 0o644); err != nil {
			return nil, fmt.Errorf("memory limit: %w", err)
		}
		_ = os.WriteFile(sandboxCgroup+"/memory.swap.max", []byte("0"), 0o644)
		go s.watchMemory(req.MemoryMax)
	}
	if req.PidsMax > 0 {
		_ = os.WriteFile(sandboxCgroup+"/pids.max", []byte(strconv.FormatInt(req.PidsMax, 10)), 0o644)
	}
	if req.CPUQuota > 0 {
		const period = 100000
		_ = os.WriteFile(sandboxCgroup+"/cpu.max", []byte(fmt.Sprintf("%d %d", int64(req.CPUQuota*period), period)), 0o644)
	}

	for i, cmd := range req.Setup {
		if res := s.runSetup(ctx, i, cmd); res != nil {
			s.finish(res, false)
			return &proto.StartResult{Failed: res}, nil
		}
	}
	if len(req.Entrypoint) == 0 {
		return &proto.StartResult{}, nil
	}
	if res := s.startEntrypoint(req.Entrypoint); res != nil {
		s.finish(res, false)
		return &proto.StartResult{Failed: res}, nil
	}
	return &proto.StartResult{}, nil
}

// writeResolvConf writes text to the sandbox's /etc/resolv.conf as a
// regular file of mode 0644, replacing (not following) a symlink there,
// as the runc runtime does on its host.
func writeResolvConf(text string) error {
	root, err := files.OpenRoot("/")
	if err != nil {
		return err
	}
	defer root.Close()
	mode := files.Mode(0o644)
	_, err = root.Write("/etc/resolv.conf", strings.NewReader(text), files.WriteOptions{Mode: &mode})
	return err
}

// child is a command started in a cgroup of its own below the sandbox's.
type child struct {
	pid    int
	status <-chan syscall.WaitStatus
	cgroup string
}

// spawn starts argv in a new cgroup named name below the sandbox's, in a
// process group of its own.
func (s *sandbox) spawn(name string, argv, env []string, dir string, files []*os.File, cred *syscall.Credential) (*child, error) {
	path, err := lookPath(argv[0], env)
	if err != nil {
		return nil, err
	}
	cg := filepath.Join(sandboxCgroup, name)
	if err := os.Mkdir(cg, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	cgfd, err := unix.Open(cg, unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	defer unix.Close(cgfd)
	pid, status, err := s.reap.start(path, argv, &os.ProcAttr{
		Dir:   dir,
		Env:   env,
		Files: files,
		Sys: &syscall.SysProcAttr{
			Setpgid:     true,
			UseCgroupFD: true,
			CgroupFD:    cgfd,
			Credential:  cred,
		},
	})
	if err != nil {
		_ = unix.Rmdir(cg)
		return nil, err
	}
	return &child{pid: pid, status: status, cgroup: cg}, nil
}

// lookPath finds a command in the PATH of env.
func lookPath(file string, env []string) (string, error) {
	if strings.Contains(file, "/") {
		fi, err := os.Stat(file)
		if err != nil {
			return "", err
		}
		if fi.IsDir() || fi.Mode()&0o111 == 0 {
			return "", os.ErrPermission
		}
		return file, nil
	}
	path := initproc.DefaultPath
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "PATH="); ok {
			path = v
		}
	}
	for _, dir := range filepath.SplitList(path) {
		if dir == "" {
			dir = "."
		}
		p := filepath.Join(dir, file)
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
			return p, nil
		}
	}
	return "", exec.ErrNotFound
}

// startErrorCode is the shell's exit code for a command that could not
// start: 127 when it does not exist, 126 otherwise.
func startErrorCode(err error) int {
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
		return 127
	}
	return 126
}

// killCgroup kills every process in cg (and below) and waits until it is
// empty; then removes it unless it is the sandbox's own.
func killCgroup(cg string) {
	_ = os.WriteFile(cg+"/cgroup.kill", []byte("1"), 0o644)
	deadline := time.Now().Add(killWait)
	for populated(cg) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if cg != sandboxCgroup {
		_ = unix.Rmdir(cg)
	}
}

// populated reports whether processes are left in cg or below.
func populated(cg string) bool {
	b, err := os.ReadFile(cg + "/cgroup.events")
	if err != nil {
		return false
	}
	return bytes.Contains(b, []byte("populated 1"))
}

// oomKills counts the sandbox's processes the kernel's OOM killer or the
// memory watchdog took.
func (s *sandbox) oomKills() int64 { return kernelOOMKills() + s.watchdogKills.Load() }

// kernelOOMKills reads how many processes of the sandbox the OOM killer
// took.
func kernelOOMKills() int64 {
	f, err := os.Open(sandboxCgroup + "/memory.events")
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "oom_kill "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// runSetup runs setup command i; nil when it succeeded.
func (s *sandbox) runSetup(ctx context.Context, i int, cmd string) *proto.Result {
	out := &tail{max: maxOutputTail}
	r, w, err := os.Pipe()
	if err != nil {
		return &proto.Result{Kind: torpor.FailureSetup, ExitCode: 126, Message: fmt.Sprintf("setup command %d: %v", i+1, err)}
	}
	devnull, _ := os.Open(os.DevNull)
	c, err := s.spawn(fmt.Sprintf("setup-%d", i), []string{"/bin/sh", "-c", cmd}, s.environ(), "/", []*os.File{devnull, w, w}, nil)
	w.Close()
	devnull.Close()
	if err != nil {
		r.Close()
		return &proto.Result{Kind: torpor.FailureSetup, ExitCode: startErrorCode(err), Message: fmt.Sprintf("setup command %d: %v", i+1, err)}
	}
	copied := make(chan struct{})
	go func() { _, _ = io.Copy(out, r); close(copied) }()
	ws := <-c.status
	settle(copied, r)
	killCgroup(c.cgroup)
	if ws.Exited() && ws.ExitStatus() == 0 {
		return nil
	}
	code := exitstatus.Code(ws)
	msg := fmt.Sprintf("setup command %d (%s) exited with status %d", i+1, clipHead(cmd, 200), code)
	if sig := exitstatus.Signal(ws); sig != "" {
		msg = fmt.Sprintf("setup command %d (%s) was killed by %s", i+1, clipHead(cmd, 200), sig)
	}
	if n := s.oomKills(); n > 0 {
		msg += " (the sandbox ran out of memory)"
	}
	return &proto.Result{Kind: torpor.FailureSetup, ExitCode: code, Signal: exitstatus.Signal(ws), Output: out.String(), Message: msg}
}

// settle waits for a copy to finish, or for a short grace when a
// background process holds the pipe, then closes it.
func settle(copied <-chan struct{}, r *os.File) {
	select {
	case <-copied:
	case <-time.After(settleGrace):
	}
	r.Close()
	<-copied
}

func (s *sandbox) environ() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.env
}

// startEntrypoint starts the entrypoint and a goroutine that waits for it.
func (s *sandbox) startEntrypoint(argv []string) *proto.Result {
	out := &tail{max: maxOutputTail}
	r, w, err := os.Pipe()
	if err != nil {
		return &proto.Result{Kind: torpor.FailureEntrypoint, ExitCode: 126, Message: fmt.Sprintf("start entrypoint: %v", err)}
	}
	devnull, _ := os.Open(os.DevNull)
	c, err := s.spawn("entrypoint", argv, s.environ(), "/", []*os.File{devnull, w, w}, nil)
	w.Close()
	devnull.Close()
	if err != nil {
		r.Close()
		return &proto.Result{Kind: torpor.FailureEntrypoint, ExitCode: startErrorCode(err), Message: fmt.Sprintf("start entrypoint: %v", err)}
	}
	copied := make(chan struct{})
	go func() { _, _ = io.Copy(out, r); close(copied) }()
	go func() {
		ws := <-c.status
		settle(copied, r)
		code := exitstatus.Code(ws)
		msg := fmt.Sprintf("entrypoint exited with status %d", code)
		if sig := exitstatus.Signal(ws); sig != "" {
			msg = "entrypoint was killed by " + sig
		}
		res := &proto.Result{Kind: torpor.FailureEntrypoint, ExitCode: code, Signal: exitstatus.Signal(ws), Output: out.String(), Message: msg}
		if n := s.oomKills(); n > 0 && (code != 0 || res.Signal != "") {
			res.Kind, res.OOMKills = torpor.FailureOOM, n
			res.Message = "the sandbox ran out of memory: " + msg
		}
		s.finish(res, true)
	}()
	return nil
}

// finish records how the sandbox ended and ends its processes. With
// report (the entrypoint ended by itself) it then writes the result to
// the status port and powers off, unless the host is stopping the
// sandbox; a failed start is answered to the host, which stops the VM.
func (s *sandbox) finish(res *proto.Result, report bool) {
	res.Time = time.Now().UTC()
	s.mu.Lock()
	if s.result != nil {
		s.mu.Unlock()
		return
	}
	s.result = res
	stopping := s.stopping
	close(s.exited)
	s.mu.Unlock()
	killCgroup(sandboxCgroup)
	unix.Sync()
	if stopping || !report {
		return
	}
	reportStatus(res)
	// Give a waiting host a moment to read the answer first.
	time.Sleep(200 * time.Millisecond)
	powerOff()
}

// reportStatus writes res to the status port, whose host end keeps it.
func reportStatus(res *proto.Result) {
	p, err := findPort(proto.StatusPortName)
	if err != nil {
		return
	}
	f, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		return
	}
	defer f.Close()
	b, _ := jsonLine(res)
	_, _ = f.Write(b)
}

// wait answers once the sandbox has ended.
func (s *sandbox) wait(ctx context.Context) (*proto.Result, error) {
	select {
	case <-s.exited:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.result, nil
}

// shutdown ends every sandbox process and flushes the disk, before the
// host stops the VM.
func (s *sandbox) shutdown() error {
	s.mu.Lock()
	s.stopping = true
	s.mu.Unlock()
	killCgroup(sandboxCgroup)
	unix.Sync()
	return nil
}

// cpu reads the sandbox's CPU time.
func (s *sandbox) cpu() (*proto.CPU, error) {
	b, err := os.ReadFile(sandboxCgroup + "/cpu.stat")
	if err != nil {
		return nil, err
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "usage_usec "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return &proto.CPU{UsageUsec: n}, nil
		}
	}
	return &proto.CPU{}, nil
}

// tail keeps the last max bytes written to it.
type tail struct {
	mu  sync.Mutex
	max int
	b   []byte
}

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append([]byte(nil), t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.b)
}

// clipHead returns at most max bytes of the start of s, marking a cut.
func clipHead(s string, max int) string {
	if len(s) <= max {
		return s
	}
	return s[:max] + "..."
}
