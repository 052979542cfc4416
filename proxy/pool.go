package proxy

import (
	"bufio"
	"context"
	"errors"
	"net"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The HTTP/1.1 loop's (h1.go) connections to sandboxes' ports, kept alive
// in a pool of their own between requests. (net/http's Transport, which
// the other requests take, keeps its own.)

// upConn is a kept-alive HTTP/1.1 connection to a sandbox's port.
type upConn struct {
	c    net.Conn
	br   *bufio.Reader
	bw   *bufio.Writer
	idle time.Time // when it went back to the pool
}

// upPool keeps idle connections per sandbox port.
type upPool struct {
	mu     sync.Mutex
	closed bool
	idle   map[string][]*upConn
	sweep  *time.Timer
}

const (
	maxIdlePerPort = 64
	idleTimeout    = 30 * time.Second
)

func (p *upPool) get(key string) *upConn {
	p.mu.Lock()
	defer p.mu.Unlock()
	for l := p.idle[key]; len(l) > 0; l = p.idle[key] {
		uc := l[len(l)-1]
		p.idle[key] = l[:len(l)-1]
		if time.Since(uc.idle) < idleTimeout {
			return uc
		}
		uc.c.Close()
	}
	return nil
}

func (p *upPool) put(key string, uc *upConn) {
	if uc.br.Buffered() > 0 { // bytes nobody asked for: never again
		uc.close()
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		uc.close()
		return
	}
	if p.idle == nil {
		p.idle = map[string][]*upConn{}
	}
	if len(p.idle[key]) >= maxIdlePerPort {
		uc.c.Close()
		return
	}
	uc.idle = time.Now()
	p.idle[key] = append(p.idle[key], uc)
	if p.sweep == nil {
		p.sweep = time.AfterFunc(idleTimeout, p.closeIdle)
	}
}

// closeAll closes every idle connection, and any put back later.
func (p *upPool) closeAll() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.closed = true
	for _, l := range p.idle {
		for _, uc := range l {
			uc.c.Close()
		}
	}
	p.idle = nil
}

// closeIdle closes the connections idle for idleTimeout, and looks again
// later while any are left.
func (p *upPool) closeIdle() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.sweep = nil
	for key, l := range p.idle {
		kept := l[:0]
		for _, uc := range l {
			if time.Since(uc.idle) < idleTimeout {
				kept = append(kept, uc)
			} else {
				uc.c.Close()
			}
		}
		if len(kept) == 0 {
			delete(p.idle, key)
		} else {
			p.idle[key] = kept
		}
	}
	if len(p.idle) > 0 {
		p.sweep = time.AfterFunc(idleTimeout, p.closeIdle)
	}
}

var (
	readers = sync.Pool{New: func() any { return bufio.NewReaderSize(nil, upstreamBuf) }}
	writers = sync.Pool{New: func() any { return bufio.NewWriterSize(nil, 4096) }}
)

func (p *Proxy) dialUp(ctx context.Context, up upstream) (*upConn, error) {
	c, err := p.dial(ctx, up.sb, up.port)
	if err != nil {
		return nil, err
	}
	br := readers.Get().(*bufio.Reader)
	br.Reset(c)
	bw := writers.Get().(*bufio.Writer)
	bw.Reset(c)
	return &upConn{c: c, br: br, bw: bw}, nil
}

// alive tells whether an idle connection is still open: a peek at its
// socket that would block, not an end of file, an error or bytes nobody
// asked for.
func (uc *upConn) alive() bool {
	if uc.br.Buffered() > 0 {
		return false
	}
	c := uc.c
	if ac, ok := c.(*activeConn); ok {
		c = ac.Conn
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return true // cannot tell; a failure will say
	}
	rc, err := sc.SyscallConn()
	if err != nil {
		return true
	}
	alive := true
	var b [1]byte
	_ = rc.Read(func(fd uintptr) bool {
		_, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
		alive = errors.Is(err, unix.EAGAIN)
		return true
	})
	return alive
}

func (uc *upConn) close() {
	uc.c.Close()
	uc.br.Reset(nil)
	readers.Put(uc.br)
	uc.bw.Reset(nil)
	writers.Put(uc.bw)
}
