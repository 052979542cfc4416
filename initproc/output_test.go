package initproc

import (
	"bytes"
	"os"
	"sync"
	"testing"
	"time"
)

// slowSink takes its first write only after a delay, as a pump that the
// kernel does not run for a while would.
type slowSink struct {
	mu    sync.Mutex
	delay time.Duration
	buf   bytes.Buffer
}

func (s *slowSink) Write(p []byte) (int, error) {
	s.mu.Lock()
	delay := s.delay
	s.delay = 0
	s.mu.Unlock()
	time.Sleep(delay)
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.Write(p)
}

func (s *slowSink) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.buf.String()
}

// TestSettleWaitsForOutputNotYetCopied: what a command wrote before it
// exited is all copied by the time settle returns, though the pump takes
// longer than the grace to get it across, and though a background process
// keeps the pipe open; with nothing left to copy, settle returns after
// the grace.
func TestSettleWaitsForOutputNotYetCopied(t *testing.T) {
	for _, holdOpen := range []bool{false, true} {
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		sink := &slowSink{delay: 200 * time.Millisecond}
		p := startPump(r, sink)
		w.WriteString("the command's last words\n")
		if !holdOpen {
			w.Close()
		}
		p.settle(20 * time.Millisecond)
		if got := sink.String(); got != "the command's last words\n" {
			t.Errorf("held open %v: settle returned with %q copied", holdOpen, got)
		}
		start := time.Now()
		p.settle(20 * time.Millisecond)
		if took := time.Since(start); took > time.Second {
			t.Errorf("held open %v: settle with nothing left to copy took %s", holdOpen, took)
		}
		w.Close()
		<-p.done
	}
}

// TestUnreadCountsWhatWaitsInThePipe: unread is what was written to the
// pipe and not read yet.
func TestUnreadCountsWhatWaitsInThePipe(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	defer w.Close()
	p := &pump{r: r}
	if n := p.unread(); n != 0 {
		t.Fatalf("an empty pipe: %d unread", n)
	}
	w.WriteString("12345")
	if n := p.unread(); n != 5 {
		t.Fatalf("%d unread, want 5", n)
	}
}
