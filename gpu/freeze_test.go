package gpu

import (
	"errors"
	"fmt"
	"syscall"
	"testing"
)

type fakeSignaler struct {
	fail  map[int]error
	calls []string
}

func (f *fakeSignaler) Stop(pid int) error {
	f.calls = append(f.calls, fmt.Sprintf("STOP %d", pid))
	return f.fail[pid]
}

func (f *fakeSignaler) Continue(pid int) error {
	f.calls = append(f.calls, fmt.Sprintf("CONT %d", pid))
	return nil
}

// TestFreezeAllContinuesWhatItStoppedWhenOneCannotStop: there is no
// half-freeze: an EPERM on one process continues those already stopped,
// last first, and names the one that failed; a process already gone is
// skipped.
func TestFreezeAllContinuesWhatItStoppedWhenOneCannotStop(t *testing.T) {
	cases := []struct {
		name      string
		fail      map[int]error
		wantCalls []string
		wantPID   int
	}{
		{"all stop", nil, []string{"STOP 1", "STOP 2", "STOP 3"}, 0},
		{"EPERM on the last", map[int]error{3: syscall.EPERM},
			[]string{"STOP 1", "STOP 2", "STOP 3", "CONT 2", "CONT 1"}, 3},
		{"EPERM on the first", map[int]error{1: syscall.EPERM}, []string{"STOP 1"}, 1},
		{"a gone process is skipped", map[int]error{2: fmt.Errorf("kill: %w", ErrNoProcess)},
			[]string{"STOP 1", "STOP 2", "STOP 3"}, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			s := &fakeSignaler{fail: c.fail}
			err := FreezeAll([]int{1, 2, 3}, s)
			if fmt.Sprint(s.calls) != fmt.Sprint(c.wantCalls) {
				t.Fatalf("calls = %v, want %v", s.calls, c.wantCalls)
			}
			if c.wantPID == 0 {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			var fe *FreezeError
			if !errors.As(err, &fe) || fe.PID != c.wantPID || !errors.Is(err, syscall.EPERM) {
				t.Fatalf("err = %v, want a FreezeError for %d wrapping EPERM", err, c.wantPID)
			}
		})
	}
}
