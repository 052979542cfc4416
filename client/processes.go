package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/url"
	"strconv"

	"github.com/torpor-dev/torpor/api/wire"
)

// ProcessRequest starts a background process: cmd, env and cwd.
type ProcessRequest = wire.ProcessRequest

// Process is a background process: id, cmd, pid, state ("running",
// "exited" or "gone"), exit_code, started_at and boot.
type Process = wire.Process

// ProcessOutput is a piece of a process's output.
type ProcessOutput = wire.ProcessOutput

func processPath(id string, pid int, tail string) string {
	return "/v1/sandboxes/" + url.PathEscape(id) + "/processes/" + strconv.Itoa(pid) + tail
}

// StartProcess starts a background process in the sandbox; it keeps
// running between calls (and across a pause) until it exits, is
// signalled, or the sandbox hibernates or restarts.
func (c *Client) StartProcess(ctx context.Context, id string, req ProcessRequest) (*Process, error) {
	var out Process
	return &out, c.do(ctx, "POST", "/v1/sandboxes/"+url.PathEscape(id)+"/processes", nil, req, &out)
}

// ListProcesses lists the sandbox's background processes.
func (c *Client) ListProcesses(ctx context.Context, id string) ([]Process, error) {
	var out wire.ProcessList
	if err := c.do(ctx, "GET", "/v1/sandboxes/"+url.PathEscape(id)+"/processes", nil, nil, &out); err != nil {
		return nil, err
	}
	return out.Processes, nil
}

// ProcessOutput reads a process's output (stdout and stderr together)
// from offset; Next is where to read on.
func (c *Client) ProcessOutput(ctx context.Context, id string, pid int, offset int64) (*ProcessOutput, error) {
	var out ProcessOutput
	q := url.Values{"offset": {strconv.FormatInt(offset, 10)}}
	return &out, c.do(ctx, "GET", processPath(id, pid, "/output"), q, nil, &out)
}

// FollowProcessOutput writes a process's output from offset to w as it
// comes until the process ends, and returns how it ended.
func (c *Client) FollowProcessOutput(ctx context.Context, id string, pid int, offset int64, w io.Writer) (*ProcessOutput, error) {
	q := url.Values{"offset": {strconv.FormatInt(offset, 10)}}
	resp, err := c.send(ctx, "GET", processPath(id, pid, "/output"), q, nil, "text/event-stream")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var end *ProcessOutput
	err = readEvents(resp.Body, func(event string, data []byte) (bool, error) {
		switch event {
		case wire.EventOutput, wire.EventExit:
			var o ProcessOutput
			if err := json.Unmarshal(data, &o); err != nil {
				return true, fmt.Errorf("client: bad output event: %w", err)
			}
			if _, err := io.WriteString(w, o.Data); err != nil {
				return true, err
			}
			if event == wire.EventExit {
				end = &o
				return true, nil
			}
		case wire.EventError:
			return true, streamError(data)
		}
		return false, nil
	})
	if err != nil {
		return nil, err
	}
	if end == nil {
		return nil, errors.New("client: the output stream ended before the process")
	}
	return end, nil
}

// WriteProcessStdin writes data (at most 1 MiB) to a process's stdin and
// closes it when close is set.
func (c *Client) WriteProcessStdin(ctx context.Context, id string, pid int, data string, close bool) error {
	return c.do(ctx, "POST", processPath(id, pid, "/stdin"), nil, wire.StdinRequest{Data: data, Close: close}, nil)
}

// SignalProcess sends TERM, KILL, INT or HUP to a process and what it
// started.
func (c *Client) SignalProcess(ctx context.Context, id string, pid int, signal string) error {
	return c.do(ctx, "POST", processPath(id, pid, "/signal"), nil, wire.SignalRequest{Signal: signal}, nil)
}
