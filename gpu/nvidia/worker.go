package nvidia

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/torpor-dev/torpor/gpu"
)

// FileWorker controls lease workers through files, a protocol simple
// enough for any worker (scripts/gpu-check.sh's Python worker speaks it):
//
//   - torpor writes "<seq> <mib>\n" to <Dir>/<lease>/reserve (atomically,
//     by rename): hold mib MiB of VRAM in all;
//   - the worker answers in <Dir>/<lease>/reserved with "<seq> ok
//     <mib>", "<seq> oom <detail>" or "<seq> error <detail>".
//
// seq grows with every request, so a stale answer is never taken for a
// new one.
type FileWorker struct {
	Dir string
	// Timeout bounds the wait for an answer (default 60 s).
	Timeout time.Duration
}

var fileSeq atomic.Int64

func init() { fileSeq.Store(time.Now().UnixNano()) }

var _ gpu.Worker = FileWorker{}

// Reserve implements gpu.Worker.
func (w FileWorker) Reserve(ctx context.Context, t gpu.Target, mib int64) error {
	if t.LeaseID == "" || strings.ContainsAny(t.LeaseID, `/\`) || t.LeaseID == ".." || t.LeaseID == "." {
		return fmt.Errorf("nvidia: worker control: bad lease id %q", t.LeaseID)
	}
	dir := filepath.Join(w.Dir, t.LeaseID)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	seq := fileSeq.Add(1)
	tmp := filepath.Join(dir, ".reserve.tmp")
	if err := os.WriteFile(tmp, fmt.Appendf(nil, "%d %d\n", seq, mib), 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp, filepath.Join(dir, "reserve")); err != nil {
		return err
	}
	timeout := w.Timeout
	if timeout == 0 {
		timeout = time.Minute
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for delay := time.Millisecond; ; delay = min(2*delay, 50*time.Millisecond) {
		b, err := os.ReadFile(filepath.Join(dir, "reserved"))
		if err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		if done, err := parseReserved(b, seq); done {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("nvidia: worker of %s did not answer reserve %d MiB: %w", t.LeaseID, mib, ctx.Err())
		case <-time.After(delay):
		}
	}
}

// parseReserved reads a worker's answer; done is false until it answers
// request seq.
func parseReserved(b []byte, seq int64) (done bool, err error) {
	f := strings.Fields(string(b))
	if len(f) < 2 {
		return false, nil
	}
	got, perr := strconv.ParseInt(f[0], 10, 64)
	if perr != nil || got != seq {
		return false, nil
	}
	detail := strings.Join(f[2:], " ")
	switch f[1] {
	case "ok":
		return true, nil
	case "oom":
		return true, fmt.Errorf("%w: %s", gpu.ErrOutOfMemory, detail)
	default:
		return true, fmt.Errorf("worker: %s", strings.Join(f[1:], " "))
	}
}
