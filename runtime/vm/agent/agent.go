// Package agent is the guest side of the microVM runtime: a static
// program that runs as /init in the guest's initramfs. It mounts the
// sandbox's disk as the root, then serves the protocol of package proto
// on a virtio-serial port: it runs the setup commands and the
// entrypoint, executes commands with streamed input and output, carries
// out file operations confined to the sandbox's root (package files),
// dials addresses inside the guest, and reports how the sandbox ended.
//
// Every sandbox process runs in the cgroup /sys/fs/cgroup/sandbox (its
// memory, pids and CPU limits), each command in a child cgroup of its own
// so that a timeout or a cancel kills its whole tree with cgroup.kill.
// The agent is pid 1: it reaps every orphan and is the one process the
// guest's OOM killer never picks.
package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor/initproc"
	"github.com/torpor-dev/torpor/runtime/vm/proto"
)

// Name identifies the agent in its hello.
const Name = "torpor-agent/1"

// portName is the agent's port; a variable only so tests could point it
// elsewhere.
func portName() string { return proto.PortName }

// Main runs the agent. As pid 1 it boots the guest first; otherwise it
// expects to be in the sandbox's root already (a debugging aid).
func Main(args []string) int {
	// Copied to /.torpor/torpor in the guest, the agent is also the
	// sandbox's code server (run_code, background processes), as the
	// torpor binary is in a container.
	if len(args) > 0 && args[0] == "init" {
		return initproc.Main(args[1:])
	}
	if os.Getpid() == 1 {
		if err := bootGuest(); err != nil {
			fmt.Fprintf(os.Stderr, "torpor-agent: boot: %v\n", err)
			powerOff()
			return 1
		}
	}
	_ = os.WriteFile("/proc/self/oom_score_adj", []byte("-1000"), 0o644)
	a, err := newAgent()
	if err != nil {
		fmt.Fprintf(os.Stderr, "torpor-agent: %v\n", err)
		powerOff()
		return 1
	}
	a.serve()
	return 0
}

// powerOff ends the guest; with the runtime's QEMU settings the VM then
// stops and the host collects its status.
func powerOff() {
	unix.Sync()
	if os.Getpid() == 1 {
		_ = unix.Reboot(unix.LINUX_REBOOT_CMD_POWER_OFF)
	}
	os.Exit(1)
}

// agent is the state of the running agent.
type agent struct {
	reap *reaper
	sb   *sandbox

	// mu guards the current connection's requests and open files.
	mu    sync.Mutex
	conn  *proto.Conn
	reqs  map[uint64]context.CancelFunc
	files map[uint64]*os.File
	fileN uint64
}

func newAgent() (*agent, error) {
	r := startReaper()
	sb, err := newSandbox(r)
	if err != nil {
		return nil, err
	}
	return &agent{reap: r, sb: sb, reqs: map[uint64]context.CancelFunc{}, files: map[uint64]*os.File{}}, nil
}

// serve reads the port for ever. The port reads end of file while no
// host is connected; a new connection then starts a new Conn.
func (a *agent) serve() {
	path, err := findPort(portName())
	if err != nil {
		fmt.Fprintf(os.Stderr, "torpor-agent: %v\n", err)
		powerOff()
	}
	port, err := os.OpenFile(path, os.O_RDWR, 0)
	if err != nil {
		fmt.Fprintf(os.Stderr, "torpor-agent: open %s: %v\n", path, err)
		powerOff()
	}
	// The port signals SIGIO when a host connects: wait for that rather
	// than poll (a poll sees the port hung up while no host is there).
	sigio := make(chan os.Signal, 1)
	signal.Notify(sigio, syscall.SIGIO)
	if rc, err := port.SyscallConn(); err == nil {
		_ = rc.Control(func(fd uintptr) {
			_, _ = unix.FcntlInt(fd, unix.F_SETOWN, os.Getpid())
			if fl, err := unix.FcntlInt(fd, unix.F_GETFL, 0); err == nil {
				_, _ = unix.FcntlInt(fd, unix.F_SETFL, fl|unix.O_ASYNC)
			}
		})
	}
	for {
		var c *proto.Conn
		c = proto.NewConn(port, func(f *proto.Frame) { a.handle(c, f) })
		_ = c.Run(port)
		a.reset(nil)
		// No host now: wait for one.
		select {
		case <-sigio:
		case <-time.After(time.Second):
		}
	}
}

// reset drops everything of the previous host: its requests are
// cancelled (commands killed) and its files closed.
func (a *agent) reset(next *proto.Conn) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for id, cancel := range a.reqs {
		cancel()
		delete(a.reqs, id)
	}
	for h, f := range a.files {
		f.Close()
		delete(a.files, h)
	}
	a.conn = next
}

// handle is called for each frame on the reader's goroutine; requests
// go on in goroutines of their own once their input streams are
// registered.
func (a *agent) handle(c *proto.Conn, f *proto.Frame) {
	switch f.T {
	case proto.THello:
		var h proto.Hello
		if json.Unmarshal(f.B, &h) != nil {
			return
		}
		a.reset(c)
		if h.Version != proto.Version {
			_ = c.Send(&proto.Frame{T: proto.THello, Err: &proto.Error{Code: "invalid_argument",
				Message: fmt.Sprintf("agent speaks protocol %d, host %d", proto.Version, h.Version)}})
			return
		}
		setClock(h.Now)
		b, _ := json.Marshal(proto.Hello{Version: proto.Version, Nonce: h.Nonce, Agent: Name})
		_ = c.Send(&proto.Frame{T: proto.THello, B: b})
	case proto.TCancel:
		a.mu.Lock()
		cancel := a.reqs[f.ID]
		a.mu.Unlock()
		if cancel != nil {
			cancel()
		}
	case proto.TReq:
		a.mu.Lock()
		if a.conn != c {
			a.mu.Unlock()
			return // no hello on this connection yet
		}
		ctx, cancel := context.WithCancel(context.Background())
		a.reqs[f.ID] = cancel
		a.mu.Unlock()
		run := a.request(ctx, c, f)
		go func() {
			res, err := run()
			cancel()
			c.Drop(f.ID)
			a.mu.Lock()
			delete(a.reqs, f.ID)
			a.mu.Unlock()
			if err == errAnswered {
				return
			}
			resp := &proto.Frame{T: proto.TResp, ID: f.ID, Err: proto.ErrorOf(err)}
			if err == nil && res != nil {
				resp.B, _ = json.Marshal(res)
			}
			_ = c.Send(resp)
		}()
	}
}

// setClock sets the guest's clock to the host's when they differ by more
// than clockSlack (a guest restored from a snapshot runs behind by the
// time it was paused).
func setClock(now time.Time) {
	if now.IsZero() {
		return
	}
	if d := time.Since(now); d > clockSlack || d < -clockSlack {
		tv := unix.NsecToTimeval(now.UnixNano())
		_ = unix.Settimeofday(&tv)
	}
}

const clockSlack = 100 * time.Millisecond

// request prepares request f (registering its input streams now, on the
// reader's goroutine) and returns the function that carries it out.
func (a *agent) request(ctx context.Context, c *proto.Conn, f *proto.Frame) func() (any, error) {
	bad := func(err error) func() (any, error) { return func() (any, error) { return nil, err } }
	switch f.Op {
	case proto.OpStart:
		var req proto.Start
		if err := json.Unmarshal(f.B, &req); err != nil {
			return bad(err)
		}
		return func() (any, error) { return a.sb.start(ctx, req) }
	case proto.OpWait:
		return func() (any, error) { return a.sb.wait(ctx) }
	case proto.OpExec:
		var req proto.Exec
		if err := json.Unmarshal(f.B, &req); err != nil {
			return bad(err)
		}
		return a.sb.prepareExec(ctx, c, f.ID, req)
	case proto.OpSync:
		return func() (any, error) { unix.Sync(); return nil, nil }
	case proto.OpShutdown:
		return func() (any, error) { return nil, a.sb.shutdown() }
	case proto.OpCPU:
		return func() (any, error) { return a.sb.cpu() }
	case proto.OpDial:
		var req proto.Dial
		if err := json.Unmarshal(f.B, &req); err != nil {
			return bad(err)
		}
		return func() (any, error) { return nil, dial(ctx, c, f.ID, req) }
	}
	var req proto.File
	if err := json.Unmarshal(f.B, &req); err != nil {
		return bad(err)
	}
	return a.fileOp(ctx, c, f.ID, f.Op, req)
}
