package client

import (
	"context"
	"io"
)

// ExecCallbacks receive a command's output as it is produced.
type ExecCallbacks struct {
	OnStdout func([]byte)
	OnStderr func([]byte)
}

// Command is a command started with StartExec.
type Command struct {
	done chan struct{}
	res  *ExecResult
	err  error
}

// StartExec runs a command in the background of the caller: output goes
// to the callbacks as it comes, and Wait returns how it ended.
func (c *Client) StartExec(ctx context.Context, id string, req ExecRequest, cb ExecCallbacks) *Command {
	cmd := &Command{done: make(chan struct{})}
	go func() {
		defer close(cmd.done)
		cmd.res, cmd.err = c.ExecStream(ctx, id, req, callbackWriter(cb.OnStdout), callbackWriter(cb.OnStderr))
	}()
	return cmd
}

// Wait blocks until the command ends.
func (cmd *Command) Wait() (*ExecResult, error) {
	<-cmd.done
	return cmd.res, cmd.err
}

type callbackWriter func([]byte)

func (f callbackWriter) Write(p []byte) (int, error) {
	if f != nil {
		f(append([]byte(nil), p...))
	}
	return len(p), nil
}

var _ io.Writer = callbackWriter(nil)
