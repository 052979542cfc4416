package proto

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"strings"
	"testing"
	"time"
)

// pair returns two connected Conns; frames that are not stream plumbing
// go to the returned channels.
func pair(t *testing.T) (a, b *Conn, fa, fb chan *Frame) {
	t.Helper()
	ca, cb := net.Pipe()
	fa, fb = make(chan *Frame, 16), make(chan *Frame, 16)
	a = NewConn(ca, func(f *Frame) { fa <- f })
	b = NewConn(cb, func(f *Frame) { fb <- f })
	go a.Run(ca)
	go b.Run(cb)
	t.Cleanup(func() { ca.Close(); cb.Close() })
	return a, b, fa, fb
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return c
}

// A stream much larger than the window arrives whole and in order,
// while the receiver is slow: credit paces the sender.
func TestStreamIsPacedAndComplete(t *testing.T) {
	a, b, _, _ := pair(t)
	data := bytes.Repeat([]byte("0123456789"), 3*Window/10+7)
	var got bytes.Buffer
	in := b.Receive(7, Stdout, slowWriter{&got})
	if err := a.SendStream(ctx(t), 7, Stdout, bytes.NewReader(data)); err != nil {
		t.Fatal(err)
	}
	if err := in.Wait(ctx(t)); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got.Bytes(), data) {
		t.Errorf("got %d bytes, want %d", got.Len(), len(data))
	}
}

type slowWriter struct{ w io.Writer }

func (s slowWriter) Write(p []byte) (int, error) {
	time.Sleep(time.Millisecond)
	return s.w.Write(p)
}

// A sender blocked on credit stops when the request is dropped.
func TestDropStopsSender(t *testing.T) {
	a, _, _, _ := pair(t)
	done := make(chan error, 1)
	go func() {
		// Nobody receives stream 9 on the other side: the data is
		// credited back, so use a reader that never ends instead.
		done <- a.SendStream(context.Background(), 9, Stdin, endless{})
	}()
	time.Sleep(20 * time.Millisecond)
	a.Drop(9)
	select {
	case err := <-done:
		if err == nil {
			t.Error("a dropped stream ended without an error")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the sender did not stop")
	}
}

type endless struct{}

func (endless) Read(p []byte) (int, error) {
	time.Sleep(time.Millisecond)
	for i := range p {
		p[i] = 'x'
	}
	return len(p), nil
}

// Garbage, overlong and cut lines are skipped; frames after them arrive.
func TestGarbageIsSkipped(t *testing.T) {
	r, w := io.Pipe()
	got := make(chan *Frame, 4)
	c := NewConn(io.Discard, func(f *Frame) { got <- f })
	go c.Run(r)
	hello, _ := json.Marshal(Frame{T: THello, B: json.RawMessage(`{"version":1,"nonce":"n"}`)})
	go func() {
		io.WriteString(w, `{"t":"req","id":1,"op`) // cut by a disconnect
		io.WriteString(w, "\n")
		io.WriteString(w, strings.Repeat("x", MaxFrame+10)+"\n")
		io.WriteString(w, "not json\n")
		w.Write(append(hello, '\n'))
	}()
	select {
	case f := <-got:
		if f.T != THello {
			t.Errorf("first frame through: %+v", f)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("the hello after the garbage never arrived")
	}
}

// A receiver that overruns the window is refused the excess.
func TestWindowIsEnforced(t *testing.T) {
	c := NewConn(io.Discard, nil)
	block := make(chan struct{})
	in := c.Receive(1, Stdout, blockingWriter{block})
	defer close(block)
	chunk := make([]byte, Chunk)
	accepted := 0
	for i := 0; i < 2*Window/Chunk; i++ {
		if in.push(chunk) {
			accepted += len(chunk)
		}
	}
	if accepted > Window+Chunk {
		t.Errorf("accepted %d bytes past a window of %d", accepted, Window)
	}
}

type blockingWriter struct{ c chan struct{} }

func (b blockingWriter) Write(p []byte) (int, error) { <-b.c; return len(p), nil }
