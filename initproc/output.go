package initproc

import (
	"io"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// settleGrace is how long output is still collected after a command exited
// when its pipe stays open (a background process it started holds it).
const settleGrace = 20 * time.Millisecond

// tail keeps the last max bytes written to it.
type tail struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func newTail(max int) *tail { return &tail{max: max} }

func (t *tail) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := len(p)
	if len(p) >= t.max {
		p = p[len(p)-t.max:]
		t.buf = append(t.buf[:0], p...)
		return n, nil
	}
	if over := len(t.buf) + len(p) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	t.buf = append(t.buf, p...)
	return n, nil
}

func (t *tail) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(t.buf)
}

// rotatingLog appends to a file and, when it reaches max bytes, renames it
// to name+".1" (dropping the previous one) and starts again: the log never
// takes more than about twice max.
type rotatingLog struct {
	name string
	max  int64
	f    *os.File
	size int64
}

func openRotatingLog(name string, max int64) (*rotatingLog, error) {
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &rotatingLog{name: name, max: max, f: f, size: fi.Size()}, nil
}

func (l *rotatingLog) Write(p []byte) (int, error) {
	written := 0
	for len(p) > 0 {
		if l.size >= l.max {
			if err := l.rotate(); err != nil {
				return written, err
			}
		}
		chunk := p
		if room := l.max - l.size; int64(len(chunk)) > room {
			chunk = chunk[:room]
		}
		n, err := l.f.Write(chunk)
		written += n
		l.size += int64(n)
		if err != nil {
			return written, err
		}
		p = p[n:]
	}
	return written, nil
}

func (l *rotatingLog) rotate() error {
	if err := l.f.Close(); err != nil {
		return err
	}
	if err := os.Rename(l.name, l.name+".1"); err != nil {
		return err
	}
	f, err := os.OpenFile(l.name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	l.f, l.size = f, 0
	return nil
}

// pump copies a command's output pipe into w until the pipe's last writer
// closes it. The copy goes on after the command exits, so that background
// processes it started do not die of SIGPIPE.
type pump struct {
	r    *os.File
	done chan struct{}
	// busy: a piece read from the pipe is being written to w.
	busy atomic.Bool
}

func startPump(r *os.File, w io.Writer) *pump {
	p := &pump{r: r, done: make(chan struct{})}
	go func() {
		defer close(p.done)
		defer r.Close()
		b := make([]byte, 32<<10)
		for {
			n, err := r.Read(b)
			if n > 0 {
				p.busy.Store(true)
				_, werr := w.Write(b[:n])
				p.busy.Store(false)
				if werr != nil {
					return
				}
			}
			if err != nil {
				return
			}
		}
	}()
	return p
}

// finished reports whether the pipe was copied to its end.
func (p *pump) finished() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// maxSettle bounds how long settle waits for output still in the pipe (a
// background process that keeps writing).
const maxSettle = 2 * time.Second

// settle waits until the pipe is drained and closed; when a background
// process keeps it open, until nothing has been left in it, or in the
// pump's hands, for grace (at most maxSettle). What the command wrote
// before it exited is then all copied, however late the pump gets to run:
// a loaded sandbox can keep it from running for longer than grace.
func (p *pump) settle(grace time.Duration) {
	t := time.NewTimer(grace)
	defer t.Stop()
	deadline := time.Now().Add(maxSettle)
	for {
		select {
		case <-p.done:
			return
		case <-t.C:
		}
		if !p.busy.Load() && p.unread() == 0 || time.Now().After(deadline) {
			return
		}
		t.Reset(grace)
	}
}

// unread returns how many bytes wait in the pipe (0 once it is closed).
func (p *pump) unread() int {
	rc, err := p.r.SyscallConn()
	if err != nil {
		return 0
	}
	n := 0
	ioctl := func(fd uintptr) {
		n, _ = unix.IoctlGetInt(int(fd), unix.TIOCINQ) // FIONREAD
	}
	if rc.Control(ioctl) != nil {
		return 0
	}
	return n
}
