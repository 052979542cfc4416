package vm

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/torpor-dev/torpor"
	"github.com/torpor-dev/torpor/runtime/vm/proto"
)

// agentConn is the host's connection to a guest's agent. Requests and
// their streams share it; it is held while any of them runs and closed
// when the last lets go (agentPool), so that another Runtime — a new
// daemon — can connect: the port has one host end at a time.
type agentConn struct {
	nc *net.UnixConn
	c  *proto.Conn

	mu      sync.Mutex
	pending map[uint64]chan *proto.Frame
	next    uint64

	nonce string
	hello chan *proto.Frame
}

// dialAgent connects to the agent's port socket and waits for the
// agent's answer to a hello (while the guest boots, the hello waits in
// the socket).
func dialAgent(ctx context.Context, sock string) (*agentConn, error) {
	nc, err := dialUnix(ctx, sock)
	if err != nil {
		return nil, err
	}
	var nb [8]byte
	_, _ = rand.Read(nb[:])
	a := &agentConn{nc: nc, pending: map[uint64]chan *proto.Frame{}, nonce: hex.EncodeToString(nb[:]),
		hello: make(chan *proto.Frame, 1)}
	// Request ids start at a random point: a request of an earlier host
	// the agent is still ending never matches one of ours.
	_, _ = rand.Read(nb[:])
	a.next = binary.BigEndian.Uint64(nb[:]) >> 2
	a.c = proto.NewConn(nc, a.handle)
	go func() {
		_ = a.c.Run(nc)
		a.mu.Lock()
		for id, ch := range a.pending {
			close(ch)
			delete(a.pending, id)
		}
		a.mu.Unlock()
	}()
	hb, _ := json.Marshal(proto.Hello{Version: proto.Version, Nonce: a.nonce, Now: time.Now().UTC()})
	// A newline first ends whatever line an earlier host left cut.
	if err := a.c.SendRaw([]byte("\n")); err != nil {
		a.close()
		return nil, err
	}
	if err := a.c.Send(&proto.Frame{T: proto.THello, B: hb}); err != nil {
		a.close()
		return nil, err
	}
	select {
	case f := <-a.hello:
		if f.Err != nil {
			a.close()
			return nil, fmt.Errorf("agent: %s", f.Err.Message)
		}
		return a, nil
	case <-a.c.Done():
		return nil, fmt.Errorf("agent connection closed before it answered: %w", a.c.Err())
	case <-ctx.Done():
		a.close()
		return nil, ctx.Err()
	}
}

// handle takes the frames that are not stream plumbing.
func (a *agentConn) handle(f *proto.Frame) {
	switch f.T {
	case proto.THello:
		var h proto.Hello
		if f.Err == nil && (json.Unmarshal(f.B, &h) != nil || h.Nonce != a.nonce) {
			return // an answer to an earlier host
		}
		if f.Err == nil && h.Version != proto.Version {
			f.Err = &proto.Error{Message: fmt.Sprintf("agent speaks protocol %d, host %d", h.Version, proto.Version)}
		}
		select {
		case a.hello <- f:
		default:
		}
	case proto.TResp:
		a.mu.Lock()
		ch := a.pending[f.ID]
		delete(a.pending, f.ID)
		a.mu.Unlock()
		if ch != nil {
			ch <- f
		}
	}
}

func (a *agentConn) close() {
	a.nc.Close()
	a.c.Close(nil)
}

// begin sends a request and returns its id and the channel its response
// comes on (closed if the connection ends). Streams the request receives
// must be registered with a.c.Receive(id, ...) before: use newID first.
func (a *agentConn) newID() uint64 {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.next++
	return a.next
}

func (a *agentConn) send(id uint64, op string, body any) (chan *proto.Frame, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return nil, err
	}
	ch := make(chan *proto.Frame, 1)
	a.mu.Lock()
	a.pending[id] = ch
	a.mu.Unlock()
	if err := a.c.Send(&proto.Frame{T: proto.TReq, ID: id, Op: op, B: b}); err != nil {
		a.mu.Lock()
		delete(a.pending, id)
		a.mu.Unlock()
		return nil, err
	}
	return ch, nil
}

// errAgentGone: the connection ended before the answer came.
var errAgentGone = errors.New("the guest agent's connection ended")

// await waits for the response of request id. When ctx ends first the
// agent is told to cancel the request.
func (a *agentConn) await(ctx context.Context, id uint64, ch chan *proto.Frame, result any) error {
	select {
	case f, ok := <-ch:
		if !ok {
			return errAgentGone
		}
		if f.Err != nil {
			return f.Err.Err()
		}
		if result != nil && len(f.B) > 0 {
			if err := json.Unmarshal(f.B, result); err != nil {
				return fmt.Errorf("agent: %s: %w", "response", err)
			}
		}
		return nil
	case <-ctx.Done():
		a.mu.Lock()
		delete(a.pending, id)
		a.mu.Unlock()
		_ = a.c.Send(&proto.Frame{T: proto.TCancel, ID: id})
		a.c.Drop(id)
		return ctx.Err()
	}
}

// call runs a request without streams.
func (a *agentConn) call(ctx context.Context, op string, body, result any) error {
	id := a.newID()
	ch, err := a.send(id, op, body)
	if err != nil {
		return err
	}
	return a.await(ctx, id, ch, result)
}

// agentPool shares one connection per agent among the requests of a
// Runtime, and closes it when none is left.
type agentPool struct {
	mu sync.Mutex
	m  map[string]*poolEntry
}

type poolEntry struct {
	ready chan struct{}
	ac    *agentConn
	err   error
	refs  int
}

// get returns the connection to the agent at sock and the function that
// releases it.
func (p *agentPool) get(ctx context.Context, sock string) (*agentConn, func(), error) {
	for {
		p.mu.Lock()
		if p.m == nil {
			p.m = map[string]*poolEntry{}
		}
		e := p.m[sock]
		if e == nil {
			e = &poolEntry{ready: make(chan struct{})}
			p.m[sock] = e
			e.refs++
			p.mu.Unlock()
			e.ac, e.err = dialAgent(ctx, sock)
			close(e.ready)
			if e.err != nil {
				p.mu.Lock()
				if p.m[sock] == e {
					delete(p.m, sock)
				}
				p.mu.Unlock()
				return nil, nil, e.err
			}
			return e.ac, p.releaser(sock, e), nil
		}
		e.refs++
		p.mu.Unlock()
		select {
		case <-e.ready:
		case <-ctx.Done():
			p.releaser(sock, e)()
			return nil, nil, ctx.Err()
		}
		if e.err != nil {
			p.releaser(sock, e)()
			continue
		}
		select {
		case <-e.ac.c.Done():
			// Ended (the VM went away): drop it and connect anew.
			p.mu.Lock()
			if p.m[sock] == e {
				delete(p.m, sock)
			}
			p.mu.Unlock()
			p.releaser(sock, e)()
			continue
		default:
		}
		return e.ac, p.releaser(sock, e), nil
	}
}

func (p *agentPool) releaser(sock string, e *poolEntry) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			p.mu.Lock()
			e.refs--
			last := e.refs == 0
			if last && p.m[sock] == e {
				delete(p.m, sock)
			}
			p.mu.Unlock()
			if last && e.ac != nil {
				e.ac.close()
			}
		})
	}
}

// drop closes the connection to the agent at sock now (its VM is going).
func (p *agentPool) drop(sock string) {
	p.mu.Lock()
	e := p.m[sock]
	delete(p.m, sock)
	p.mu.Unlock()
	if e != nil {
		select {
		case <-e.ready:
			if e.ac != nil {
				e.ac.close()
			}
		default:
		}
	}
}

// agentError turns a failure to reach the agent into an error a caller
// can act on.
func agentError(id string, err error) error {
	var te *torpor.Error
	if errors.As(err, &te) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	return fmt.Errorf("vm: sandbox %s: guest agent: %w", id, err)
}
