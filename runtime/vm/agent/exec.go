package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/initproc"
	"github.com/torpor-dev/torpor/runtime/exitstatus"
	"github.com/torpor-dev/torpor/runtime/vm/proto"
)

// prepareExec registers the command's input stream (on the reader's
// goroutine, before any of it can arrive) and returns the function that
// runs the command: in a cgroup of its own, its output streamed back,
// its whole tree killed at the timeout or when the host cancels.
func (s *sandbox) prepareExec(ctx context.Context, c *proto.Conn, id uint64, req proto.Exec) func() (any, error) {
	var stdinR *os.File
	var stdinIn *proto.Inbound
	if req.Stdin {
		r, w, err := os.Pipe()
		if err != nil {
			return func() (any, error) { return nil, err }
		}
		stdinR = r
		stdinIn = c.Receive(id, proto.Stdin, w)
		go func() {
			<-stdinIn.Done()
			w.Close()
		}()
	}
	return func() (any, error) {
		if stdinR != nil {
			defer stdinR.Close()
		}
		return s.exec(ctx, c, id, req, stdinR)
	}
}

func (s *sandbox) exec(ctx context.Context, c *proto.Conn, id uint64, req proto.Exec, stdin *os.File) (*proto.ExecResult, error) {
	s.mu.Lock()
	ended := s.result != nil || s.stopping
	s.mu.Unlock()
	if ended {
		return nil, torpor.Errorf(torpor.EConflict, "the sandbox's instance has stopped")
	}
	if len(req.Cmd) == 0 || req.Cmd[0] == "" {
		return nil, torpor.Invalid("cmd", "a command is required")
	}
	env := initproc.MergeEnv(s.environ(), req.Env)
	cwd := req.Cwd
	if cwd == "" {
		cwd = "/"
	}
	if fi, err := os.Stat(cwd); err != nil || !fi.IsDir() {
		return nil, torpor.Invalid("cwd", "working directory %s: not a directory in the sandbox", cwd)
	}
	var cred *syscall.Credential
	if req.User != "" {
		uid, gid, err := resolveUser(req.User)
		if err != nil {
			return nil, err
		}
		cred = &syscall.Credential{Uid: uid, Gid: gid, NoSetGroups: true}
	}
	if stdin == nil {
		devnull, err := os.Open(os.DevNull)
		if err != nil {
			return nil, err
		}
		defer devnull.Close()
		stdin = devnull
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return nil, err
	}
	name := fmt.Sprintf("exec-%d", s.execN.Add(1))
	ch, err := s.spawn(name, req.Cmd, env, cwd, []*os.File{stdin, outW, errW}, cred)
	outW.Close()
	errW.Close()
	if err != nil {
		outR.Close()
		// As a shell would: a message on stderr and 126 or 127.
		msg := fmt.Sprintf("torpor: exec %s: %v\n", req.Cmd[0], err)
		_ = c.SendStream(ctx, id, proto.Stderr, strings.NewReader(msg))
		_ = c.CloseStream(id, proto.Stdout)
		errR.Close()
		return &proto.ExecResult{ExitCode: startErrorCode(err)}, nil
	}
	outDone := pump(ctx, c, id, proto.Stdout, outR)
	errDone := pump(ctx, c, id, proto.Stderr, errR)

	var deadline <-chan time.Time
	if req.Timeout > 0 {
		t := time.NewTimer(req.Timeout)
		defer t.Stop()
		deadline = t.C
	}
	res := &proto.ExecResult{}
	select {
	case ws := <-ch.status:
		res.ExitCode = exitstatus.Code(ws)
	case <-deadline:
		killCgroup(ch.cgroup)
		res.ExitCode = exitstatus.Code(<-ch.status)
		res.TimedOut = true
	case <-ctx.Done():
		killCgroup(ch.cgroup)
		res.ExitCode = exitstatus.Code(<-ch.status)
	}
	settle(outDone, outR)
	settle(errDone, errR)
	if !populated(ch.cgroup) {
		_ = syscall.Rmdir(ch.cgroup)
	}
	return res, ctx.Err()
}

// pump streams r to the host as stream s of request id; the channel
// closes when it is done.
func pump(ctx context.Context, c *proto.Conn, id uint64, s int, r io.Reader) chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := c.SendStream(ctx, id, s, r); err != nil {
			_ = c.CloseStream(id, s)
		}
	}()
	return done
}

// resolveUser turns a user name from the sandbox's /etc/passwd, or
// uid[:gid], into ids.
func resolveUser(user string) (uint32, uint32, error) {
	if u, g, ok := strings.Cut(user, ":"); isNum(u) && (!ok || isNum(g)) {
		uid, _ := strconv.ParseUint(u, 10, 32)
		gid := uid
		if ok {
			gid, _ = strconv.ParseUint(g, 10, 32)
		}
		return uint32(uid), uint32(gid), nil
	}
	f, err := os.Open("/etc/passwd")
	if err != nil {
		return 0, 0, torpor.Invalid("user", "the sandbox has no /etc/passwd to look up %q in; give uid[:gid]", user)
	}
	defer f.Close()
	sc := bufio.NewScanner(io.LimitReader(f, 1<<20))
	for sc.Scan() {
		fields := strings.Split(sc.Text(), ":")
		if len(fields) >= 4 && fields[0] == user && isNum(fields[2]) && isNum(fields[3]) {
			uid, _ := strconv.ParseUint(fields[2], 10, 32)
			gid, _ := strconv.ParseUint(fields[3], 10, 32)
			return uint32(uid), uint32(gid), nil
		}
	}
	return 0, 0, torpor.Invalid("user", "no user %q in the sandbox's /etc/passwd", user)
}

func isNum(s string) bool {
	n, err := strconv.ParseUint(s, 10, 32)
	return err == nil && n < 1<<31
}

// jsonLine marshals v followed by a newline.
func jsonLine(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	return append(b, '\n'), err
}
