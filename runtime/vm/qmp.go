package vm

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"golang.org/x/sys/unix"
)

// qmpTimeout bounds one monitor conversation that has no deadline of its
// own. QEMU's monitor serves one client at a time; a second waits.
const qmpTimeout = 30 * time.Second

// dialUnix connects to a unix socket. A path too long for sockaddr_un is
// reached through /proc/self/fd of its directory.
func dialUnix(ctx context.Context, path string) (*net.UnixConn, error) {
	target := path
	if len(path) > 100 {
		d, err := os.Open(filepath.Dir(path))
		if err != nil {
			return nil, err
		}
		defer d.Close()
		target = "/proc/self/fd/" + strconv.Itoa(int(d.Fd())) + "/" + filepath.Base(path)
	}
	var dl net.Dialer
	c, err := dl.DialContext(ctx, "unix", target)
	if err != nil {
		return nil, err
	}
	return c.(*net.UnixConn), nil
}

// qmp is a conversation with QEMU's monitor.
type qmp struct {
	c *net.UnixConn
	r *bufio.Reader
}

// qmpError is an error the monitor returned.
type qmpError struct {
	Class string `json:"class"`
	Desc  string `json:"desc"`
}

func (e *qmpError) Error() string { return "QMP: " + e.Class + ": " + e.Desc }

// dialQMP connects to the monitor at path and negotiates capabilities.
func dialQMP(ctx context.Context, path string) (*qmp, error) {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, qmpTimeout)
		defer cancel()
	}
	c, err := dialUnix(ctx, path)
	if err != nil {
		return nil, err
	}
	q := &qmp{c: c, r: bufio.NewReaderSize(c, 64<<10)}
	stop := q.bound(ctx)
	defer stop()
	// The greeting, then capabilities negotiation.
	if _, err := q.r.ReadBytes('\n'); err != nil {
		c.Close()
		return nil, fmt.Errorf("QMP greeting: %w", ctxErr(ctx, err))
	}
	if _, err := q.call("qmp_capabilities", nil, nil); err != nil {
		c.Close()
		return nil, ctxErr(ctx, err)
	}
	return q, nil
}

// bound makes the connection's reads and writes fail when ctx ends.
func (q *qmp) bound(ctx context.Context) func() {
	if dl, ok := ctx.Deadline(); ok {
		_ = q.c.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = q.c.SetDeadline(time.Unix(1, 0)) })
	return func() { stop(); _ = q.c.SetDeadline(time.Time{}) }
}

func ctxErr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return ctx.Err()
	}
	return err
}

func (q *qmp) close() { q.c.Close() }

// call runs one command; fd, when not nil, goes along (SCM_RIGHTS) for
// getfd. Events that come in between are skipped.
func (q *qmp) call(cmd string, args any, fd *os.File) (json.RawMessage, error) {
	req := map[string]any{"execute": cmd}
	if args != nil {
		req["arguments"] = args
	}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	if fd != nil {
		if _, _, err := q.c.WriteMsgUnix(b, unix.UnixRights(int(fd.Fd())), nil); err != nil {
			return nil, err
		}
	} else if _, err := q.c.Write(b); err != nil {
		return nil, err
	}
	for {
		line, err := q.r.ReadBytes('\n')
		if err != nil {
			return nil, fmt.Errorf("QMP %s: %w", cmd, err)
		}
		var resp struct {
			Return json.RawMessage `json:"return"`
			Error  *qmpError       `json:"error"`
			Event  string          `json:"event"`
		}
		if err := json.Unmarshal(line, &resp); err != nil {
			return nil, fmt.Errorf("QMP %s: %w", cmd, err)
		}
		switch {
		case resp.Event != "":
			continue
		case resp.Error != nil:
			return nil, resp.Error
		default:
			return resp.Return, nil
		}
	}
}

// do runs one command with ctx bounding it.
func (q *qmp) do(ctx context.Context, cmd string, args any, result any) error {
	stop := q.bound(ctx)
	defer stop()
	ret, err := q.call(cmd, args, nil)
	if err != nil {
		return ctxErr(ctx, err)
	}
	if result != nil {
		if err := json.Unmarshal(ret, result); err != nil {
			return fmt.Errorf("QMP %s: %w", cmd, err)
		}
	}
	return nil
}

// qmpDo connects to a sandbox's monitor, runs one command, and hangs up.
func qmpDo(ctx context.Context, sock, cmd string, args any, result any) error {
	q, err := dialQMP(ctx, sock)
	if err != nil {
		return err
	}
	defer q.close()
	return q.do(ctx, cmd, args, result)
}

// vmStatus asks QEMU the run state of its VM ("running", "paused",
// "shutdown", "postmigrate", ...).
func vmStatus(ctx context.Context, sock string) (string, error) {
	var st struct {
		Status string `json:"status"`
	}
	if err := qmpDo(ctx, sock, "query-status", nil, &st); err != nil {
		return "", err
	}
	return st.Status, nil
}

// ringbufRead reads (and empties) a ring buffer character device.
func (q *qmp) ringbufRead(ctx context.Context, dev string) (string, error) {
	var s string
	err := q.do(ctx, "ringbuf-read", map[string]any{"device": dev, "size": 65536, "format": "utf8"}, &s)
	return s, err
}
