package lifecycle

import (
	"context"
	"fmt"
	"sort"

	"github.com/torpor-dev/torpor"
)

// maxProcRecords bounds the processes remembered per sandbox; the oldest
// gone ones are forgotten first.
const maxProcRecords = 256

// Background processes (see torpor.ProcessRunner). Like Exec each call
// wakes a paused or hibernated sandbox when its policy has auto_resume and
// counts as activity. The processes live in the sandbox's code server: a
// freeze keeps them, a hibernate or restart ends them. The engine
// remembers (in memory) the processes it started and the boot they
// belong to, so that those of an earlier boot are listed as gone and
// addressing them says so (410) rather than "not found".

// processRunner runs fn with the sandbox's process runner, woken.
func (e *Engine) processRunner(ctx context.Context, tenant, id, what string) (torpor.ProcessRunner, *torpor.Sandbox, error) {
	var pr torpor.ProcessRunner
	sb, err := e.operate(ctx, tenant, id, what, true, func(sb *torpor.Sandbox) error {
		rt, err := e.runtime(sb.Runtime.Kind)
		if err != nil {
			return err
		}
		var ok bool
		if pr, ok = rt.(torpor.ProcessRunner); !ok {
			return torpor.Errorf(torpor.EInvalid, "the %s runtime cannot run background processes", rt.Kind())
		}
		return nil
	})
	return pr, sb, err
}

// StartProcess starts a background process in the sandbox.
func (e *Engine) StartProcess(ctx context.Context, tenant, id string, req torpor.ProcessRequest) (torpor.ProcessInfo, error) {
	if err := torpor.ValidateProcess(req); err != nil {
		return torpor.ProcessInfo{}, err
	}
	pr, sb, err := e.processRunner(ctx, tenant, id, "start a process in")
	if err != nil {
		return torpor.ProcessInfo{}, err
	}
	defer e.done(tenant, id, e.now())
	e.procMu.Lock()
	for pid := range e.procs[sb.ID] {
		req.MinID = max(req.MinID, pid+1)
	}
	e.procMu.Unlock()
	asked := req.Env
	if req.Env, err = e.execEnv(ctx, sb, req.Env); err != nil {
		return torpor.ProcessInfo{}, err
	}
	info, err := pr.StartProcess(ctx, ref(sb), req)
	if err != nil {
		return torpor.ProcessInfo{}, e.stoppedUnder(ctx, sb, "the process start", err)
	}
	info.Env = hideSecretEnv(sb, info.Env, asked)
	info.Boot = sb.Boots
	e.remember(sb.ID, info)
	return info, nil
}

func (e *Engine) remember(sandbox string, info torpor.ProcessInfo) {
	e.procMu.Lock()
	defer e.procMu.Unlock()
	if e.procs == nil {
		e.procs = map[string]map[int]torpor.ProcessInfo{}
	}
	m := e.procs[sandbox]
	if m == nil {
		m = map[int]torpor.ProcessInfo{}
		e.procs[sandbox] = m
	}
	m[info.ID] = info
	for len(m) > maxProcRecords {
		oldest := -1
		for pid, in := range m {
			if in.Boot < info.Boot && (oldest < 0 || pid < oldest) {
				oldest = pid
			}
		}
		if oldest < 0 {
			break
		}
		delete(m, oldest)
	}
}

// ListProcesses lists the sandbox's background processes: those of its
// current boot as the runtime reports them, and those the engine started
// in an earlier boot as gone. A hibernated sandbox is not woken: all its
// processes are gone.
func (e *Engine) ListProcesses(ctx context.Context, tenant, id string) ([]torpor.ProcessInfo, error) {
	if sb, err := e.Get(ctx, tenant, id); err != nil {
		return nil, err
	} else if sb.State == torpor.StateHibernated || sb.State == torpor.StateArchived {
		return e.goneProcesses(sb.ID, nil), nil
	}
	pr, sb, err := e.processRunner(ctx, tenant, id, "list the processes of")
	if err != nil {
		return nil, err
	}
	defer e.done(tenant, id, e.now())
	cur, err := pr.ListProcesses(ctx, ref(sb))
	if err != nil {
		return nil, e.stoppedUnder(ctx, sb, "the listing", err)
	}
	live := map[int]bool{}
	for i := range cur {
		cur[i].Boot = sb.Boots
		live[cur[i].ID] = true
		cur[i].Env = hideSecretEnv(sb, cur[i].Env, nil)
	}
	out := append(cur, e.goneProcesses(sb.ID, live)...)
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// goneProcesses returns the remembered processes of sandbox that are not
// live (the runtime does not list them: an earlier boot's), as gone.
func (e *Engine) goneProcesses(sandbox string, live map[int]bool) []torpor.ProcessInfo {
	e.procMu.Lock()
	defer e.procMu.Unlock()
	out := []torpor.ProcessInfo{}
	for pid, in := range e.procs[sandbox] {
		if live[pid] {
			continue
		}
		in.State, in.ExitCode, in.Pid = torpor.ProcessGone, nil, 0
		out = append(out, in)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// gone turns the runtime's not_found for a process the engine started in
// an earlier boot into a gone error, and the failure of a call that the
// sandbox stopped running under into the error that says so.
func (e *Engine) gone(ctx context.Context, sb *torpor.Sandbox, pid int, err error) error {
	if torpor.ErrorCodeOf(err) != torpor.ENotFound {
		return e.stoppedUnder(ctx, sb, "the call", err)
	}
	e.procMu.Lock()
	in, ok := e.procs[sb.ID][pid]
	e.procMu.Unlock()
	if !ok {
		return err
	}
	if in.Boot < sb.Boots {
		return torpor.Errorf(torpor.EGone, "process %d of sandbox %s ended when the sandbox hibernated or restarted (it was started in boot %d; this is boot %d)", pid, sb.ID, in.Boot, sb.Boots)
	}
	return torpor.Errorf(torpor.EGone, "process %d of sandbox %s is gone", pid, sb.ID)
}

// ProcessOutput reads a background process's output from offset.
func (e *Engine) ProcessOutput(ctx context.Context, tenant, id string, pid int, offset int64) (torpor.ProcessOutput, error) {
	if offset < 0 {
		return torpor.ProcessOutput{}, torpor.Invalid("offset", "must not be negative")
	}
	pr, sb, err := e.processRunner(ctx, tenant, id, "read the output of a process of")
	if err != nil {
		return torpor.ProcessOutput{}, err
	}
	defer e.done(tenant, id, e.now())
	out, err := pr.ProcessOutput(ctx, ref(sb), pid, offset)
	if err != nil {
		return torpor.ProcessOutput{}, e.gone(ctx, sb, pid, err)
	}
	return out, nil
}

// WriteProcessStdin writes to a background process's stdin and closes it
// when close is set.
func (e *Engine) WriteProcessStdin(ctx context.Context, tenant, id string, pid int, data []byte, close bool) error {
	if len(data) > torpor.MaxProcessStdin {
		return torpor.Invalid("data", "at most %d bytes", torpor.MaxProcessStdin)
	}
	pr, sb, err := e.processRunner(ctx, tenant, id, "write to a process of")
	if err != nil {
		return err
	}
	defer e.done(tenant, id, e.now())
	return e.gone(ctx, sb, pid, pr.WriteProcessStdin(ctx, ref(sb), pid, data, close))
}

// SignalProcess sends a signal (TERM, KILL, INT or HUP) to a background
// process and what it started.
func (e *Engine) SignalProcess(ctx context.Context, tenant, id string, pid int, signal string) error {
	sig, err := torpor.NormalizeSignal(signal)
	if err != nil {
		return err
	}
	pr, sb, err := e.processRunner(ctx, tenant, id, "signal a process of")
	if err != nil {
		return err
	}
	defer e.done(tenant, id, e.now())
	return e.gone(ctx, sb, pid, pr.SignalProcess(ctx, ref(sb), pid, sig))
}

// ReadProcess reads a background process's output for a follower that
// streams it (envd): unlike ProcessOutput it never wakes the sandbox and
// is not activity, so that a stream left open neither keeps a sandbox
// from pausing nor resumes it. A sandbox that is not running is a
// conflict whose error carries the state (torpor.Error.State): a
// follower waits for it to run again (see EventsChanged), and stops at
// terminated (gone).
func (e *Engine) ReadProcess(ctx context.Context, tenant, id string, pid int, req torpor.ProcessRead) (torpor.ProcessOutput, error) {
	if err := torpor.ValidateProcessRead(req); err != nil {
		return torpor.ProcessOutput{}, err
	}
	sb, err := e.load(ctx, tenant, id)
	if err != nil {
		return torpor.ProcessOutput{}, err
	}
	switch sb.State {
	case torpor.StateRunning:
	case torpor.StateTerminated:
		return torpor.ProcessOutput{}, gone(sb)
	default:
		return torpor.ProcessOutput{}, &torpor.Error{Code: torpor.EConflict, State: sb.State, Reason: "state",
			Message: fmt.Sprintf("sandbox %s is %s", sb.ID, sb.State)}
	}
	rt, err := e.runtime(sb.Runtime.Kind)
	if err != nil {
		return torpor.ProcessOutput{}, err
	}
	pr, ok := rt.(torpor.ProcessRunner)
	if !ok {
		return torpor.ProcessOutput{}, torpor.Errorf(torpor.EInvalid, "the %s runtime cannot run background processes", rt.Kind())
	}
	// A read that waits for output must not wait on a sandbox frozen
	// under it (its process table stops with it): once the sandbox stops
	// running, the read answers at once with what it became, and the
	// follower waits for it to run again.
	stopped := e.runSignal(sb.ID)
	out, err := untilStopped(e, ctx, sb, stopped, "the read", func(ctx context.Context) (torpor.ProcessOutput, error) {
		return pr.ReadProcess(ctx, ref(sb), pid, req)
	}, nil, func() {})
	if err != nil {
		return torpor.ProcessOutput{}, e.gone(ctx, sb, pid, err)
	}
	return out, nil
}
