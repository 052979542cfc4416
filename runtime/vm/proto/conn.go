package proto

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"sync"
)

// ErrClosed is the error of a connection that has ended.
var ErrClosed = errors.New("agent connection closed")

// errDropped ends a stream whose request was dropped.
var errDropped = errors.New("stream dropped")

// Conn is one end of a protocol connection. Run reads frames and passes
// every frame that is not stream plumbing (data, eof, credit) to the
// handler; streams are received with Receive and sent with SendStream.
type Conn struct {
	wmu sync.Mutex
	w   *bufio.Writer

	handle func(*Frame)

	mu   sync.Mutex
	in   map[key]*Inbound
	out  map[key]*outbound
	err  error
	done chan struct{}
}

type key struct {
	id uint64
	s  int
}

// NewConn returns a connection that writes frames to w and gives the
// frames Run reads to handle (called on Run's goroutine: it must not
// block).
func NewConn(w io.Writer, handle func(*Frame)) *Conn {
	return &Conn{
		w:      bufio.NewWriterSize(w, 64<<10),
		handle: handle,
		in:     map[key]*Inbound{},
		out:    map[key]*outbound{},
		done:   make(chan struct{}),
	}
}

// Send writes one frame.
func (c *Conn) Send(f *Frame) error {
	b, err := json.Marshal(f)
	if err != nil {
		return err
	}
	c.wmu.Lock()
	defer c.wmu.Unlock()
	select {
	case <-c.done:
		return c.Err()
	default:
	}
	if _, err := c.w.Write(append(b, '\n')); err != nil {
		return err
	}
	return c.w.Flush()
}

// SendRaw writes bytes as they are (the newline that ends a cut line).
func (c *Conn) SendRaw(b []byte) error {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if _, err := c.w.Write(b); err != nil {
		return err
	}
	return c.w.Flush()
}

// Done is closed when the connection has ended.
func (c *Conn) Done() <-chan struct{} { return c.done }

// Err is why the connection ended (nil while it runs).
func (c *Conn) Err() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.err
}

// Close ends the connection: receivers and senders stop. It does not
// close the underlying stream.
func (c *Conn) Close(err error) {
	if err == nil {
		err = ErrClosed
	}
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return
	}
	c.err = err
	close(c.done)
	ins, outs := c.in, c.out
	c.in, c.out = map[key]*Inbound{}, map[key]*outbound{}
	c.mu.Unlock()
	for _, in := range ins {
		in.finish(err)
	}
	for _, o := range outs {
		o.drop()
	}
}

// Run reads frames from r until it fails or ends, then closes the
// connection with that error. Lines longer than MaxFrame and lines that
// are not frames are skipped.
func (c *Conn) Run(r io.Reader) error {
	br := bufio.NewReaderSize(r, MaxFrame)
	for {
		line, err := br.ReadSlice('\n')
		if errors.Is(err, bufio.ErrBufferFull) {
			// Too long: skip to the end of the line.
			for errors.Is(err, bufio.ErrBufferFull) {
				_, err = br.ReadSlice('\n')
			}
			if err != nil {
				c.Close(err)
				return err
			}
			continue
		}
		if err != nil {
			if err == io.EOF {
				err = ErrClosed
			}
			c.Close(err)
			return err
		}
		line = bytes.TrimSpace(line)
		if len(line) == 0 {
			continue
		}
		var f Frame
		if json.Unmarshal(line, &f) != nil {
			continue
		}
		c.dispatch(&f)
	}
}

func (c *Conn) dispatch(f *Frame) {
	k := key{f.ID, f.S}
	switch f.T {
	case TData:
		c.mu.Lock()
		in := c.in[k]
		c.mu.Unlock()
		if in == nil || !in.push(f.D) {
			// Nobody takes it (a dropped request): give the credit back so
			// the sender is not stuck.
			if len(f.D) > 0 {
				_ = c.Send(&Frame{T: TCredit, ID: f.ID, S: f.S, N: int64(len(f.D))})
			}
		}
	case TEOF:
		c.mu.Lock()
		in := c.in[k]
		delete(c.in, k)
		c.mu.Unlock()
		if in != nil {
			in.finish(nil)
		}
	case TCredit:
		c.mu.Lock()
		o := c.out[k]
		c.mu.Unlock()
		if o != nil && f.N > 0 {
			o.grant(f.N)
		}
	default:
		if c.handle != nil {
			c.handle(f)
		}
	}
}

// Drop forgets every stream of request id: receivers end with an error,
// senders stop.
func (c *Conn) Drop(id uint64) {
	c.mu.Lock()
	var ins []*Inbound
	var outs []*outbound
	for k, in := range c.in {
		if k.id == id {
			ins = append(ins, in)
			delete(c.in, k)
		}
	}
	for k, o := range c.out {
		if k.id == id {
			outs = append(outs, o)
			delete(c.out, k)
		}
	}
	c.mu.Unlock()
	for _, in := range ins {
		in.finish(errDropped)
	}
	for _, o := range outs {
		o.drop()
	}
}

// Inbound is a stream being received.
type Inbound struct {
	c    *Conn
	k    key
	w    io.Writer
	mu   sync.Mutex
	q    [][]byte
	size int64
	end  bool
	err  error
	wake chan struct{}
	done chan struct{}
}

// Receive registers the receiver of stream s of request id: its bytes
// are written to w in order (a failing w is dropped, the stream still
// drained), and credit goes back to the sender as w takes them. Register
// before sending the request, so that no byte arrives unclaimed.
func (c *Conn) Receive(id uint64, s int, w io.Writer) *Inbound {
	in := &Inbound{c: c, k: key{id, s}, w: w, wake: make(chan struct{}, 1), done: make(chan struct{})}
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		in.end, in.err = true, c.Err()
		close(in.done)
		return in
	}
	c.in[in.k] = in
	c.mu.Unlock()
	go in.drain()
	return in
}

// push queues data; false if the stream has ended or the sender broke
// the window.
func (in *Inbound) push(b []byte) bool {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.end || in.size+int64(len(b)) > Window {
		return false
	}
	in.q = append(in.q, b)
	in.size += int64(len(b))
	select {
	case in.wake <- struct{}{}:
	default:
	}
	return true
}

// finish marks the end of the stream (err nil: a clean eof).
func (in *Inbound) finish(err error) {
	in.mu.Lock()
	defer in.mu.Unlock()
	if in.end {
		return
	}
	in.end, in.err = true, err
	select {
	case in.wake <- struct{}{}:
	default:
	}
}

func (in *Inbound) drain() {
	defer close(in.done)
	w := in.w
	for {
		in.mu.Lock()
		if len(in.q) == 0 {
			end := in.end
			in.mu.Unlock()
			if end {
				return
			}
			<-in.wake
			continue
		}
		b := in.q[0]
		in.q = in.q[1:]
		in.size -= int64(len(b))
		in.mu.Unlock()
		if w != nil {
			if _, err := w.Write(b); err != nil {
				w = nil
			}
		}
		_ = in.c.Send(&Frame{T: TCredit, ID: in.k.id, S: in.k.s, N: int64(len(b))})
	}
}

// Wait blocks until the stream has ended and every byte was written, and
// returns nil for a clean end.
func (in *Inbound) Wait(ctx context.Context) error {
	select {
	case <-in.done:
	case <-ctx.Done():
		return ctx.Err()
	}
	in.mu.Lock()
	defer in.mu.Unlock()
	return in.err
}

// Done is closed when the stream has ended and was written out.
func (in *Inbound) Done() <-chan struct{} { return in.done }

type outbound struct {
	mu      sync.Mutex
	credit  int64
	dropped bool
	wake    chan struct{}
}

func (o *outbound) grant(n int64) {
	o.mu.Lock()
	o.credit += n
	o.mu.Unlock()
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

func (o *outbound) drop() {
	o.mu.Lock()
	o.dropped = true
	o.mu.Unlock()
	select {
	case o.wake <- struct{}{}:
	default:
	}
}

// take waits for credit and returns how much of n may be sent now.
func (o *outbound) take(ctx context.Context, done <-chan struct{}, n int64) (int64, error) {
	for {
		o.mu.Lock()
		if o.dropped {
			o.mu.Unlock()
			return 0, errDropped
		}
		if o.credit > 0 {
			m := min(n, o.credit)
			o.credit -= m
			o.mu.Unlock()
			return m, nil
		}
		o.mu.Unlock()
		select {
		case <-o.wake:
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-done:
			return 0, ErrClosed
		}
	}
}

// SendStream sends what r holds as stream s of request id, paced by the
// receiver's credit, and an eof frame when r ends (io.EOF). It returns
// r's read error, without an eof frame (the caller decides: the end of a
// pipe is one, a failed upload is a cancel), or why it stopped early:
// ctx, the connection's end, or the request dropped (Drop).
func (c *Conn) SendStream(ctx context.Context, id uint64, s int, r io.Reader) error {
	k := key{id, s}
	o := &outbound{credit: Window, wake: make(chan struct{}, 1)}
	c.mu.Lock()
	if c.err != nil {
		c.mu.Unlock()
		return c.Err()
	}
	c.out[k] = o
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		if c.out[k] == o {
			delete(c.out, k)
		}
		c.mu.Unlock()
	}()
	buf := make([]byte, Chunk)
	for {
		n, rerr := r.Read(buf)
		for off := 0; off < n; {
			m, err := o.take(ctx, c.done, int64(n-off))
			if err != nil {
				return err
			}
			if err := c.Send(&Frame{T: TData, ID: id, S: s, D: buf[off : off+int(m)]}); err != nil {
				return err
			}
			off += int(m)
		}
		if rerr == io.EOF {
			return c.Send(&Frame{T: TEOF, ID: id, S: s})
		}
		if rerr != nil {
			return rerr
		}
	}
}

// CloseStream sends the end of stream s of request id without data.
func (c *Conn) CloseStream(id uint64, s int) error {
	return c.Send(&Frame{T: TEOF, ID: id, S: s})
}
