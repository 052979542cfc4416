package vm

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"path"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/initproc"
	"github.com/torpor-dev/torpor/runtime/vm/proto"
)

var (
	_ torpor.CodeRunner    = (*Runtime)(nil)
	_ torpor.ProcessRunner = (*Runtime)(nil)
)

// The guest's code server is initproc's, run by the agent's copy of
// itself: the same interpreters, snippets and background processes as in
// a container.
var codeSocket = path.Join(proto.GuestRunDir, initproc.CodeSocket)

// RunCode runs a snippet in the guest's code server, reached through the
// agent (a dialled unix socket); the server is started on first use and
// lives as long as the VM — across a freeze and a snapshot.
func (r *Runtime) RunCode(ctx context.Context, ref torpor.InstanceRef, req torpor.CodeRequest) (torpor.CodeResult, error) {
	return r.code.RunCode(ctx, ref, req)
}

// codeConn connects to the guest's code server, starting it when none
// answers.
func (r *Runtime) codeConn(ctx context.Context, ref torpor.InstanceRef, id string) (net.Conn, error) {
	c, err := r.DialContext(ctx, ref, "unix", codeSocket)
	if err == nil {
		return c, nil
	}
	var te *torpor.Error
	if errors.As(err, &te) && te.Code != torpor.EUnavailable {
		return nil, err // not running, frozen, ...
	}
	defer r.codeStarts.Lock(id)()
	if c, err := r.DialContext(ctx, ref, "unix", codeSocket); err == nil {
		return c, nil
	}
	var out bytes.Buffer
	res, err := r.Exec(ctx, ref, torpor.ExecRequest{
		Cmd:     []string{proto.GuestAgentPath, "init", "code-server", "-socket", codeSocket},
		Stdout:  &out,
		Stderr:  &out,
		Timeout: 30 * time.Second,
	})
	if err != nil {
		return nil, err
	}
	if res.ExitCode != 0 {
		return nil, fmt.Errorf("vm: start the code server of %s: exit status %d: %s", id, res.ExitCode, initproc.SandboxText(out.String(), 1024))
	}
	return r.DialContext(ctx, ref, "unix", codeSocket)
}
