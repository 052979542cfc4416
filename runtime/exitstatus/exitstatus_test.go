package exitstatus

import (
	"syscall"
	"testing"
)

func TestCodeAndSignal(t *testing.T) {
	// Linux's wait status: the exit status in the second byte, or the
	// killing signal in the low seven bits.
	for _, c := range []struct {
		ws     syscall.WaitStatus
		code   int
		signal string
	}{
		{0, 0, ""},
		{3 << 8, 3, ""},
		{syscall.WaitStatus(syscall.SIGKILL), 137, "SIGKILL"},
		{syscall.WaitStatus(syscall.SIGTERM), 143, "SIGTERM"},
		{syscall.WaitStatus(syscall.SIGWINCH), 128 + int(syscall.SIGWINCH), "signal 28"},
	} {
		if got := Code(c.ws); got != c.code {
			t.Errorf("Code(%#x) = %d, want %d", int(c.ws), got, c.code)
		}
		if got := Signal(c.ws); got != c.signal {
			t.Errorf("Signal(%#x) = %q, want %q", int(c.ws), got, c.signal)
		}
	}
}
