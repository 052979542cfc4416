package lifecycle

import (
	"context"
	"fmt"
	"io"
	"sync"

	"github.com/torpor-dev/torpor"
)

// Operations in flight and the transitions that stop a sandbox. A pause,
// hibernation or restart of a running sandbox (and a hibernation of a
// paused one, whose files can be read meanwhile) first drains it: holding
// the sandbox's lock (so new operations queue behind it and then find the
// sandbox paused), it waits for the operations under way to end, for at
// most the drain timeout. Past it the transition goes on: a pause freezes
// what still runs, to continue when the sandbox resumes; a hibernation or
// restart ends it. The requests of those operations are answered at once
// with a conflict that says what became of the sandbox (see untilStopped),
// rather than waiting on a sandbox that no longer runs.
//
// The drain matters for files operations most: one holds the sandbox's
// root open on the host, so an instance stopped under it can only be
// unmounted lazily, and its file system lives on beside the next boot's
// (the runtime then has to wait for it before it mounts the disk again).

// drain waits for the operations in flight on sb to end (see above), for
// at most the drain timeout on the engine's clock, and marks sb stopping
// until end is called, when the transition is over: an operation that
// ends meanwhile records no activity (its sandbox stops), so its answer
// does not wait for the sandbox's lock. Its caller holds that lock; done
// releases an operation before it would take the lock, so the
// operations can end meanwhile. It gives up, having changed nothing, when
// ctx ends first.
func (e *Engine) drain(ctx context.Context, sb *torpor.Sandbox, verb string) (end func(), err error) {
	quiet := e.act.beginStop(sb.ID)
	end = func() { e.act.endStop(sb.ID) }
	if err := e.waitQuiet(ctx, sb, verb, quiet); err != nil {
		end()
		return func() {}, err
	}
	return end, nil
}

// waitQuiet waits until quiet closes, the drain timeout passes or ctx
// ends.
func (e *Engine) waitQuiet(ctx context.Context, sb *torpor.Sandbox, verb string, quiet <-chan struct{}) error {
	select {
	case <-quiet:
		return nil
	default:
	}
	expired := make(chan struct{})
	t := e.clock.AfterFunc(e.drainTimeout, func() { close(expired) })
	defer t.Stop()
	select {
	case <-quiet:
		return nil
	case <-expired:
		e.log.Info("operations still in flight when the drain timeout passed; the sandbox stops under them",
			"sandbox", sb.ID, "verb", verb, "timeout", e.drainTimeout)
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// runSignal returns a channel that is closed when sandbox id stops
// running: it is paused, hibernated, restarted, terminated or fails (see
// setState). Call it with the sandbox's lock held while it runs.
func (e *Engine) runSignal(id string) <-chan struct{} {
	e.runMu.Lock()
	defer e.runMu.Unlock()
	ch := e.runs[id]
	if ch == nil {
		ch = make(chan struct{})
		e.runs[id] = ch
	}
	return ch
}

// stoppedRunning closes the channels runSignal gave out for sandbox id.
func (e *Engine) stoppedRunning(id string) {
	e.runMu.Lock()
	defer e.runMu.Unlock()
	if ch := e.runs[id]; ch != nil {
		close(ch)
		delete(e.runs, id)
	}
}

// untilStopped runs call, the runtime call of an operation begun with
// operate on sb (what names it: "the command"), and answers as soon as
// one of three things happens:
//   - call returns: its outcome, where an error after sb stopped running
//     or changed instance is the conflict that says so (see leftRunning);
//   - sb stops running (stopped, from runSignal, closes): that conflict,
//     without waiting for call, which goes on with the sandbox (a frozen
//     command continues when its sandbox resumes);
//   - ctx ends (the caller went away): ctx's error; call's context ends
//     too, which ends what it runs.
//
// call runs on a context that only that third case cancels, and detach,
// when set, is called before untilStopped returns early, so that call
// no longer touches what belongs to the caller. The operation is done
// (done is called) when call returns, whenever that is: until then the
// sandbox is busy.
func untilStopped[T any](e *Engine, ctx context.Context, sb *torpor.Sandbox, stopped <-chan struct{}, what string, call func(context.Context) (T, error), detach func(), done func()) (T, error) {
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	res := make(chan callResult[T], 1)
	go func() {
		v, err := call(cctx)
		res <- callResult[T]{v, err}
	}()
	leave := func() {
		if detach != nil {
			detach()
		}
		go func() {
			<-res
			cancel()
			done()
		}()
	}
	var zero T
	select {
	case r := <-res:
		cancel()
		// What the sandbox is as the call failed, before done lets a
		// transition waiting for it go on.
		err := e.stoppedUnder(ctx, sb, what, r.err)
		done()
		return r.v, err
	case <-stopped:
		select {
		case r := <-res: // it ended as the sandbox stopped: its outcome stands
			cancel()
			done()
			return r.v, r.err
		default:
		}
		leave()
		if err := e.leftRunning(sb, what); err != nil {
			return zero, err
		}
		return zero, torpor.Errorf(torpor.EConflict, "sandbox %s stopped running while %s ran", sb.ID, what)
	case <-ctx.Done():
		cancel()
		leave()
		return zero, ctx.Err()
	}
}

// stoppedUnder returns what the caller of an operation begun on sb,
// running, hears of err, the failure of its runtime call: the error that
// says sb stopped running or changed instance meanwhile (a delete,
// hibernation or restart raced the call, which failed with the instance),
// else err itself.
func (e *Engine) stoppedUnder(ctx context.Context, sb *torpor.Sandbox, what string, err error) error {
	if err == nil || ctx.Err() != nil || torpor.ErrorCodeOf(err) == torpor.EInvalid {
		return err
	}
	if lerr := e.leftRunning(sb, what); lerr != nil {
		return lerr
	}
	return err
}

// leftRunning returns the error that tells the caller of an operation
// begun on sb, running, that sb has since stopped running or changed
// instance (restarted), and what it is now; nil when it still runs as it
// did.
func (e *Engine) leftRunning(sb *torpor.Sandbox, what string) error {
	cur, err := e.store.GetSandbox(e.bg, sb.ID)
	if err != nil {
		return nil
	}
	if cur.State == torpor.StateRunning && cur.Handle == sb.Handle {
		if e.unstoredState(sb.ID) != torpor.StatePausing {
			return nil
		}
		// A pause by freeze stores no pausing state (see recordsPausing):
		// the operation failed as the freeze came.
		cur.State = torpor.StatePausing
	}
	var did string
	reason := "state"
	switch cur.State {
	case torpor.StateTerminating, torpor.StateTerminated:
		return &torpor.Error{Code: torpor.EGone, State: cur.State,
			Message: fmt.Sprintf("sandbox %s was deleted while %s ran", sb.ID, what)}
	case torpor.StatePausing, torpor.StatePaused:
		reason = "paused"
		did = fmt.Sprintf("was paused while %s ran; it goes on when the sandbox resumes, and its output is not returned", what)
	case torpor.StateHibernating, torpor.StateHibernated, torpor.StateArchiving, torpor.StateArchived:
		did = fmt.Sprintf("was hibernated while %s ran, which ended it", what)
	case torpor.StateRestarting:
		did = fmt.Sprintf("was restarted while %s ran, which ended it", what)
	case torpor.StateFailed:
		did = fmt.Sprintf("failed while %s ran", what)
	default:
		did = fmt.Sprintf("changed instance while %s ran (it was restarted or resumed from a snapshot)", what)
	}
	return &torpor.Error{Code: torpor.EConflict, State: cur.State, Reason: reason,
		Message: fmt.Sprintf("sandbox %s %s; it is %s", sb.ID, did, cur.State)}
}

// execIO stands between a command's stdin, stdout and stderr and the
// caller's, so that a command Exec stopped waiting for (see untilStopped)
// no longer reads or writes what belongs to a request that was answered.
type execIO struct {
	mu  sync.Mutex
	off bool
}

// wrap makes req's streams go through g.
func (g *execIO) wrap(req *torpor.ExecRequest) {
	if req.Stdin != nil {
		req.Stdin = gatedReader{g, req.Stdin}
	}
	if req.Stdout != nil {
		req.Stdout = gatedWriter{g, req.Stdout}
	}
	if req.Stderr != nil {
		req.Stderr = gatedWriter{g, req.Stderr}
	}
}

// detach cuts the streams off: it returns once no write is under way,
// and later writes are dropped and reads find the end.
func (g *execIO) detach() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.off = true
}

func (g *execIO) detached() bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.off
}

type gatedWriter struct {
	g *execIO
	w io.Writer
}

func (w gatedWriter) Write(p []byte) (int, error) {
	w.g.mu.Lock()
	defer w.g.mu.Unlock()
	if w.g.off {
		return len(p), nil
	}
	return w.w.Write(p)
}

// gatedReader does not hold the lock while it reads, so that a read that
// blocks never holds up detach: a read begun before detach may end after
// it, which the callers' stdin (a request's "stdin", in memory) allows.
type gatedReader struct {
	g *execIO
	r io.Reader
}

func (r gatedReader) Read(p []byte) (int, error) {
	if r.g.detached() {
		return 0, io.EOF
	}
	return r.r.Read(p)
}
