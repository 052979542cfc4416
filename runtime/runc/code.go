package runc

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"path"
	"slices"
	"strconv"
	"time"

	"golang.org/x/sys/unix"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/initproc"
)

var (
	_ torpor.CodeRunner    = (*Runtime)(nil)
	_ torpor.ProcessRunner = (*Runtime)(nil)
)

// RunCode runs a snippet in the sandbox's code server (`torpor init
// code-server`), which keeps one interpreter per language. The server is
// started on first use through Exec; it outlives that exec and lives as
// long as the instance. The daemon reaches it through the unix socket
// code.sock in the sandbox's run directory, opened without following
// anything the sandbox may have put there (codeConn).
func (r *Runtime) RunCode(ctx context.Context, ref torpor.InstanceRef, req torpor.CodeRequest) (torpor.CodeResult, error) {
	return r.code.RunCode(ctx, ref, req)
}

// codeConn connects to the sandbox's code server, starting it first when
// none answers.
func (r *Runtime) codeConn(ctx context.Context, ref torpor.InstanceRef, id string) (net.Conn, error) {
	if c, err := dialCode(r.runDir(id)); err == nil {
		return c, nil
	}
	unlock := r.codeStarts.Lock(id)
	defer unlock()
	if c, err := dialCode(r.runDir(id)); err == nil {
		return c, nil
	}
	// Exec reports a missing instance; its record says how its init runs.
	in, _, _ := r.lookup(ctx, id)
	var stdout, stderr bytes.Buffer
	res, err := r.Exec(ctx, ref, torpor.ExecRequest{
		Cmd:     codeServerCmd(initArgvOf(in)),
		Stdout:  &limitedBuffer{buf: &stdout, max: 4096},
		Stderr:  &limitedBuffer{buf: &stderr, max: 4096},
		Timeout: 30 * time.Second,
	})
	if err != nil {
		return nil, err
	}
	if res.ExitCode != 0 {
		return nil, fmt.Errorf("runc: start the code server of %s: exit status %d: %s", id, res.ExitCode, initproc.SandboxText(stderr.String()+stdout.String(), 1024))
	}
	c, err := dialCode(r.runDir(id))
	if err != nil {
		return nil, fmt.Errorf("runc: code server of %s: %w", id, err)
	}
	return c, nil
}

// dialCode connects to dir/code.sock. The sandbox can write in dir, so the
// socket is opened O_PATH without following symlinks and confined to dir,
// checked to be a socket, and connected to through its /proc/self/fd link,
// which reaches exactly the inode opened.
func dialCode(dir string) (net.Conn, error) {
	dfd, err := unix.Open(dir, unix.O_PATH|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: dir, Err: err}
	}
	defer unix.Close(dfd)
	fd, err := unix.Openat2(dfd, initproc.CodeSocket, &unix.OpenHow{
		Flags:   unix.O_PATH | unix.O_NOFOLLOW | unix.O_CLOEXEC,
		Resolve: unix.RESOLVE_NO_SYMLINKS | unix.RESOLVE_BENEATH | unix.RESOLVE_NO_MAGICLINKS,
	})
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: initproc.CodeSocket, Err: err}
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFSOCK {
		return nil, fmt.Errorf("%s is not a socket", initproc.CodeSocket)
	}
	s, err := unix.Socket(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if err := unix.Connect(s, &unix.SockaddrUnix{Name: "/proc/self/fd/" + strconv.Itoa(fd)}); err != nil {
		unix.Close(s)
		return nil, &os.SyscallError{Syscall: "connect", Err: err}
	}
	f := os.NewFile(uintptr(s), "code.sock")
	defer f.Close()
	return net.FileConn(f)
}

// codeServerCmd starts the code server of the init that initArgv runs.
// The server starts itself again in the background: through the same
// command, which it is told when it is more than the binary.
func codeServerCmd(initArgv []string) []string {
	cmd := append(slices.Clip(initArgv), "init", "code-server", "-socket", path.Join(runMount, initproc.CodeSocket), "-setid-caps")
	if len(initArgv) > 1 {
		for _, w := range initArgv {
			cmd = append(cmd, "-self="+w)
		}
	}
	return cmd
}
