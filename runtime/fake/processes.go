package fake

import (
	"context"
	"sort"
	"strings"
	"time"

	"github.com/torpor-dev/torpor"
)

var _ torpor.ProcessRunner = (*Runtime)(nil)

// fakeProc is a toy background process: its output is its command line
// and then whatever its stdin gets; closing stdin ends it with status 0,
// a signal with 128+n.
type fakeProc struct {
	info torpor.ProcessInfo
	out  []byte
	// changed is closed and replaced when out grows or the process ends.
	changed chan struct{}
}

func (p *fakeProc) notify() {
	close(p.changed)
	p.changed = make(chan struct{})
}

var fakeSignals = map[string]int{"HUP": 1, "INT": 2, "KILL": 9, "TERM": 15}

func (r *Runtime) procInstance(id string) (*instance, error) {
	if err := checkID(id); err != nil {
		return nil, err
	}
	if err := r.h.takeFail("process"); err != nil {
		return nil, err
	}
	in, err := r.live(id)
	if err != nil {
		return nil, err
	}
	if in.state == torpor.InstanceFrozen {
		return nil, torpor.Errorf(torpor.EConflict, "sandbox %s is frozen", id)
	}
	if in.procs == nil {
		in.procs = map[int]*fakeProc{}
	}
	return in, nil
}

func (r *Runtime) fakeProc(sandbox string, id int) (*fakeProc, error) {
	in, err := r.procInstance(sandbox)
	if err != nil {
		return nil, err
	}
	p := in.procs[id]
	if p == nil {
		return nil, torpor.Errorf(torpor.ENotFound, "sandbox %s has no process %d", sandbox, id)
	}
	return p, nil
}

// StartProcess starts a toy process.
func (r *Runtime) StartProcess(ctx context.Context, ref torpor.InstanceRef, req torpor.ProcessRequest) (torpor.ProcessInfo, error) {
	if err := torpor.ValidateProcess(req); err != nil {
		return torpor.ProcessInfo{}, err
	}
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	in, err := r.procInstance(ref.SandboxID)
	if err != nil {
		return torpor.ProcessInfo{}, err
	}
	id := max(1, req.MinID)
	for k := range in.procs {
		id = max(id, k+1)
	}
	p := &fakeProc{info: torpor.ProcessInfo{ID: id, Cmd: req.Cmd, Pid: 1000 + id, State: torpor.ProcessRunning, StartedAt: time.Now().UTC(),
		Env: req.Env, Cwd: req.Cwd, User: req.User, Tag: req.Tag},
		out: []byte(strings.Join(req.Cmd, " ") + "\n"), changed: make(chan struct{})}
	in.procs[id] = p
	return p.info, nil
}

// ListProcesses lists the toy processes of the current boot.
func (r *Runtime) ListProcesses(ctx context.Context, ref torpor.InstanceRef) ([]torpor.ProcessInfo, error) {
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	in, err := r.procInstance(ref.SandboxID)
	if err != nil {
		return nil, err
	}
	out := []torpor.ProcessInfo{}
	for _, p := range in.procs {
		out = append(out, p.info)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// ProcessOutput reads a toy process's output.
func (r *Runtime) ProcessOutput(ctx context.Context, ref torpor.InstanceRef, id int, offset int64) (torpor.ProcessOutput, error) {
	return r.ReadProcess(ctx, ref, id, torpor.ProcessRead{Offset: offset})
}

// ReadProcess reads a toy process's output (all of it stdout), waiting
// for some when asked.
func (r *Runtime) ReadProcess(ctx context.Context, ref torpor.InstanceRef, id int, req torpor.ProcessRead) (torpor.ProcessOutput, error) {
	if err := torpor.ValidateProcessRead(req); err != nil {
		return torpor.ProcessOutput{}, err
	}
	var timeout <-chan time.Time
	if wait := min(req.Wait, torpor.MaxProcessWait); wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		timeout = t.C
	}
	for {
		r.h.mu.Lock()
		p, err := r.fakeProc(ref.SandboxID, id)
		if err != nil {
			r.h.mu.Unlock()
			return torpor.ProcessOutput{}, err
		}
		from := min(req.Offset, int64(len(p.out)))
		out := torpor.ProcessOutput{Offset: from, Next: int64(len(p.out))}
		if req.Split {
			if from < out.Next {
				out.Chunks = []torpor.ProcessChunk{{Data: append([]byte(nil), p.out[from:]...)}}
			}
		} else {
			out.Data = string(p.out[from:])
		}
		if p.info.State == torpor.ProcessExited {
			out.Ended, out.ExitCode = true, p.info.ExitCode
			if c := *p.info.ExitCode; c > 128 {
				out.Signal = c - 128
			}
		}
		changed := p.changed
		r.h.mu.Unlock()
		if out.Next > from || out.Ended || timeout == nil {
			return out, nil
		}
		select {
		case <-changed:
		case <-timeout:
			return out, nil
		case <-ctx.Done():
			return torpor.ProcessOutput{}, ctx.Err()
		}
	}
}

// WriteProcessStdin appends data to the toy process's output.
func (r *Runtime) WriteProcessStdin(ctx context.Context, ref torpor.InstanceRef, id int, data []byte, close bool) error {
	if len(data) > torpor.MaxProcessStdin {
		return torpor.Invalid("data", "at most %d bytes", torpor.MaxProcessStdin)
	}
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	p, err := r.fakeProc(ref.SandboxID, id)
	if err != nil {
		return err
	}
	if p.info.State != torpor.ProcessRunning {
		return torpor.Errorf(torpor.EConflict, "the process's stdin is closed")
	}
	p.out = append(p.out, data...)
	if close {
		p.exit(0)
	}
	p.notify()
	return nil
}

// SignalProcess ends the toy process.
func (r *Runtime) SignalProcess(ctx context.Context, ref torpor.InstanceRef, id int, signal string) error {
	sig, err := torpor.NormalizeSignal(signal)
	if err != nil {
		return err
	}
	r.h.mu.Lock()
	defer r.h.mu.Unlock()
	p, err := r.fakeProc(ref.SandboxID, id)
	if err != nil {
		return err
	}
	if p.info.State != torpor.ProcessRunning {
		return torpor.Errorf(torpor.EConflict, "the process has exited")
	}
	p.exit(128 + fakeSignals[sig])
	p.notify()
	return nil
}

func (p *fakeProc) exit(code int) {
	p.info.State, p.info.ExitCode = torpor.ProcessExited, &code
}
