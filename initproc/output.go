package initproc

import (
	"io"
	"os"
	"sync"
	"time"
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
	done chan struct{}
}

func startPump(r *os.File, w io.Writer) *pump {
	p := &pump{done: make(chan struct{})}
	go func() {
		defer close(p.done)
		defer r.Close()
		_, _ = io.Copy(w, r)
	}()
	return p
}

// settle waits until the pipe is drained and closed, or for grace when a
// background process keeps it open.
func (p *pump) settle(grace time.Duration) {
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
	}
}
